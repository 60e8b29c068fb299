"""Verification on its own: greedy rules, and exactness of speculative sampling by exhaustive math
and by a seeded statistical test."""

import pytest
import torch

from draftsmith.decoding.sampling import SamplingParams, target_probs
from draftsmith.decoding.verify import verify_greedy, verify_sampling


def test_greedy_accepts_prefix_then_target_token():
    assert verify_greedy([1, 2, 3], [1, 2, 3, 4]) == (3, 4)
    assert verify_greedy([1, 2, 3], [1, 9, 3, 4]) == (1, 9)
    assert verify_greedy([7], [1, 2]) == (0, 1)
    assert verify_greedy([], [5]) == (0, 5)


def _first_token_law(p: torch.Tensor, q: torch.Tensor | None, draft_token: int, trials: int, seed: int):
    """Empirical law of the first committed token when drafting `draft_token` (k=1)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.stack([p, p])  # second row: bonus distribution, irrelevant for the first token
    counts = torch.zeros_like(p)
    for _ in range(trials):
        n, nxt = verify_sampling([draft_token], None if q is None else q[None], target, g)
        counts[draft_token if n == 1 else nxt] += 1
    return counts / trials


@pytest.mark.parametrize("draft_token", [0, 2, 4])
def test_sampling_one_hot_draft_reproduces_p(draft_token):
    # Tolerance: 20k trials give a standard error below 0.0036 per entry; 0.015 is > 4 sigma.
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    law = _first_token_law(p, None, draft_token, trials=20_000, seed=1)
    assert torch.allclose(law, p, atol=0.015)


def test_sampling_with_draft_distribution_reproduces_p():
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    q = torch.tensor([0.5, 0.1, 0.1, 0.2, 0.1])
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(5)
    trials = 20_000
    for _ in range(trials):
        x = int(torch.multinomial(q, 1, generator=g))  # the drafter samples from q
        n, nxt = verify_sampling([x], q[None], torch.stack([p, p]), g)
        counts[x if n == 1 else nxt] += 1
    assert torch.allclose(counts / trials, p, atol=0.015)


def test_sampling_accept_rate_matches_theory():
    # P(accept) = sum_x min(p(x), q(x)) for a draft sampled from q.
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.2, 0.2, 0.6])
    g = torch.Generator().manual_seed(0)
    acc, trials = 0, 20_000
    for _ in range(trials):
        x = int(torch.multinomial(q, 1, generator=g))
        n, _ = verify_sampling([x], q[None], torch.stack([p, p]), g)
        acc += n
    assert abs(acc / trials - float(torch.minimum(p, q).sum())) < 0.015


def test_zero_probability_draft_is_always_rejected():
    p = torch.tensor([0.0, 1.0, 0.0])
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        assert verify_sampling([0, 1], None, torch.stack([p, p, p]), g) == (0, 1)


def test_target_probs_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert p[2] == 0 and p[3] == 0 and abs(float(p.sum()) - 1) < 1e-6
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=1))
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0]
    hot = target_probs(logits, SamplingParams(temperature=0.1))
    assert hot[0] > 0.99
