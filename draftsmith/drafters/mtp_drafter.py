"""`mtp` and `mtp:PATH` in the engine: chain drafting by repeating one MTP step (`mtp.py`).

`mtp` reads the head the target's own checkpoint folder ships (Qwen3.5/3.6 `mtp.*` tensors, which
transformers drops on load); `mtp:PATH` reads one from another folder (a head trained here, or
another checkpoint of the same target architecture).

Position t pairs the target's final hidden state h_t with the token x_{t+1} that follows it. The
engine hands both over in matching order (at start: the prompt's states with the prompt's tokens
from the second on; at each commit: the states of the tokens that entered the target's cache with
the committed ids), so the drafter keeps two FIFO queues and runs every newly paired position once
through the head, keeping its keys/values. Those positions use the target's own states, so whatever
a proposal computed from the head's guesses is recomputed from the truth.

A proposal unrolls k steps past the last paired position, each feeding the head's own h' and the
token just drafted; their keys/values are written past the committed length and overwritten next
time, so rejecting drafts costs nothing (the target's recurrent state on hybrid targets is the
engine's business). At temperature > 0 each draft token is sampled from q = the head's
distribution under the same temperature/top-k/top-p as the target's p, and q is returned, so
verification (min(1, p/q), resample from norm(max(0, p - q))) stays exact.
"""

from __future__ import annotations

import itertools

import torch

from draftsmith.decoding.sampling import SamplingParams, draft_generator, target_probs
from draftsmith.drafters.base import Draft, FactoryBase
from draftsmith.drafters.mtp import MTPCache, MTPHead, load_head
from draftsmith.target.model import FINAL_HIDDEN
from draftsmith.target.packed import use_fast_linear


class MTPDrafter:
    def __init__(self, factory: MTPFactory, sampling: SamplingParams, gen: torch.Generator) -> None:
        self.f = factory
        self.sampling = None if sampling.greedy else sampling  # None: argmax drafts
        self.head: MTPHead = factory.head
        self.needs_features = factory.needs_features
        p = next(self.head.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = MTPCache()
        self.feats: list[torch.Tensor] = []  # unpaired target states h_t, each [H]
        self.tokens: list[int] = []  # unpaired tokens x_{t+1}
        self.length = 0  # positions with real (paired) keys/values
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits [V], h' [H]) at the frontier
        self.gen = gen

    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        self.tokens = list(prompt_ids[1:])
        self._add(features)
        self._advance()

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None) -> None:
        self.tokens.extend(accepted_ids)
        self._add(features)
        self._advance()

    def _add(self, features: torch.Tensor | None) -> None:
        if features is not None and features.shape[0]:
            self.feats.extend(features[:, 0].to(self.device, self.dtype).unbind(0))  # [n, 1, H] -> n x [H]

    @torch.inference_mode()
    def _advance(self) -> None:
        n = min(len(self.feats), len(self.tokens))
        if n == 0:
            return
        self.cache.start = self.length
        logits, h = self.head(
            torch.tensor([self.tokens[:n]], device=self.device),
            torch.stack(self.feats[:n])[None],
            torch.arange(self.length, self.length + n, device=self.device)[None],
            self.cache,
            _causal_mask(self.length, n, self.device),
        )
        self.length += n
        del self.feats[:n], self.tokens[:n]
        self.last = (logits[0, -1], h[0, -1])

    @torch.inference_mode()
    def propose(self, k: int) -> Draft:
        if self.last is None or k <= 0:
            return Draft(tokens=[])
        logits, h = self.last
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if self.sampling is not None:
                q = target_probs(logits, self.sampling).cpu()
                tokens.append(int(torch.multinomial(q, 1, generator=self.gen)))
                qs.append(q)
            else:
                tokens.append(int(logits.argmax()))
            if i == k - 1:
                break
            pos = self.length + i
            self.cache.start = pos
            out_logits, out_h = self.head(
                torch.tensor([[tokens[-1]]], device=self.device),
                h[None, None],
                torch.tensor([[pos]], device=self.device),
                self.cache,
            )
            logits, h = out_logits[0, -1], out_h[0, -1]
        return Draft(tokens=tokens, probs=torch.stack(qs) if qs else None)


def _causal_mask(past: int, q: int, device) -> torch.Tensor | None:
    """[1, 1, q, past + q] bool; None where the kernel's own default is already right."""
    if past == 0 or q == 1:
        return None  # empty cache: plain causal; one query: every key up to it is visible
    keys = torch.arange(past + q, device=device)
    rows = past + torch.arange(q, device=device)
    return (keys[None, :] <= rows[:, None])[None, None]


class MTPFactory(FactoryBase):
    """Loads the head once (at bind, when the target is known); makes one drafter per request."""

    name = "mtp"

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.head: MTPHead | None = None
        self.needs_features: tuple[int, ...] = (FINAL_HIDDEN,)
        self.sampling = SamplingParams()  # for drafters made without settings of their own
        self._rows = itertools.count()

    def bind(self, target, sampling: SamplingParams) -> None:
        if self.head is None:
            self.head = load_head(target, self.path)
            use_fast_linear(self.head)  # its layer and fc (the LM head is the target's, already switched)
        self.sampling = sampling

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> MTPDrafter:
        if self.head is None:
            raise RuntimeError("MTPFactory.bind(target, sampling) must run before drafting")
        s = sampling or self.sampling
        return MTPDrafter(self, s, generator or draft_generator(s.seed, next(self._rows)))


def build(arg: str | None) -> MTPFactory:
    """`mtp`: the target checkpoint's own head; `mtp:PATH`: a head saved in a folder."""
    return MTPFactory(arg or None)
