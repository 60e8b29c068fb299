"""What EAGLE-3 and MTP drafters share: one draft position per (target feature, next token) pair,
and chains unrolled from the draft's own hidden state.

Position t pairs the target's features at t with the token x_{t+1} that follows. The engine hands
features and tokens over in matching order (at start: the prompt's features with the prompt's
tokens from the second on; at each commit: the features of the tokens that entered the target's
cache with the committed ids), so the drafter keeps two FIFO queues and runs every newly paired
position once through its model, keeping the keys/values. Those positions use the target's own
features, so whatever a proposal computed from the draft's guesses is recomputed from the truth.

A proposal unrolls k steps past the last paired position, each feeding the model's own hidden
state and the token just drafted; their keys/values are written past the paired length and
overwritten next time (`DraftKV`), so rejecting drafts costs nothing.

At temperature > 0 each draft token is sampled from q (the subclass's `draft_probs`) and q is
returned, so verification (min(1, p/q), resample from norm(max(0, p - q))) stays exact. `min_prob`
ends a chain where q's top probability falls below it (possibly before the first token); the cut
looks at q alone, never at the sampled token or the target, so each drafted token is still x ~ q.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters.base import Draft
from draftsmith.drafters.draft_kv import DraftKV


class FeatureChainDrafter(ABC):
    """Subclasses give `fuse` (engine features -> model input per position) and `run` (a forward
    at given positions that also stores its keys/values), and may map draft ids to target ids."""

    min_prob = 0.0

    def __init__(
        self,
        needs_features: tuple[int, ...],
        sampling: SamplingParams,
        gen: torch.Generator,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.needs_features = needs_features
        self.sampling = None if sampling.greedy else sampling  # None: argmax drafts
        self.gen = gen
        self.device, self.dtype = device, dtype
        self.kv = DraftKV()
        self.feats: list[torch.Tensor] = []  # unpaired model inputs for positions t, each [H]
        self.tokens: list[int] = []  # unpaired tokens x_{t+1}
        self.length = 0  # positions with real (paired) keys/values
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits, h) at the frontier

    # ---- what a model supplies ----------------------------------------------------------------

    @abstractmethod
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[n, K, H_target] engine features -> [n, H] the model's hidden input per position."""

    @abstractmethod
    def run(self, ids: torch.Tensor, hidden: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [1, q], hidden [1, q, H] at positions start..start+q-1, causal over the kept keys/values
        before `start`; stores the new keys/values at those positions. Returns the last position's
        (logits [V_draft], h [H])."""

    @abstractmethod
    def draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """q over the draft's vocabulary at the request's sampling settings (float32)."""

    def to_target_id(self, draft_id: int) -> int:
        return draft_id

    def target_probs(self, qs: list[torch.Tensor]) -> torch.Tensor:
        """[n, V_target] q for the drafted tokens."""
        return torch.stack(qs)

    # ---- the engine's calls -------------------------------------------------------------------

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
            self.feats.extend(self.fuse(features.to(self.device, self.dtype)).unbind(0))

    @torch.inference_mode()
    def _advance(self) -> None:
        """Run every newly paired position through the model, keeping its keys/values."""
        n = min(len(self.feats), len(self.tokens))
        if n == 0:
            return
        ids = torch.tensor([self.tokens[:n]], device=self.device)
        self.last = self.run(ids, torch.stack(self.feats[:n])[None], self.length)
        self.length += n
        del self.feats[:n], self.tokens[:n]

    @torch.inference_mode()
    def propose(self, k: int) -> Draft:
        if self.last is None or k <= 0:
            return Draft(tokens=[])
        logits, h = self.last
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if self.sampling is not None:
                q = self.draft_probs(logits).cpu()
                if float(q.max()) < self.min_prob:
                    break
                # Exact speculative sampling needs x ~ q, so sample rather than take the argmax.
                draft_id = int(torch.multinomial(q, 1, generator=self.gen))
                qs.append(q)
            else:
                if self.min_prob and float(torch.softmax(logits.float(), -1).max()) < self.min_prob:
                    break
                draft_id = int(logits.argmax())
            tokens.append(self.to_target_id(draft_id))
            if i == k - 1:
                break
            # Position length + i pairs the model's own h (standing in for the target's feature)
            # with the token just drafted; it sees every paired position and the chain so far.
            ids = torch.tensor([[tokens[-1]]], device=self.device)
            logits, h = self.run(ids, h[None, None], self.length + i)
        return Draft(tokens=tokens, probs=self.target_probs(qs) if qs else None)
