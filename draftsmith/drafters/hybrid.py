"""`A+B`: drafter A's draft when it has one, drafter B's otherwise.

The use it is made for is `suffix:min_score=S+eagle3:PATH` (or `ngram+...`, `+dflash:PATH`): a
training-free drafter where the context repeats itself, which costs nothing to ask, and a trained
model everywhere else, the combination ArcticInference serves (suffix decoding beside its
speculator models). On repetitive output the suffix tree's long confident matches beat a small
model's drafts; on fresh text the model has something to say where the tree has nothing.

Both drafters see every `start` and `commit`, so either can draft at any step (a model drafter keeps
its KV cache and features current even in steps where A drafted). Only B is asked to propose when
A's draft is empty, so B's drafting cost is paid only then.

Lossless: which drafter proposes depends on the context alone (A's draft from the tokens so far),
never on the target's distribution or a token sampled in this step, and each draft carries its own q
(A's one-hot, B's probabilities), so verification stays exact at any temperature.

At most one of the two may read target features: the engine hands the features of the layers the
factory names, and that side receives them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from draftsmith.drafters.base import Draft, Drafter, DrafterFactory, FactoryBase
from draftsmith.errors import UserError

if TYPE_CHECKING:
    from draftsmith.decoding.sampling import SamplingParams


class HybridDrafter:
    def __init__(self, first: Drafter, second: Drafter, feeds_first: bool) -> None:
        self.first, self.second = first, second
        self.feeds_first = feeds_first  # which side the target features are for
        self.needs_features = (first if feeds_first else second).needs_features

    def _split(self, features: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (features, None) if self.feeds_first else (None, features)

    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        a, b = self._split(features)
        self.first.start(prompt_ids, a)
        self.second.start(prompt_ids, b)

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None) -> None:
        a, b = self._split(features)
        self.first.commit(accepted_ids, a)
        self.second.commit(accepted_ids, b)

    def propose(self, k: int) -> Draft:
        draft = self.first.propose(k)
        return draft if len(draft) else self.second.propose(k)


class HybridFactory(FactoryBase):
    name = "hybrid"

    def __init__(self, first: DrafterFactory, second: DrafterFactory) -> None:
        self.first, self.second = first, second
        self.feeds_first = False  # settled in `bind`, once trained drafters know their layers

    @property
    def needs_features(self) -> tuple[int, ...]:
        # Read after bind: trained drafters learn their layers when they load their checkpoint.
        return tuple((self.first if self.feeds_first else self.second).needs_features)

    @property
    def max_draft_tokens(self) -> int:
        return max(f.max_draft_tokens for f in (self.first, self.second))

    def bind(self, target, sampling) -> None:
        for f in (self.first, self.second):
            f.bind(target, sampling)
        if self.first.needs_features and self.second.needs_features:
            raise UserError(
                f"{self.first.name}+{self.second.name}: only one side of A+B may read target features; "
                "pair a trained drafter with a training-free one (suffix, ngram)"
            )
        self.feeds_first = bool(self.first.needs_features)

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> HybridDrafter:
        # Both sides may share one stream: which side drafts depends on the context alone, and
        # every draw stays independent of the engine's acceptance stream.
        a, b = self.first(sampling, generator), self.second(sampling, generator)
        return HybridDrafter(a, b, self.feeds_first)

    def finish(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        self.first.finish(prompt_ids, output_ids)
        self.second.finish(prompt_ids, output_ids)
