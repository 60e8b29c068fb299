"""Suffix decoding (Snowflake ArcticInference, arXiv:2411.04975): draft from frequency trees.

Two trees are consulted at every step: a per-request tree over this request's prompt + output,
grown as tokens are committed, and a global tree over the outputs of earlier requests (each led
by the last max_depth - 1 tokens of its prompt), owned by the factory and fed by `finish`. In each, the drafter finds the longest suffix of the context that
occurred before, then walks the most frequent continuation while its empirical probability stays
at or above `min_prob`, for at most min(k, factor * match length) tokens. The draft with the
larger expected number of accepted tokens (the sum over i of the product of the first i
probabilities) wins; on a tie the per-request draft is used.

The tree. Like ArcticInference, a "suffix tree" here is a suffix trie of bounded depth D =
`max_depth`: every position i of a sequence inserts the path seq[i : i + D], and each node counts
the paths through it. So a suffix matched at depth m leaves room for D - m draft tokens; the match
length used is the longest one that does not shorten the draft. A continuation's probability is
count(child) / (number of paths through the node that continue at all): occurrences that end at
the node (the current suffix itself in the per-request tree, the end of an earlier output in the
global tree) have no next token to vote for.

A plain trie costs D nodes per token (8k tokens x 64 = half a million Python objects per
request), so paths are compressed: a path that leaves the shared part of the trie is stored as one
node whose "tail" points into its source sequence (seq, pos) instead of one node per token. A tail
is pushed down one node at a time only when another path walks along it, so nodes exist only where
two paths share a prefix. In the per-request tree, tails point into the live context list, so a
fresh path grows for free as tokens arrive; only the suffixes that also occurred earlier (a short
list, at most D) are extended explicitly. Committing a token costs O(longest repeated suffix) <=
O(D); proposing costs O(D + k).

Global tree capacity: when inserting an output would push the tokens stored past
`max_tokens_global`, the global tree is reset (forgotten) first. Cheaper than evicting the oldest
paths and, with a cap in the hundreds of thousands of tokens, rarely hit. Memory: about 180 bytes
per stored token of varied text; text seen exactly twice (a repeated long answer) costs up to
max_depth nodes of ~100 bytes per token, once.

It knows nothing about the target's features or probabilities (drafts have `probs=None`) and it
is not thread-safe: one engine thread calls all drafters of a factory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from draftsmith.drafters.base import Draft, FactoryBase
from draftsmith.drafters.options import parse_options
from draftsmith.errors import UserError

if TYPE_CHECKING:
    from draftsmith.decoding.sampling import SamplingParams

DEFAULTS: dict[str, int | float] = {
    "max_depth": 64,
    "factor": 1.0,
    "min_prob": 0.1,
    "max_tokens_global": 1_000_000,
    "min_score": 0.0,
}


class _Node:
    """A trie node. Either it has children, or at most one path continues past it, as a tail.

    The best child is kept in `best`/`child` and a dict is made only at a second child: most nodes
    have one child, and a dict would triple their size.
    """

    __slots__ = ("count", "out", "best", "child", "children", "seq", "pos")

    def __init__(self, count: int = 0) -> None:
        self.count = count  # paths (inserted start positions) through this node
        self.out = 0  # of those, how many continue into a child
        self.best = -1  # token of the child with the highest count (ties: the latest to reach it)
        self.child: _Node | None = None  # that child
        self.children: dict[int, _Node] | None = None  # all children, once there are two
        self.seq: list[int] | None = None  # tail: the one continuing path goes on at seq[pos:]
        self.pos = 0

    def get(self, tok: int) -> _Node | None:
        if self.children is not None:
            return self.children.get(tok)
        return self.child if self.best == tok else None


# A position in a tree that may lie inside a tail: (node, node's depth, tokens read into its tail).
_State = tuple[_Node, int, int]


def _push_tail(node: _Node, depth: int, max_depth: int) -> None:
    """Turn the first token of `node`'s tail into a child, so another path can branch here."""
    seq, p = node.seq, node.pos
    node.seq = None
    if seq is None or p >= len(seq) or depth >= max_depth:
        return  # the tail was empty: its path ends at this node
    child = _Node(1)
    if depth + 1 < max_depth:
        child.seq, child.pos = seq, p + 1
    node.best, node.child, node.out = seq[p], child, 1


