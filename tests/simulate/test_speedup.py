"""Acceptance arithmetic: Leviathan's formula, tau <-> alpha, per-position rates, bench JSONs."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from draftsmith.errors import UserError
from draftsmith.simulate import roofline, speedup
from draftsmith.simulate.speedup import (
    alpha_from_tau,
    expected_tokens,
    from_bench,
    leviathan_speedup,
    tau_from_rates,
)


def test_docstring_examples() -> None:
    for mod in (speedup, roofline):
        assert doctest.testmod(mod).failed == 0


def test_leviathan_worked_example() -> None:
    # alpha 0.8, k 4: (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2 = 3.3616 tokens per step.
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616)
    # Draft cost c = 0.05 of a target step per drafted token: 3.3616 / 1.2 = 2.8013.
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(2.8013, abs=1e-4)
    # Leviathan et al.'s own example: alpha 0.6, k 3 -> E = (1 - 0.6^4) / 0.4 = 2.176.
    assert expected_tokens(0.6, 3) == pytest.approx(2.176)
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 5) == 6.0


@pytest.mark.parametrize("alpha,k", [(0.3, 2), (0.7, 7), (0.9, 15), (0.5, 1)])
def test_tau_alpha_round_trip(alpha: float, k: int) -> None:
    assert alpha_from_tau(expected_tokens(alpha, k), k) == pytest.approx(alpha, abs=1e-9)


def test_impossible_tau_is_a_user_error() -> None:
    with pytest.raises(UserError, match="impossible"):
        alpha_from_tau(6.0, 4)
    with pytest.raises(UserError):
        alpha_from_tau(0.5, 4)


def test_tau_from_rates_by_hand() -> None:
    # 1 + 0.5 + 0.5*0.8 + 0.5*0.8*0.8 (third position repeats the last measured rate)
    assert tau_from_rates([0.5, 0.8], 3) == pytest.approx(1 + 0.5 + 0.4 + 0.32)
    assert tau_from_rates([0.5, 0.8], 2, coverage=0.5) == pytest.approx(1 + 0.5 * 0.9)
    assert tau_from_rates([0.5], 0) == 1.0


def _bench(tmp_path: Path, tau: float) -> Path:
    data = {
        "k": 2,
        "runs": [
            {"method": "ar", "kind": "draftsmith", "tau": 1.0, "accept_per_pos": []},
            {"method": "ngram", "kind": "draftsmith", "tau": tau, "accept_per_pos": [0.5, 0.8]},
            {"method": "eagle3:/x/my-eagle", "kind": "draftsmith", "tau": 1.9, "accept_per_pos": [0.5, 0.8]},
            {"method": "hf-assisted", "kind": "peer", "tau": None, "accept_per_pos": None},
        ],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    return path


def test_bench_rates_with_coverage(tmp_path: Path) -> None:
    # Full drafts would give tau 1.9 at k=2; measured 1.45 means half the accepted drafts were missing.
    a, run = from_bench(_bench(tmp_path, 1.45), "ngram")
    assert run["method"] == "ngram" and a.coverage == pytest.approx(0.5)
    assert a.tau(2) == pytest.approx(1.45)
    assert a.tau(3) == pytest.approx(1 + 0.5 * (0.5 + 0.4 + 0.32))
    a, _ = from_bench(_bench(tmp_path, 1.9), "eagle3")  # by drafter type
    assert a.coverage == pytest.approx(1.0)
    a, _ = from_bench(_bench(tmp_path, 1.9), "/elsewhere/my-eagle")  # by speculator folder name
    assert a.tau(2) == pytest.approx(1.9)


def test_bench_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no single run"):
        from_bench(_bench(tmp_path, 1.5), "suffix")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(UserError, match="bench"):
        from_bench(bad, "ngram")


def test_committed_bench_results_are_readable() -> None:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "smollm2-code-bf16.json"
    if not path.is_file():
        pytest.skip("no committed bench result")
    a, run = from_bench(path, "suffix")
    assert a.tau(8) == pytest.approx(run["tau"], rel=1e-6)
