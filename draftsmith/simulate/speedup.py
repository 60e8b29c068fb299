"""Acceptance and speedup arithmetic: pure functions, no hardware and no model.

Words (design.md): k = drafted tokens per step; a_i = P(draft token i accepted | tokens 1..i-1
accepted); tau = mean tokens committed per step including the target's own (bonus) token.

- Constant rate alpha (Leviathan et al.): tau(k) = (1 - alpha^(k+1)) / (1 - alpha).
- Per-position rates: tau(k) = 1 + sum_{i<=k} prod_{j<=i} a_j.
- Speedup of a step that costs `spec_step` against a plain step `base_step`:
  tau * base_step / spec_step (Leviathan's E / (k*c + 1) when spec_step = (k*c + 1) * base_step).

Measured rates from `draftsmith bench` are conditional on the draft *reaching* position i, but
training-free drafters often propose fewer than k tokens (no match, short match), so the product
formula overstates their tau. `Acceptance.coverage` scales the expected accepted drafts so that
tau at the bench's own k equals the measured tau; the same scale is used at other k.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import UserError


def expected_tokens(alpha: float, k: int) -> float:
    """Leviathan: E[tokens per step] = (1 - alpha^(k+1)) / (1 - alpha), tau including the bonus.

    >>> round(expected_tokens(0.8, 4), 4)
    3.3616
    >>> expected_tokens(1.0, 4)
    5.0
    """
    if not 0.0 <= alpha <= 1.0:
        raise UserError(f"acceptance rate {alpha} must lie in [0, 1]")
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_tau(tau: float, k: int) -> float:
    """The constant rate alpha whose k-token drafts give acceptance length tau (bisection).

    >>> round(alpha_from_tau(3.3616, 4), 4)
    0.8
    """
    if k <= 0:
        raise UserError(f"k {k} must be positive to convert tau to a rate")
    if not 1.0 <= tau <= k + 1:
        raise UserError(f"tau {tau} is impossible with k={k}: it lies in [1, {k + 1}] (bonus token included)")
    if tau >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """Speedup with i.i.d. acceptance alpha and a draft costing c target steps per drafted token.

    >>> round(leviathan_speedup(0.8, 4, 0.05), 3)   # 3.3616 / 1.2
    2.801
    """
    return expected_tokens(alpha, k) / (k * c + 1.0)


def tau_from_rates(rates: list[float], k: int, coverage: float = 1.0) -> float:
    """1 + coverage * sum_{i<=k} prod_{j<=i} a_j; positions past the measured ones repeat the last
    measured rate (the rates level off with depth)."""
    if k <= 0:
        return 1.0
    if not rates:
        raise UserError("no per-position acceptance rates to use")
    total, prod = 0.0, 1.0
    for i in range(k):
        prod *= rates[i] if i < len(rates) else rates[-1]
        total += prod
    return 1.0 + coverage * total


@dataclass(frozen=True)
class Acceptance:
    """How many tokens a step commits as a function of k: a constant rate or per-position rates."""

    alpha: float | None = None
    rates: tuple[float, ...] = ()
    coverage: float = 1.0
    source: str = ""

    def tau(self, k: int) -> float:
        if self.alpha is not None:
            return expected_tokens(self.alpha, k)
        return tau_from_rates(list(self.rates), k, self.coverage)

    def accept_probs(self, k: int) -> list[float]:
        """Per-position rates a_1..a_k, for simulating acceptances one step at a time."""
        if self.alpha is not None:
            return [self.alpha] * k
        return [self.rates[i] if i < len(self.rates) else self.rates[-1] for i in range(k)]


def from_tau(tau: float, k: int, source: str = "") -> Acceptance:
    return Acceptance(alpha=alpha_from_tau(tau, k), source=source or f"tau {tau:g} at k={k}")


def from_alpha(alpha: float, source: str = "") -> Acceptance:
    expected_tokens(alpha, 1)  # validates the range
    return Acceptance(alpha=alpha, source=source or f"alpha {alpha:g}")


def _pick_run(runs: list[dict], drafter: str, path: Path) -> dict:
    candidates = [r for r in runs if r.get("kind", "draftsmith") == "draftsmith" and r.get("accept_per_pos")]
    names = [r["method"] for r in candidates]
    want = drafter.strip()
    for match in (
        lambda m: m == want,
        lambda m: m.split(":")[0] == want.split(":")[0] and ":" not in want,
        lambda m: ":" in m and Path(m.split(":", 1)[1]).name == Path(want).name,
    ):
        hits = [r for r in candidates if match(r["method"])]
        if len(hits) == 1:
            return hits[0]
    raise UserError(
        f"{path} has no single run for drafter '{drafter}' with per-position acceptance: "
        f"runs with rates are {', '.join(names) or 'none'}; pass --drafter with one of them"
    )


def from_bench(path: str | Path, drafter: str) -> tuple[Acceptance, dict]:
    """Per-position rates of one run in a `draftsmith bench` JSON; returns (acceptance, run)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        runs = data["runs"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"--acceptance {path} is not a readable `draftsmith bench` JSON ({e})") from None
    run = _pick_run(runs, drafter, path)
    rates = tuple(float(a) for a in run["accept_per_pos"])
    coverage = 1.0
    k_bench = int(run.get("k") or data.get("k") or len(rates))  # a run's own k (SPEC@K) first
    tau = run.get("tau")
    full = tau_from_rates(list(rates), k_bench) - 1.0
    if tau and full > 0 and math.isfinite(tau):
        coverage = min(1.0, max(0.0, (float(tau) - 1.0) / full))
    src = f"{path.name}:{run['method']} (k={k_bench}, tau {tau}, coverage {coverage:.2f})"
    return Acceptance(rates=rates, coverage=coverage, source=src), run
