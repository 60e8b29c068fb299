"""Suffix decoding: exact drafts on hand-built sequences, and the compressed tries checked against
a plain per-token trie on random ones."""

import random

import pytest

from draftsmith.drafters import registry
from draftsmith.drafters.base import Drafter
from draftsmith.drafters.suffix import SuffixFactory
from draftsmith.errors import UserError


def drafter(ctx: list[int], spec: str = "suffix"):
    f = registry.build(spec)
    d = f()
    d.start(ctx, None)
    return d


def draft(ctx: list[int], k: int, spec: str = "suffix") -> list[int]:
    return drafter(ctx, spec).propose(k).tokens


# ---------------------------------------------------------------- the request's own tree


def test_longest_suffix_wins():
    ctx = [1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3]
    # [1, 2, 3] occurred once, followed by 9; the shorter [2, 3] was last followed by 7.
    assert draft(ctx, k=3) == [9, 5, 2]


def test_no_match_and_empty_context():
    assert draft([1, 2, 3], k=4) == []
    assert draft([], k=4) == []
    assert draft([1, 2, 1], k=0) == []


def test_most_frequent_continuation_beats_most_recent():
    ctx = [1, 2, 1, 3, 1, 2, 1, 4, 1]
    # After 1: 2 twice, 3 and 4 once -> 2 (p = 0.5); after [1, 2]: 1 (p = 1); after [1, 2, 1]:
    # 3 and 4 once each, a tie that goes to the latest, 4; then 1.
    assert draft(ctx, k=4, spec="suffix:factor=4") == [2, 1, 4, 1]


def test_min_prob_stops_the_walk():
    ctx = [1, 5, 1, 6, 1, 7, 1, 8, 1]  # after 1: four continuations, p = 0.25 each
    assert draft(ctx, k=4, spec="suffix:factor=4:min_prob=0.3") == []
    assert draft(ctx, k=4, spec="suffix:factor=4:min_prob=0.25") == [8, 1]  # tie -> latest
    # The walk goes through p = 1 steps, then stops at a branch with p = 0.5.
    ctx = [3, 4, 5, 1, 3, 4, 5, 2, 9, 3]
    assert draft(ctx, k=8, spec="suffix:factor=8:min_prob=0.6") == [4, 5]
    assert draft(ctx, k=8, spec="suffix:factor=8:min_prob=0.5") == [4, 5, 2, 9, 3]


def test_draft_length_follows_match_length():
    body = list(range(100, 140))
    for m, factor, want in [(1, 1.0, 1), (2, 1.0, 2), (5, 1.0, 5), (2, 2.0, 4), (3, 0.5, 1), (20, 1.0, 10)]:
        ctx = [*body, 1, *body[:m]]  # the suffix matches exactly m tokens
        assert draft(ctx, k=10, spec=f"suffix:factor={factor}") == body[m : m + want]


def test_depth_limit_keeps_room_for_the_draft():
    body = list(range(100, 140))
    ctx = [*body, 1, *body[:20]]
    # With max_depth 8 the whole 20-token match cannot be used: a match of m leaves 8 - m tokens of
    # depth, so m = 4 (draft min(4, 4, 4)) is the longest match that allows the longest draft.
    assert draft(ctx, k=4, spec="suffix:max_depth=8") == body[20:24]
    assert draft(ctx, k=16, spec="suffix:max_depth=8") == body[20:24]


def test_commit_grows_the_tree_and_start_resets_it():
    d = drafter([5, 6, 7, 8])
    assert d.propose(4).tokens == []
    d.commit([5, 6], None)
    assert d.propose(4).tokens == [7, 8]
    d.commit([7], None)
    assert d.propose(4).tokens == [8, 5, 6]
    d.start([9], None)
    assert d.propose(4).tokens == []
    out = d.propose(4)
    assert out.probs is None and isinstance(d, Drafter)


# ---------------------------------------------------------------- the factory's global tree


