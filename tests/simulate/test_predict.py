"""Decode speed with and without speculation, end to end on catalog models and GPUs."""

from __future__ import annotations

import pytest

from draftsmith.simulate.catalog import load_model
from draftsmith.simulate.drafter_cost import drafter_cost
from draftsmith.simulate.hardware import load_hardware
from draftsmith.simulate.predict import best_k, predict
from draftsmith.simulate.speedup import from_alpha, from_tau

QWEN = load_model("qwen3-8b")
B200 = load_hardware("b200")


def test_speedup_falls_with_batch_as_verification_becomes_compute_bound() -> None:
    d, a = drafter_cost("dflash", QWEN), from_tau(8.01, 15)
    sweep = [predict(QWEN, B200, d, a, batch=b, k=15, context=1024) for b in (1, 2, 4, 8, 16, 32, 64)]
    speedups = [p.speedup for p in sweep]
    assert speedups[0] > 4.5 and speedups[-1] < 3.0
    assert all(x >= y - 0.15 for x, y in zip(speedups, speedups[1:], strict=False))  # no rise beyond noise
    assert sweep[0].bound["weights"] == "memory" and sweep[-1].bound["weights"] == "compute"
    # The naive estimate ignores all of it.
    assert all(p.tau > p.speedup for p in sweep)


def test_per_request_and_aggregate() -> None:
    p = predict(QWEN, B200, drafter_cost("ngram", QWEN), from_alpha(0.6), batch=8, k=4, context=512)
    assert p.spec_tok_s == pytest.approx(p.tau / p.spec_step_s)
    assert p.baseline_tok_s == pytest.approx(1 / p.baseline_step_s)
    assert p.spec["draft"] == 0.0 and p.spec_step_s > p.baseline_step_s  # verification is not free


def test_best_k_grows_with_acceptance() -> None:
    d = drafter_cost("eagle3", QWEN)
    low, _ = best_k(QWEN, B200, d, from_alpha(0.5), batch=1, max_k=10, context=1024)
    high, sweep = best_k(QWEN, B200, d, from_alpha(0.9), batch=1, max_k=10, context=1024)
    assert low < high and len(sweep) == 10
    assert max(p.speedup for p in sweep) == sweep[high - 1].speedup


def test_moe_verification_costs_more_than_dense() -> None:
    moe = load_model("qwen3-30b-a3b")
    d, a = drafter_cost("dflash", moe), from_tau(6.0, 15)
    p = predict(moe, B200, d, a, batch=1, k=15, context=1024)
    assert p.spec["experts"] > 5 * p.baseline["experts"]


def test_no_drafter_is_plain_decoding() -> None:
    p = predict(QWEN, B200, drafter_cost("none", QWEN), None, batch=1, k=0, context=1024)
    assert p.speedup == 1.0 and p.tau == 1.0
