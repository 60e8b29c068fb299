"""Random streams: a drafter's never coincides with the engine's acceptance stream."""

import torch

from draftsmith.decoding.sampling import SamplingParams, draft_generator, make_generator, target_probs


def test_draft_streams_differ_from_acceptance_streams():
    for seed in (0, 7):
        for row in range(3):
            a = torch.rand(8, generator=make_generator(seed, row))
            d = torch.rand(8, generator=draft_generator(seed, row))
            assert not torch.equal(a, d)
            torch.testing.assert_close(d, torch.rand(8, generator=draft_generator(seed, row)))  # reproducible
    assert not torch.equal(
        torch.rand(8, generator=draft_generator(0, 0)), torch.rand(8, generator=draft_generator(0, 1))
    )


def test_unseeded_generators_and_tiny_temperatures_work():
    torch.rand(2, generator=make_generator(None, 5))  # a 64-bit random seed times the row stride
    torch.rand(2, generator=draft_generator(None, 5))
    assert SamplingParams(temperature=1e-70).greedy and not SamplingParams(temperature=0.01).greedy
    p = target_probs(torch.tensor([3.0, 1.0, 0.0]), SamplingParams(temperature=1e-4, top_p=1e-200))
    assert torch.isfinite(p).all() and p.argmax() == 0
