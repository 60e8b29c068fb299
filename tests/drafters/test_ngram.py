"""Prompt lookup: exact drafts on hand-built token sequences, checked against a plain scan."""

import random

import pytest

from draftsmith.drafters import registry
from draftsmith.drafters.base import Drafter
from draftsmith.drafters.ngram import NgramDrafter, NgramFactory
from draftsmith.errors import UserError


def draft(ctx: list[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    d = NgramDrafter(max_n=max_n, min_n=min_n)
    d.start(ctx, None)
    return d.propose(k).tokens


def scan(ctx: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """The definition, read literally: O(len(ctx)) per call."""
    end = len(ctx)
    for n in range(min(max_n, end), min_n - 1, -1):
        for start in range(end - n - 1, -1, -1):  # latest earlier occurrence first, never the suffix
            if ctx[start : start + n] == ctx[end - n :]:
                return ctx[start + n : start + n + k]
    return []


def test_repetition_copies_what_followed():
    assert draft([1, 2, 3, 4, 1, 2], k=2) == [3, 4]
    # The match is near the end, so fewer than k tokens are available.
    assert draft([1, 2, 3, 4, 1, 2], k=10) == [3, 4, 1, 2]


def test_most_recent_occurrence_wins():
    assert draft([1, 2, 7, 1, 2, 8, 5, 1, 2], k=4) == [8, 5, 1, 2]


def test_longest_ngram_first_then_falls_back():
    ctx = [1, 2, 3, 4, 9, 3, 5, 8, 2, 3]
    assert draft(ctx, k=2, max_n=3) == [4, 9]  # the bigram [2, 3] beats the later unigram [3]
    assert draft(ctx, k=2, max_n=1) == [5, 8]
    assert draft([6, 1, 7, 5, 1], k=2, max_n=3, min_n=2) == []  # only a unigram would match


def test_no_match_and_suffix_never_matches_itself():
    assert draft([1, 2, 3], k=4) == []
    assert draft([], k=4) == []
    assert draft([4, 4, 4], k=4) == [4]  # [4, 4] at 0..1, followed by the last 4 only


def test_k_limits_the_draft():
    ctx = [1, 2, 3, 4, 5, 6, 1]
    assert draft(ctx, k=1) == [2]
    assert draft(ctx, k=3) == [2, 3, 4]
    assert draft(ctx, k=0) == []


def test_commit_extends_the_context():
    d = NgramDrafter()
    d.start([1, 2, 3], None)
    assert d.propose(3).tokens == []
    d.commit([1, 2], None)
    assert d.propose(3).tokens == [3, 1, 2]
    d.commit([3], None)
    assert d.propose(3).tokens == [1, 2, 3]
    d.start([5, 6], None)  # a new request forgets the old context
    assert d.propose(3).tokens == []


def test_draft_is_deterministic():
    d = NgramDrafter()
    d.start([1, 2, 1], None)
    out = d.propose(2)
    assert out.probs is None and len(out) == 2


@pytest.mark.parametrize("max_n,min_n", [(3, 1), (4, 2), (1, 1), (5, 5)])
def test_matches_plain_scan_on_random_sequences(max_n, min_n):
    rng = random.Random(max_n * 10 + min_n)
    for _ in range(20):
        seq = [rng.randrange(4) for _ in range(120)]
        d = NgramDrafter(max_n=max_n, min_n=min_n)
        d.start(seq[:5], None)
        i = 5
        while i < len(seq):
            k = rng.randrange(0, 8)
            assert d.propose(k).tokens == scan(seq[:i], k, max_n, min_n)
            step = seq[i : i + rng.randrange(1, 4)]
            d.commit(step, None)
            i += len(step)


def test_registry_options_and_factory():
    f = registry.build("ngram:max_n=4:min_n=2")
    assert isinstance(f, NgramFactory)
    assert (f.max_n, f.min_n, f.name, f.needs_features) == (4, 2, "ngram", ())
    a, b = f(), f()
    assert isinstance(a, Drafter) and a is not b
    a.start([1, 2, 3, 1, 2], None)
    b.start([7], None)
    assert a.propose(5).tokens == [3, 1, 2] and b.propose(5).tokens == []
    f.finish([1, 2], [3])  # no-op, must not fail
    assert registry.build("ngram").max_n == 3


@pytest.mark.parametrize(
    "spec", ["ngram:n=3", "ngram:max_n=x", "ngram:max_n=2:min_n=3", "ngram:min_n=0", "ngram:max_n"]
)
def test_bad_options_are_user_errors(spec):
    with pytest.raises(UserError):
        registry.build(spec)


def test_scale_8k_context_is_cheap_per_step():
    # propose is O(max_n + k) thanks to the index; a scan per step would take seconds here.
    rng = random.Random(0)
    seq = [rng.randrange(1000) for _ in range(8192)]
    d = NgramDrafter()
    d.start(seq[:256], None)
    for i in range(256, len(seq)):
        d.propose(8)
        d.commit([seq[i]], None)
    assert len(d.propose(8).tokens) <= 8