def test_global_tree_helps_a_new_drafter():
    f = registry.build("suffix")
    prompt, output = [1, 2, 3], list(range(100, 130))
    first = f()
    first.start([7, 8, 9], None)
    first.commit(output[:3], None)
    assert first.propose(3).tokens == []  # nothing learned yet
    f.finish(prompt, output)
    # A fresh drafter with an unrelated prompt matches the earlier output once it starts again.
    d = f()
    d.start([7, 8, 9], None)
    assert d.propose(3).tokens == []
    d.commit(output[:3], None)
    assert d.propose(3).tokens == output[3:6]
    # With the same prompt, the prompt's tail already matches at the first step.
    d = f()
    d.start(prompt, None)
    assert d.propose(3).tokens == output[:3]


def test_global_tree_learned_mid_request_is_used():
    f = registry.build("suffix")
    d = f()
    d.start([7, 8, 9, 100, 101], None)
    assert d.propose(2).tokens == []
    f.finish([0], [100, 101, 102, 103])  # another request ends while this one runs
    assert d.propose(2).tokens == [102, 103]
    d.commit([102], None)
    assert d.propose(2).tokens == [103]


def test_better_scoring_tree_wins():
    f = registry.build("suffix:factor=4")
    for _ in range(3):
        f.finish([0], [1, 2, 3, 4])
    f.finish([0], [1, 2, 9, 9])
    # Globally 1 -> 2 (p = 1) -> 3 (p = 0.75) -> 4 (p = 1): expected 1 + 0.75 + 0.75 = 2.5 tokens.
    # The request's own tree: 1 -> 6 (p = 0.5, a tie with 5 that goes to the latest) -> 1 (p = 1):
    # expected 1 token.
    d = f()
    d.start([1, 5, 1, 6, 1], None)
    assert d.propose(4).tokens == [2, 3, 4]
    # The own tree wins when it offers more: a long exact repeat.
    d = f()
    d.start([1, 2, 8, 8, 8, 8, 1, 2], None)
    # Both match [1, 2]: own tree 8, 8, 8, 8 at p = 1 (expected 4) against 3, 4 (expected 1.5).
    assert d.propose(4).tokens == [8, 8, 8, 8]


def test_global_tree_resets_at_capacity():
    f = registry.build("suffix:max_tokens_global=40")
    f.finish([0], list(range(100, 130)))  # 31 tokens stored (prompt tail + output)
    d = f()
    d.start([100, 101], None)
    assert d.propose(2).tokens == [102, 103]
    f.finish([0], list(range(200, 220)))  # 31 + 21 > 40: forget, then store
    assert f.tree.tokens == 21
    assert d.propose(2).tokens == []
    d = f()
    d.start([200, 201], None)
    assert d.propose(2).tokens == [202, 203]


def test_drafters_of_one_factory_share_only_the_global_tree():
    f = registry.build("suffix")
    a, b = f(), f()
    a.start([1, 2, 3, 1, 2], None)
    b.start([1, 2], None)
    assert a.propose(2).tokens == [3, 1] and b.propose(2).tokens == []


# ---------------------------------------------------------------- options


def test_options():
    f = registry.build("suffix:max_depth=8:factor=2:min_prob=0.2:max_tokens_global=100")
    assert isinstance(f, SuffixFactory)
    assert (f.max_depth, f.factor, f.min_prob, f.max_tokens_global) == (8, 2.0, 0.2, 100)
    assert (f.name, f.needs_features) == ("suffix", ())
    assert registry.build("suffix").max_depth == 64


@pytest.mark.parametrize(
    "spec",
    ["suffix:depth=3", "suffix:factor=big", "suffix:max_depth=1", "suffix:min_prob=2", "suffix:factor=0"],
)
def test_bad_options_are_user_errors(spec):
    with pytest.raises(UserError):
        registry.build(spec)


# ---------------------------------------------------------------- against a plain per-token trie


