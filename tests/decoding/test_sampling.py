"""Random streams: a drafter's never coincides with the engine's acceptance stream, and none of
them touches torch's global generator."""

import torch
from tiny import random_prompts, save_draft_lm, tiny_target

from draftsmith.decoding.engine import generate
from draftsmith.decoding.sampling import (
    SamplingParams,
    draft_generator,
    draft_stream,
    make_generator,
    target_probs,
)
from draftsmith.drafters import registry


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
    # The stream the engine derives from a row's generator is that row's draft_generator stream.
    for seed, row in ((0, 0), (7, 2), (2**62, 5)):
        derived = torch.rand(8, generator=draft_stream(make_generator(seed, row)))
        torch.testing.assert_close(derived, torch.rand(8, generator=draft_generator(seed, row)))


def test_unseeded_generators_and_tiny_temperatures_work():
    torch.rand(2, generator=make_generator(None, 5))  # a 64-bit random seed times the row stride
    torch.rand(2, generator=draft_generator(None, 5))
    assert SamplingParams(temperature=1e-70).greedy and not SamplingParams(temperature=0.01).greedy
    p = target_probs(torch.tensor([3.0, 1.0, 0.0]), SamplingParams(temperature=1e-4, top_p=1e-200))
    assert torch.isfinite(p).all() and p.argmax() == 0


def test_unseeded_sampling_leaves_the_global_generator_alone(tmp_path):
    """A request without a seed draws a fresh one without reseeding torch's global generator (the
    user's program owns it): in the engine's streams and in a bound drafter's."""
    t = tiny_target("llama")
    factory = registry.build(f"draft:{save_draft_lm(tmp_path / 'd')}")
    before = torch.get_rng_state()
    make_generator(None)
    draft_generator(None)
    sampling = SamplingParams(temperature=1.0)  # seed None
    generate(t, factory, random_prompts(2), k=3, sampling=sampling, max_new_tokens=6)
    factory(sampling)  # a drafter made outside the engine draws its own stream too
    assert torch.equal(torch.get_rng_state(), before)
