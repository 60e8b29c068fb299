"""`mtp` and `mtp:PATH` in the engine: chain drafting by repeating one MTP step (`mtp.py`).

`mtp` reads the head the target's own checkpoint folder ships (Qwen3.5/3.6 `mtp.*` tensors, which
transformers drops on load); `mtp:PATH` reads one from another folder (a head trained here, or
another checkpoint of the same target architecture).

Pairing, caching and chain unrolling are `feature_chain.py`'s (shared with EAGLE-3): here the
model's input per position is the target's final hidden state h_t, drafts are over the target's
own vocabulary, and q at temperature > 0 is the head's distribution under the same
temperature/top-k/top-p as the target's p (the target's recurrent state on hybrid targets is the
engine's business).
"""

from __future__ import annotations

import itertools

import torch

from draftsmith.decoding.sampling import SamplingParams, draft_generator, target_probs
from draftsmith.drafters.base import FactoryBase
from draftsmith.drafters.draft_kv import causal_mask
from draftsmith.drafters.feature_chain import FeatureChainDrafter
from draftsmith.drafters.mtp import MTPHead, load_head
from draftsmith.target.model import FINAL_HIDDEN
from draftsmith.target.packed import use_fast_linear


class MTPDrafter(FeatureChainDrafter):
    def __init__(self, factory: MTPFactory, sampling: SamplingParams, gen: torch.Generator) -> None:
        p = next(factory.head.parameters())
        super().__init__(factory.needs_features, sampling, gen, p.device, p.dtype)
        self.head: MTPHead = factory.head

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return features[:, 0]  # [n, 1, H] -> [n, H]

    def run(self, ids: torch.Tensor, hidden: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        q = ids.shape[1]
        self.kv.start = start
        pos = torch.arange(start, start + q, device=self.device)[None]
        logits, h = self.head(ids, hidden, pos, self.kv, causal_mask(start, q, self.device))
        return logits[0, -1], h[0, -1]

    def draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return target_probs(logits, self.sampling)


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
