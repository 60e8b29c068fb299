"""Decode speed with and without speculation: the roofline step times combined with acceptance.

General form (reference.md): speedup = tau * T_target(B, 1, S) / (T_verify(B, k+1, S) + T_draft),
where the speculative step also pays the hardware's per-step hand-off overhead. Per-request decode
tok/s = tokens per step / step time; aggregate tok/s = B times that (every row steps together).
The naive estimate is speedup = tau. This module knows nothing about the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.simulate.catalog import ModelShape
from draftsmith.simulate.drafter_cost import NONE, DrafterCost
from draftsmith.simulate.hardware import Hardware
from draftsmith.simulate.roofline import PARTS, forward_cost
from draftsmith.simulate.speedup import Acceptance

BREAKDOWN = (*PARTS, "draft")


@dataclass
class Prediction:
    batch: int
    k: int
    tau: float
    baseline_step_s: float
    spec_step_s: float
    baseline: dict[str, float]  # seconds per part of a plain decode step
    spec: dict[str, float]  # seconds per part of a speculative step (verify + draft)
    bound: dict[str, str] = field(default_factory=dict)

    @property
    def baseline_tok_s(self) -> float:
        return 1.0 / self.baseline_step_s

    @property
    def spec_tok_s(self) -> float:
        return self.tau / self.spec_step_s

    @property
    def speedup(self) -> float:
        return self.spec_tok_s / self.baseline_tok_s


def baseline_step(
    m: ModelShape,
    hw: Hardware,
    *,
    batch: int,
    context: int,
    dtype: str,
    tp: int,
    ep: bool = False,
    expert_dtype: str | None = None,
) -> tuple[float, dict[str, float]]:
    c = forward_cost(
        m, hw, batch=batch, q=1, context=context, dtype=dtype, tp=tp, ep=ep, expert_dtype=expert_dtype
    )
    return c.total, {**c.parts, "draft": 0.0}


def predict(
    m: ModelShape,
    hw: Hardware,
    drafter: DrafterCost,
    acceptance: Acceptance | None,
    *,
    batch: int,
    k: int,
    context: int,
    dtype: str = "bf16",
    tp: int = 1,
    ep: bool = False,
    expert_dtype: str | None = None,
) -> Prediction:
    layout = dict(context=context, dtype=dtype, tp=tp, ep=ep, expert_dtype=expert_dtype)
    base_t, base_parts = baseline_step(m, hw, batch=batch, **layout)
    if drafter.kind == NONE or acceptance is None or k <= 0:
        return Prediction(batch, 0, 1.0, base_t, base_t, base_parts, dict(base_parts))
    verify = forward_cost(m, hw, batch=batch, q=k + 1, **layout)
    spec = {**verify.parts}
    spec["overhead"] += hw.spec_step_overhead_s + hw.spec_overhead_per_row_s * batch
    spec["draft"] = drafter.time(hw, batch=batch, k=k, **layout)
    return Prediction(
        batch=batch,
        k=k,
        tau=acceptance.tau(k),
        baseline_step_s=base_t,
        spec_step_s=sum(spec.values()),
        baseline=base_parts,
        spec=spec,
        bound=verify.bound,
    )


def best_k(
    m: ModelShape,
    hw: Hardware,
    drafter: DrafterCost,
    acceptance: Acceptance,
    *,
    batch: int,
    max_k: int,
    context: int,
    dtype: str = "bf16",
    tp: int = 1,
    ep: bool = False,
    expert_dtype: str | None = None,
) -> tuple[int, list[Prediction]]:
    """The k in 1..max_k with the highest speedup, and the whole sweep."""
    layout = dict(context=context, dtype=dtype, tp=tp, ep=ep, expert_dtype=expert_dtype)
    sweep = [predict(m, hw, drafter, acceptance, batch=batch, k=k, **layout) for k in range(1, max_k + 1)]
    best = max(sweep, key=lambda p: p.speedup)
    return best.k, sweep
