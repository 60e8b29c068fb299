"""`draftsmith tune` on the tiny learnable target: the split, a whole run and its report, resuming
an interrupted run without redoing finished stages, and bad traffic ending in one clear line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from learnable import make_cycle_target, write_prompts

import draftsmith.tune.cli as tune_cli
from draftsmith.cli import main
from draftsmith.data.workloads import Prompt
from draftsmith.errors import UserError
from draftsmith.tune.split import holdout_count, parse_holdout, split_traffic

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return make_cycle_target(tmp_path_factory.mktemp("cycle") / "target")[0]


@pytest.fixture
def traffic(tmp_path) -> str:
    return write_prompts(tmp_path / "traffic.jsonl", 40, seed=5)


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"question {i}"}]) for i in range(n)]


# ---------------------------------------------------------------- split


def test_split_is_disjoint_reproducible_and_independent_of_file_order():
    prompts = _prompts(50)
    train, held = split_traffic(prompts, 0.2, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert not {p.id for p in train} & {p.id for p in held}
    shuffled = prompts[:]
    random.Random(0).shuffle(shuffled)
    assert {p.id for p in split_traffic(shuffled, 0.2, seed=3)[1]} == {p.id for p in held}
    assert {p.id for p in split_traffic(prompts, 0.2, seed=4)[1]} != {p.id for p in held}


def test_a_repeated_prompt_never_trains_when_one_copy_is_held_out():
    prompts = _prompts(20)
    twins = [Prompt(id=f"twin{i}", messages=p.messages) for i, p in enumerate(prompts)]
    train, held = split_traffic(prompts + twins, 6, seed=0)
    held_msgs = {json.dumps(p.messages) for p in held}
    assert not any(json.dumps(p.messages) in held_msgs for p in train)


def test_holdout_values():
    assert parse_holdout("3") == 3 and parse_holdout("0.25") == 0.25
    assert holdout_count(0.25, 40) == 10 and holdout_count(0.01, 10) == 1
    for bad in ("0", "-1", "1.5", "x"):
        with pytest.raises(UserError, match="--holdout"):
            parse_holdout(bad)
    with pytest.raises(UserError, match="leaves none to train on"):
        split_traffic(_prompts(5), 5)


# ---------------------------------------------------------------- the command


def _tune(target, traffic, out, *extra) -> list[str]:
    return [
        "tune", "--target", target, "--traffic", traffic, "--out", str(out), "--holdout", "6",
        "--max-new-tokens", "24", "--budget-minutes", "0.25", "--dtype", "float32", "--hardware", "h100",
        "--no-progress", *extra,
    ]  # fmt: skip


REPORT_KEYS = {
    "tau_before", "tau_after", "tau_after_hybrid", "baselines", "speedup_before", "speedup_after",
    "speedup_after_hybrid", "accept_per_pos_before", "accept_per_pos_after", "holdout_prompts",
    "train_prompts", "train_tokens", "train_minutes", "machine", "predictions",
}  # fmt: skip


def test_tune_from_scratch_then_from_the_result(target, traffic, tmp_path, capsys):
    first = tmp_path / "first"
    assert main(_tune(target, traffic, first, "--method", "eagle3")) == 0
    report = json.loads((first / "report.json").read_text())
    assert set(report) >= REPORT_KEYS
    assert report["holdout_prompts"] == 6 and report["train_prompts"] == 34
    assert report["tau_before"] is None and report["tau_after"] > report["baselines"]["ngram"]
    assert set(report["predictions"]["h100"]) == {"1", "8"}
    assert (first / "report.md").read_text().startswith("# Tuned speculator")
    assert (first / "curve.png").stat().st_size > 1000
    # The tuned folder is a normal speculator: it continues as the base of another tune.
    second = tmp_path / "second"
    assert main(_tune(target, traffic, second, "--from", str(first))) == 0
    again = json.loads((second / "report.json").read_text())
    assert again["tau_before"] is not None and again["accept_per_pos_before"]
    methods = {r["method"] for r in again["bench"]["runs"]}
    assert {"ar", "ngram", "suffix", f"eagle3:{first}", f"eagle3:{second}"} <= methods


def test_interrupted_tune_resumes_without_redoing_finished_stages(target, traffic, tmp_path, monkeypatch):
    out = tmp_path / "run"

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_cli, "_measure", interrupted)
    assert main(_tune(target, traffic, out, "--method", "dflash")) == 130
    state = json.loads((out / "tune.json").read_text())
    assert state["done"] == {"regenerate": True, "train": True}
    monkeypatch.undo()

    def no_more(*a, **k):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setattr(tune_cli, "_regenerate", no_more)
    monkeypatch.setattr(tune_cli, "_train", no_more)
    assert main(_tune(target, traffic, out, "--method", "dflash", "--resume")) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report) >= REPORT_KEYS and report["method"] == "dflash"
    assert report["command"].endswith("--method dflash")  # the first command, not the resume


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), lines
    return lines[0]


def test_bad_traffic_and_flags_end_in_one_line(target, traffic, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "no prompts" in _error(capsys, _tune(target, str(empty), tmp_path / "a", "--method", "eagle3"))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"text": "hello"}\n')
    assert "line 1" in _error(capsys, _tune(target, str(wrong), tmp_path / "b", "--method", "eagle3"))
    few = write_prompts(tmp_path / "few.jsonl", 4, seed=1)
    assert "none to train on" in _error(capsys, _tune(target, few, tmp_path / "c", "--method", "eagle3"))
    missing = str(tmp_path / "missing.jsonl")
    assert "not found" in _error(capsys, _tune(target, missing, tmp_path / "d", "--method", "eagle3"))
    assert "--method" in _error(capsys, _tune(target, traffic, tmp_path / "e"))
    assert "not an EAGLE-3 or DFlash" in _error(
        capsys, _tune(target, traffic, tmp_path / "f", "--from", target)
    )
    assert "holds no tune run" in _error(
        capsys, _tune(target, traffic, tmp_path / "g", "--method", "eagle3", "--resume")
    )
    assert not Path(tmp_path / "a").exists()  # nothing written for a refused run