def _descend(
    node: _Node, depth: int, tok: int, seq: list[int], next_pos: int, max_depth: int
) -> _Node | None:
    """One inserted path goes from `node` (at `depth`) through `tok`, then on at seq[next_pos:].

    Returns the child when the path shares it with an earlier path (the caller keeps walking);
    otherwise makes the child with the rest of the path as its tail and returns None.
    """
    if node.seq is not None:
        _push_tail(node, depth, max_depth)
    node.out += 1
    child = node.get(tok)
    if child is None:
        child = _Node(1)
        if depth + 1 < max_depth:
            child.seq, child.pos = seq, next_pos
        if node.child is None:
            node.best, node.child = tok, child
            return None
        if node.children is None:
            node.children = {node.best: node.child}
        node.children[tok] = child
        shared = None
    else:
        child.count += 1
        shared = child
    # Counts only grow, so the best child can change only to the one just counted.
    if child is not node.child and child.count >= node.child.count:
        node.best, node.child = tok, child
    return shared


def _step(state: _State, tok: int, max_depth: int) -> _State | None:
    """Read one more token from a position in the tree (read-only); None if the tree lacks it."""
    node, depth, off = state
    if node.seq is not None:
        p = node.pos + off
        if p < len(node.seq) and depth + off < max_depth and node.seq[p] == tok:
            return (node, depth, off + 1)
        return None
    child = node.get(tok)
    return None if child is None else (child, depth + 1, 0)


def _continue(state: _State, budget: int, min_prob: float, max_depth: int) -> tuple[list[int], float]:
    """Walk the most frequent continuation from `state`: (tokens, expected accepted tokens)."""
    node, depth, off = state
    tokens: list[int] = []
    score, path_p = 0.0, 1.0
    while len(tokens) < budget:
        if node.seq is not None:
            # A tail is a single earlier occurrence: every token of it has probability 1.
            p = node.pos + off
            n = min(budget - len(tokens), len(node.seq) - p, max_depth - depth - off)
            if n > 0:
                tokens.extend(node.seq[p : p + n])
                score += n * path_p
            break
        child = node.child
        if child is None:
            break
        prob = child.count / node.out
        if prob < min_prob:
            break
        path_p *= prob
        score += path_p
        tokens.append(node.best)
        node, depth = child, depth + 1
    return tokens, score


def _pick_match(longest: int, k: int, factor: float, max_depth: int) -> tuple[int, int]:
    """(match length, draft budget): the longest match among those allowing the longest draft.

    A match of length m allows min(k, factor * m, max_depth - m) tokens: longer matches are more
    reliable but leave less depth in the trie below them.
    """
    best_m, best_budget = 0, 0
    for m in range(longest, 0, -1):
        by_factor = int(factor * m)
        if by_factor <= best_budget:
            break  # shorter matches only allow shorter drafts
        budget = min(k, by_factor, max_depth - m)
        if budget > best_budget:
            best_m, best_budget = m, budget
    return best_m, best_budget


class GlobalTree:
    """The trie over earlier requests' outputs, shared by all drafters of one factory."""

    def __init__(self, max_depth: int, max_tokens: int) -> None:
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self.root = _Node()
        self.tokens = 0  # start positions stored
        self.version = 0  # bumped on every change, so drafters know their match states are stale

    def insert(self, seq: list[int]) -> None:
        """Add every path seq[i : i + max_depth]; reset first if the capacity would be exceeded."""
        seq = list(seq[-self.max_tokens :])  # our own copy: tails point into it
        if self.tokens + len(seq) > self.max_tokens:
            self.root, self.tokens = _Node(), 0
        depth_cap = self.max_depth
        for i in range(len(seq)):
            node: _Node | None = self.root
            for depth, j in enumerate(range(i, min(len(seq), i + depth_cap))):
                node = _descend(node, depth, seq[j], seq, j + 1, depth_cap)
                if node is None:
                    break
        self.tokens += len(seq)
        self.version += 1


