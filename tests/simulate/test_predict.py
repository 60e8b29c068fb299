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
    # An n-gram draft costs no device time, only the host look-up of each of the 8 requests.
    assert p.spec["draft"] == pytest.approx(8 * B200.host_draft_per_row_s)
    assert p.spec_step_s - p.spec["draft"] > p.baseline_step_s  # verification is not free either


def test_host_lookup_makes_ngram_speedup_fall_with_batch_on_a_saturated_moe() -> None:
    # Llama-4-Scout (16 experts, top-1) on 8 B200s: past batch ~30 the plain step already reads every
    # expert, so verifying 4 tokens per row adds almost no bytes and, without a per-request cost,
    # the speedup at fixed tau would rise from batch 4 to 32. The host look-up per request turns it.
    from dataclasses import replace

    scout = load_model("llama-4-scout-17b-16e")
    d, a = drafter_cost("ngram", scout), from_tau(1.66, 3)

    def at(hw, batch):
        return predict(scout, hw, d, a, batch=batch, k=3, context=1024, dtype="fp8", tp=8).speedup

    free = replace(B200, host_draft_per_row_s=0.0)
    assert at(free, 32) > at(free, 4)
    assert at(B200, 32) < at(B200, 4) < at(B200, 1)


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


# --- the concurrency trend at fixed tau, dense and MoE --------------------------------------------


def _speedups(model, hw, drafter, tau, k, batches, **layout):
    m, h = load_model(model), load_hardware(hw)
    d, a = drafter_cost(drafter, m), from_tau(tau, k)
    return [predict(m, h, d, a, batch=b, k=k, context=1024, **layout).speedup for b in batches]


@pytest.mark.parametrize(
    "model,hw,drafter,tau,k,layout",
    [
        ("qwen3-8b", "b200", "dflash", 8.01, 15, {}),
        ("llama-3.1-8b", "h100", "eagle3", 2.7, 3, {}),
        ("kimi-k2.6", "gb200", "eagle3", 3.0, 3, {"tp": 4, "expert_dtype": "fp4"}),
        ("minimax-m2.5", "mi355x", "eagle3", 2.6, 3, {"tp": 4, "dtype": "fp8"}),
        ("qwen3.5-122b-a10b", "b200", "dflash", 6.5, 15, {"tp": 8}),
        ("deepseek-r1", "b200", "mtp", 3.0, 3, {"tp": 8, "dtype": "fp8", "expert_dtype": "fp4"}),
    ],
)
def test_speedup_falls_as_concurrency_grows_dense_and_moe(model, hw, drafter, tau, k, layout) -> None:
    # A dense model: concurrency 1 -> 64. A MoE model: while the verify pass holds at most 64 tokens
    # (batch * (k+1) <= 64), the range the published MoE points start in; beyond it uniform routing
    # lets the plain step read nearly every expert and the model's speedup rises again (roofline.py).
    m = load_model(model)
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if not m.is_moe or b * (k + 1) <= 64]
    s = _speedups(model, hw, drafter, tau, k, batches, **layout)
    assert s[-1] < s[0]
    assert all(y <= x * 1.03 for x, y in zip(s, s[1:], strict=False)), s


def test_moe_small_batch_is_not_where_speculation_helps_least() -> None:
    # The old model's inversion: MoE speedup at concurrency 1 below that at 8. With per-layer fixed
    # latencies the plain step is mostly fixed cost at 1, so verification is nearly free there.
    s = _speedups("kimi-k2.6", "gb200", "eagle3", 3.0, 3, (1, 8), tp=4, expert_dtype="fp4")
    assert s[0] > s[1]
