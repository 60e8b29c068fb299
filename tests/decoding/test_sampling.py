"""Random streams: a drafter's never coincides with the engine's acceptance stream."""

import torch


def test_draft_streams_differ_from_acceptance_streams():
    from draftsmith.decoding.sampling import draft_generator, make_generator

    for seed in (0, 7):
        for row in range(3):
            a = torch.rand(8, generator=make_generator(seed, row))
            d = torch.rand(8, generator=draft_generator(seed, row))
            assert not torch.equal(a, d)
            torch.testing.assert_close(d, torch.rand(8, generator=draft_generator(seed, row)))  # reproducible
    assert not torch.equal(
        torch.rand(8, generator=draft_generator(0, 0)), torch.rand(8, generator=draft_generator(0, 1))
    )
