"""The model card's held-out curve: one row per evaluation, the untrained start first."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from training_curve import heldout_table  # noqa: E402


def test_heldout_table_lists_start_and_each_evaluation() -> None:
    rows = [
        {"step": 1, "loss": 9.0, "wall_time_s": 30},
        {
            "step": 2,
            "loss": 8.0,
            "wall_time_s": 600,
            "tau": 1.25,
            "heldout_loss": 5.5,
            "heldout_acc": [0.3, 0.2],
        },
        {"step": 3, "loss": 7.0, "wall_time_s": 1200, "heldout_loss": 5.0, "heldout_acc": [0.4, 0.25]},
    ]
    lines = heldout_table(rows, {"heldout_loss": 16.0, "heldout_acc": [0.0, 0.0]}).splitlines()
    assert lines[0] == "| wall (min) | step | held-out loss | acc 1 | acc 2 | engine tau |"
    assert lines[2] == "| 0 | 0 | 16.000 | 0.000 | 0.000 | - |"
    assert lines[3] == "| 10 | 2 | 5.500 | 0.300 | 0.200 | 1.25 |"
    assert lines[4] == "| 20 | 3 | 5.000 | 0.400 | 0.250 | - |"
    assert heldout_table([{"step": 1, "loss": 1.0}]) == ""