class PlainTrie:
    """One node per token, counts updated in insertion order: the definition, without tails."""

    def __init__(self, depth: int):
        self.depth = depth
        self.root = self.node()

    @staticmethod
    def node() -> dict:
        return {"count": 0, "out": 0, "best": None, "kids": {}}

    def add(self, parent: dict, tok: int) -> dict:
        parent["out"] += 1
        kid = parent["kids"].setdefault(tok, self.node())
        kid["count"] += 1
        if parent["best"] is None or kid["count"] >= parent["kids"][parent["best"]]["count"]:
            parent["best"] = tok
        return kid

    def find(self, toks: list[int]) -> dict | None:
        node = self.root
        for t in toks:
            node = node["kids"].get(t)
            if node is None:
                return None
        return node

    def insert(self, seq: list[int]) -> None:
        for i in range(len(seq)):
            node = self.root
            for tok in seq[i : i + self.depth]:
                node = self.add(node, tok)

    def append(self, ctx: list[int]) -> None:
        """ctx[-1] was just appended: extend every path that starts within the last `depth`."""
        end = len(ctx) - 1
        for d in range(min(self.depth - 1, end) + 1):
            self.add(self.find(ctx[end - d : end]), ctx[end])


def plain_walk(node: dict, budget: int, min_prob: float) -> tuple[list[int], float]:
    tokens, score, path_p = [], 0.0, 1.0
    while len(tokens) < budget and node["out"]:
        kid = node["kids"][node["best"]]
        p = kid["count"] / node["out"]
        if p < min_prob:
            break
        path_p *= p
        score += path_p
        tokens.append(node["best"])
        node = kid
    return tokens, score


def plain_propose(ctx, local, glob, k, depth, factor, min_prob) -> list[int]:
    best = ([], 0.0)
    for i, trie in enumerate((local, glob)):
        longest = 0
        for m in range(1, min(depth - 1, len(ctx)) + 1):
            node = trie.find(ctx[len(ctx) - m :])
            # In the request's own tree the suffix always occurs: it must also have occurred earlier.
            if node is None or (i == 0 and not node["out"]):
                break
            longest = m
        budgets = [(min(k, int(factor * m), depth - m), m) for m in range(1, longest + 1)]
        budget, m = max(budgets, default=(0, 0))
        if budget > 0:
            got = plain_walk(trie.find(ctx[len(ctx) - m :]), budget, min_prob)
            if i == 0 or got[1] > best[1] + 1e-9:
                best = got
    return best[0]


@pytest.mark.parametrize(
    "depth,factor,min_prob,vocab", [(6, 1.0, 0.1, 3), (4, 2.0, 0.3, 2), (64, 1.5, 0.1, 5)]
)
def test_matches_plain_trie_on_random_sequences(depth, factor, min_prob, vocab):
    rng = random.Random(depth * 100 + vocab)
    spec = f"suffix:max_depth={depth}:factor={factor}:min_prob={min_prob}"
    f = registry.build(spec)
    glob = PlainTrie(depth)
    for _ in range(6):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(0, 10))]
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(20, 90))]
        d = f()
        d.start(prompt, None)
        ctx, local = [], PlainTrie(depth)
        for tok in prompt:
            ctx.append(tok)
            local.append(ctx)
        i = 0
        while i < len(seq):
            k = rng.randrange(0, 10)
            assert d.propose(k).tokens == plain_propose(ctx, local, glob, k, depth, factor, min_prob)
            step = seq[i : i + rng.randrange(1, 4)]
            d.commit(step, None)
            for tok in step:
                ctx.append(tok)
                local.append(ctx)
            i += len(step)
        f.finish(prompt, seq)
        glob.insert(prompt[-(depth - 1) :] + seq)


def test_scale_8k_context_is_cheap_per_step():
    # Commit is O(longest repeated suffix) and propose O(max_depth + k): no rescans of the context.
    rng = random.Random(0)
    f = registry.build("suffix")
    for vocab in (50000, 8):
        seq = [rng.randrange(vocab) for _ in range(8192)]
        d = f()
        d.start(seq[:256], None)
        for i in range(256, len(seq)):
            assert len(d.propose(16).tokens) <= 16
            d.commit([seq[i]], None)
        f.finish(seq[:256], seq[256:])