class SuffixDrafter:
    """One request's suffix-decoding drafter; reads (never writes) its factory's global tree."""

    needs_features: tuple[int, ...] = ()

    def __init__(
        self, tree: GlobalTree, factor: float = 1.0, min_prob: float = 0.1, min_score: float = 0.0
    ) -> None:
        self.max_depth = tree.max_depth
        self.factor = factor
        self.min_prob = min_prob
        self.min_score = min_score  # no draft below this many expected accepted tokens
        self._global = tree
        self.start([])

    def start(self, prompt_ids: list[int], features: torch.Tensor | None = None) -> None:
        self._ctx: list[int] = []  # tails of the local tree point into this list: append only
        self._root = _Node()
        # _open[m]: local node of the context's suffix of length m, for m = 0..M, M the longest
        # suffix (< max_depth) that also occurred earlier. Longer suffixes occurred only once, and
        # are carried by tails that grow by themselves as _ctx grows.
        self._open: list[_Node] = [self._root]
        # _matched[m]: position of the context's suffix of length m in the global tree, m = 0..M.
        self._matched: list[_State] = [(self._global.root, 0, 0)]
        self._version = self._global.version
        self.commit(prompt_ids)

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None = None) -> None:
        for tok in accepted_ids:
            self._append(tok)

    def _append(self, tok: int) -> None:
        ctx, cap = self._ctx, self.max_depth
        ctx.append(tok)
        opened = [self._root]
        for depth, node in enumerate(self._open):
            child = _descend(node, depth, tok, ctx, len(ctx), cap)
            # A suffix that did not occur before cannot have a longer one that did, so the
            # shared children form the prefix m = 1..M' that _open needs.
            if child is not None and depth + 1 < cap:
                opened.append(child)
        self._open = opened
        if self._version == self._global.version:
            self._matched = self._advance(self._matched, tok)

    def _advance(self, matched: list[_State], tok: int) -> list[_State]:
        out = [(self._global.root, 0, 0)]
        for state in matched:
            if state[1] + state[2] + 1 >= self.max_depth:
                break  # keep room below the match for at least one draft token
            nxt = _step(state, tok, self.max_depth)
            if nxt is None:
                break  # no longer suffix can occur either
            out.append(nxt)
        return out

    def _rematch(self) -> None:
        """The global tree changed under us: match the context's recent tokens again, O(D^2)."""
        matched: list[_State] = [(self._global.root, 0, 0)]
        for tok in self._ctx[-(self.max_depth - 1) :]:
            matched = self._advance(matched, tok)
        self._matched, self._version = matched, self._global.version

    def propose(self, k: int) -> Draft:
        if k <= 0:
            return Draft(tokens=[])
        if self._version != self._global.version:
            self._rematch()
        m, budget = _pick_match(len(self._open) - 1, k, self.factor, self.max_depth)
        local: tuple[list[int], float] = ([], 0.0)
        if budget:
            local = _continue((self._open[m], m, 0), budget, self.min_prob, self.max_depth)
        m, budget = _pick_match(len(self._matched) - 1, k, self.factor, self.max_depth)
        if budget:
            glob = _continue(self._matched[m], budget, self.min_prob, self.max_depth)
            if glob[1] > local[1] + 1e-9:  # a tie (up to rounding) goes to the request's own tree
                local = glob
        tokens, score = local
        return Draft(tokens=tokens if score >= self.min_score else [])


@dataclass
class SuffixFactory(FactoryBase):
    max_depth: int = 64
    factor: float = 1.0
    min_prob: float = 0.1
    max_tokens_global: int = 1_000_000
    min_score: float = 0.0
    name: str = "suffix"
    needs_features: tuple[int, ...] = ()
    tree: GlobalTree = field(init=False)

    def __post_init__(self) -> None:
        self.tree = GlobalTree(self.max_depth, self.max_tokens_global)

    def __call__(
        self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None
    ) -> SuffixDrafter:
        # Deterministic drafts (q one-hot) are exact at any temperature: the settings change nothing.
        return SuffixDrafter(self.tree, self.factor, self.min_prob, self.min_score)

    def finish(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Learn a finished request's output, led by the end of its prompt (the chat template's
        assistant header, say), so the next request can draft its first tokens from there too."""
        if output_ids:
            self.tree.insert(list(prompt_ids[-(self.max_depth - 1) :]) + list(output_ids))


def build(arg: str | None) -> SuffixFactory:
    """`suffix` or `suffix:max_depth=32:factor=2:min_prob=0.2:max_tokens_global=100000:min_score=1`.

    `min_score` drops a draft whose expected number of accepted tokens (by the tree's own counts) is
    below it: no verification width is spent on a weak match, and in `suffix:min_score=S+MODEL`
    (`drafters/hybrid.py`) the model drafts instead."""
    opts = parse_options(arg, DEFAULTS)
    max_depth, factor = int(opts["max_depth"]), float(opts["factor"])
    min_prob, cap = float(opts["min_prob"]), int(opts["max_tokens_global"])
    min_score = float(opts["min_score"])
    if max_depth < 2 or factor <= 0 or not 0.0 <= min_prob <= 1.0 or cap < 1 or min_score < 0:
        raise UserError(
            f"bad suffix options {arg}: need max_depth >= 2, factor > 0, 0 <= min_prob <= 1, "
            "max_tokens_global >= 1, min_score >= 0"
        )
    return SuffixFactory(
        max_depth=max_depth, factor=factor, min_prob=min_prob, max_tokens_global=cap, min_score=min_score
    )
