"""`A+B` hybrids: A's draft when it has one, else B's; both follow the context; lossless."""

from __future__ import annotations

import pytest
import torch
from tiny import OracleFactory, SkewedFactory, random_prompts, save_eagle3, tiny_target

from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry
from draftsmith.drafters.base import Draft
from draftsmith.drafters.hybrid import HybridDrafter, HybridFactory
from draftsmith.drafters.suffix import SuffixFactory
from draftsmith.errors import UserError


class _Scripted:
    """Drafts from a script of drafts, one per call; records what it was told."""

    needs_features: tuple[int, ...] = ()

    def __init__(self, script: list[list[int]]):
        self.script, self.seen, self.asked = list(script), [], 0

    def start(self, prompt_ids, features):
        self.seen = list(prompt_ids)

    def commit(self, accepted_ids, features):
        self.seen += accepted_ids

    def propose(self, k):
        self.asked += 1
        return Draft(tokens=self.script.pop(0)[:k])


def test_first_draft_wins_unless_empty_and_both_follow_the_context():
    a, b = _Scripted([[1, 2], [], [3]]), _Scripted([[7, 8, 9], [5], [6]])
    d = HybridDrafter(a, b, feeds_first=False)
    d.start([4, 4], None)
    assert d.propose(3).tokens == [1, 2] and b.asked == 0  # B pays nothing while A drafts
    d.commit([1, 9], None)
    assert d.propose(3).tokens == [7, 8, 9]  # A had nothing: B drafts
    d.commit([7], None)
    assert d.propose(3).tokens == [3]
    assert a.seen == b.seen == [4, 4, 1, 9, 7]


def test_suffix_min_score_drops_weak_drafts():
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # a strong repeat: 7, 8, 5, 6, ... follows
    strong = SuffixFactory()()
    strong.start(prompt)
    weak = SuffixFactory(min_score=50.0)()
    weak.start(prompt)
    assert len(strong.propose(4)) > 0 and len(weak.propose(4)) == 0
    with pytest.raises(UserError, match="min_score"):
        registry.build("suffix:min_score=-1")


def test_registry_parses_a_plus_b(tmp_path):
    f = registry.build("suffix:min_score=1.5+ngram:max_n=3")
    assert isinstance(f, HybridFactory) and f.first.min_score == 1.5
    with pytest.raises(UserError, match="not ar"):
        registry.build("ar+ngram")
    t = tiny_target("llama")
    save_eagle3(t, tmp_path / "d1")
    save_eagle3(t, tmp_path / "d2")
    both = registry.build(f"eagle3:{tmp_path / 'd1'}+eagle3:{tmp_path / 'd2'}")
    with pytest.raises(UserError, match="only one side"):
        both.bind(t, SamplingParams())


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_with_suffix_plus_eagle3_equals_plain(tmp_path, kind):
    t = tiny_target(kind)
    save_eagle3(t, tmp_path / "d")
    prompts = [p * 3 for p in random_prompts(3, seed=4, lo=3, hi=6)]  # repeats, so suffix drafts too
    ar = generate(t, None, prompts, max_new_tokens=24)
    f = registry.build(f"suffix:min_score=0.5+eagle3:{tmp_path / 'd'}")
    out = generate(t, f, prompts, k=4, max_new_tokens=24)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    assert DecodeStats.combined(r.stats for r in out).draft_tokens > 0


def test_sampling_with_a_hybrid_keeps_target_law():
    vocab = 12
    t = tiny_target("llama", seed=3, scale=8.0, vocab=vocab)
    prompt = [1, 5, 7]
    rows = 2000
    plain = generate(
        t, None, [prompt] * rows, sampling=SamplingParams(temperature=1.0, seed=99), max_new_tokens=4
    )
    # A one-hot oracle that drafts the plain run's first continuation (often empty: variable
    # lengths), else a drafter with its own q: steps mix one-hot and sampled drafts.
    oracle = OracleFactory({tuple(prompt): plain[0].token_ids}, noise=0.3, vocab=vocab)
    f = HybridFactory(oracle, SkewedFactory(vocab))
    spec = generate(
        t, f, [prompt] * rows, k=3, sampling=SamplingParams(temperature=1.0, seed=7), max_new_tokens=4
    )
    assert DecodeStats.combined(r.stats for r in spec).tau > 1.0
    # Tolerance: two independent samples of 2000 over 12 outcomes differ by TV ~0.05 on average.
    for pos in range(4):
        a = torch.bincount(torch.tensor([r.token_ids[pos] for r in spec]), minlength=vocab).float() / rows
        b = torch.bincount(torch.tensor([r.token_ids[pos] for r in plain]), minlength=vocab).float() / rows
        assert 0.5 * float((a - b).abs().sum()) < 0.09
