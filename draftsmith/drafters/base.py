"""The Drafter contract: what the engine asks of every drafter, and nothing more.

A drafter never calls the target. The engine owns the target; it hands the drafter the token ids
now in context and, when the drafter declares `needs_features`, the hidden states of those target
layers. One drafter object serves one request (one row of a batch): the engine makes one per row
through a `DrafterFactory`, which is also where state shared across requests lives (for example
suffix decoding's global tree of earlier outputs).

Words: k = number of drafted tokens asked for; q = the draft distribution. A deterministic drafter
(n-gram, suffix) returns `probs=None`, which verification treats as a one-hot q.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from draftsmith.decoding.sampling import SamplingParams


@dataclass
class Draft:
    """Proposed tokens for one row: a chain, or a tree when `parents` is given.

    A chain may be shorter than the k asked for (even empty). A tree lists its nodes parents-first:
    `parents[i]` is the index of node i's parent, -1 for children of the last committed token; k
    bounds its depth, not its size. Trees are deterministic drafts (`probs` None).
    """

    tokens: list[int]
    probs: torch.Tensor | None = None  # [len(tokens), vocab] draft distribution q, or None (one-hot)
    parents: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path: how many tokens one step can accept at most."""
        if self.parents is None:
            return len(self.tokens)
        depths = node_depths(self.parents)
        return max(depths, default=0)


def node_depths(parents: list[int]) -> list[int]:
    """Depth of each node (children of the committed token have depth 1). Parents come first."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def parents_first(keep: list[int], tokens: list[int], parents: list[int], depths: list[int]) -> Draft:
    """The tree of nodes `keep` (indices into the other lists, closed under ancestors; parents index
    the same lists, -1 for the root's children) as a Draft laid out by depth, parents renumbered."""
    order = sorted(keep, key=lambda i: (depths[i], i))
    index = {old: new for new, old in enumerate(order)}
    return Draft(
        tokens=[tokens[i] for i in order],
        parents=[index[parents[i]] if parents[i] >= 0 else -1 for i in order],
    )


@runtime_checkable
class Drafter(Protocol):
    # Target layer ids whose hidden states this drafter consumes; () for training-free drafters.
    needs_features: tuple[int, ...]

    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        """Called once after prefill with the prompt (and its features [len, n_layers, hidden])."""

    def propose(self, k: int) -> Draft:
        """Propose up to k tokens that continue the current context."""

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None) -> None:
        """The engine committed these tokens (accepted drafts plus the target's own token)."""


class DrafterFactory(Protocol):
    """Makes one drafter per request; holds whatever is shared across requests.

    The engine calls `bind(target, sampling)` before the first request: a factory that needs the
    target (its embedding, device, dtype, layer count) loads its model there; `sampling` is the
    default for drafters made without settings of their own. `FactoryBase` gives the defaults.

    `factory(sampling, generator)` makes the drafter of a request with these sampling settings:
    one that samples its drafts (EAGLE-3, MTP, draft LM) draws them from `generator`, a stream
    independent of the engine's acceptance test, so each request drafts with its own temperature
    and stays reproducible under its own seed. Deterministic drafters ignore both; None means the
    bound settings and a stream of the factory's own.
    """

    name: str
    # Target layer ids the drafters read; a trained drafter knows them once `bind` loaded it.
    needs_features: tuple[int, ...]
    # The most nodes a draft may hold beyond k (tree drafters); 0 for chains.
    max_draft_tokens: int

    def bind(self, target, sampling: SamplingParams) -> None:
        """Attach to the target (load weights onto its device and dtype) before the first request."""

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> Drafter: ...

    def finish(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        """A request ended; factories may learn from its output (e.g. a global suffix tree)."""


class FactoryBase:
    """The defaults of `DrafterFactory` for a factory that needs no target, drafts chains and
    learns nothing across requests; a factory overrides what it does differently."""

    max_draft_tokens = 0

    def bind(self, target, sampling: SamplingParams) -> None:
        """Nothing to load."""

    def finish(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Nothing to learn."""
