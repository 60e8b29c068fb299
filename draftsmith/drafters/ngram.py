"""Prompt lookup decoding (PLD): draft by copying what followed the last n tokens earlier on.

Match the last n tokens of the context (prompt + generated), n from `max_n` down to `min_n`,
against earlier context; at the most recent earlier occurrence, propose the up-to-k tokens that
followed it. Strong wherever the output re-uses its input (editing code, summarising, multi-turn)
and wherever a small target repeats itself.

The drafter keeps an index {n-gram -> position of the token that followed its latest occurrence},
updated as tokens are committed, so `propose` costs O(max_n + k) whatever the context length.

It knows nothing about tokens' meaning, target features or probabilities: drafts are
deterministic (`probs=None`). It learns nothing across requests (`finish` is a no-op).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from draftsmith.drafters.base import Draft, FactoryBase
from draftsmith.drafters.options import parse_options
from draftsmith.errors import UserError

if TYPE_CHECKING:
    from draftsmith.decoding.sampling import SamplingParams

DEFAULTS: dict[str, int | float] = {"max_n": 3, "min_n": 1}


class NgramDrafter:
    """One request's prompt-lookup drafter."""

    needs_features: tuple[int, ...] = ()

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        self.max_n = max_n
        self.min_n = min_n
        self._ctx: list[int] = []
        # n-gram tuple -> index in _ctx of the token that followed its most recent occurrence.
        # Tuples of different n never collide, so one dict serves every n.
        self._next: dict[tuple[int, ...], int] = {}

    def start(self, prompt_ids: list[int], features: torch.Tensor | None = None) -> None:
        self._ctx = []
        self._next = {}
        self._extend(prompt_ids)

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None = None) -> None:
        self._extend(accepted_ids)

    def _extend(self, ids: list[int]) -> None:
        ctx, index = self._ctx, self._next
        for tok in ids:
            # Index the n-grams that end just before the new token, i.e. those the new token
            # follows. The n-grams ending at the very end of the context are therefore never in
            # the index: the suffix being matched cannot match itself, and every hit has at least
            # one following token.
            i = len(ctx)
            for n in range(self.min_n, min(self.max_n, i) + 1):
                index[tuple(ctx[i - n : i])] = i
            ctx.append(tok)

    def propose(self, k: int) -> Draft:
        ctx = self._ctx
        if k <= 0:
            return Draft(tokens=[])
        end = len(ctx)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            j = self._next.get(tuple(ctx[end - n :]))
            if j is not None:
                # Near the end of the context this yields fewer than k tokens; that is fine.
                return Draft(tokens=ctx[j : j + k])
        return Draft(tokens=[])


@dataclass
class NgramFactory(FactoryBase):
    max_n: int = 3
    min_n: int = 1
    name: str = "ngram"
    needs_features: tuple[int, ...] = ()

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> NgramDrafter:
        # Deterministic drafts (q one-hot) are exact at any temperature: the settings change nothing.
        return NgramDrafter(self.max_n, self.min_n)


def build(arg: str | None) -> NgramFactory:
    """`ngram` or `ngram:max_n=4:min_n=2`."""
    opts = parse_options(arg, DEFAULTS)
    max_n, min_n = int(opts["max_n"]), int(opts["min_n"])
    if not 1 <= min_n <= max_n:
        raise UserError(f"bad ngram options max_n={max_n} min_n={min_n}: need 1 <= min_n <= max_n")
    return NgramFactory(max_n=max_n, min_n=min_n)
