"""`draftsmith simulate` and `draftsmith calibrate` through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.cli import main

KEYS = {"baseline_tok_s", "spec_tok_s", "speedup", "naive_speedup", "best_k", "step_time", "breakdown"}
PARTS = {"weights", "kv_cache", "attention_compute", "experts", "allreduce", "dispatch", "overhead", "draft"}


def _json(capsys, *argv: str) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_and_breakdown(capsys) -> None:
    out = _json(
        capsys,
        "--model",
        "qwen3-8b",
        "--hardware",
        "b200",
        "--drafter",
        "dflash",
        "--tau",
        "6.5",
        "--batch",
        "1",
        "8",
    )
    assert set(out) >= KEYS
    assert set(out["breakdown"]["spec"]) == PARTS and set(out["breakdown"]["baseline"]) == PARTS
    assert out["step_time"]["spec"] == pytest.approx(sum(out["breakdown"]["spec"].values()))
    assert out["naive_speedup"] == pytest.approx(out["tau"]) and out["speedup"] < out["naive_speedup"]
    assert [r["batch"] for r in out["per_batch"]] == [1, 8]
    assert out["per_batch"][1]["spec_aggregate_tok_s"] == pytest.approx(
        8 * out["per_batch"][1]["spec_tok_s"], rel=1e-3
    )


def test_k_auto_and_tensor_parallel(capsys) -> None:
    out = _json(
        capsys,
        "--model",
        "llama-3.3-70b",
        "--hardware",
        "h100",
        "--gpus",
        "4",
        "--drafter",
        "eagle3",
        "--alpha",
        "0.8",
        "--k",
        "auto",
    )
    assert out["k"] == out["best_k"] and out["breakdown"]["baseline"]["allreduce"] > 0


def test_plain_only_and_naive_baseline(capsys) -> None:
    out = _json(capsys, "--model", "smollm2-135m", "--hardware", "a100")
    assert out["speedup"] == 1.0 and out["acceptance"] is None


def test_table_output(capsys) -> None:
    assert (
        main(
            [
                "simulate",
                "--model",
                "deepseek-v3",
                "--hardware",
                "b200",
                "--gpus",
                "8",
                "--dtype",
                "fp8",
                "--drafter",
                "mtp",
                "--tau",
                "2.5",
                "--k",
                "2",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "speedup" in text and "naive" in text and "step time" in text and "draft" in text


def test_acceptance_from_bench_json(tmp_path: Path, capsys) -> None:
    bench = tmp_path / "r.json"
    bench.write_text(
        json.dumps(
            {
                "k": 4,
                "runs": [
                    {"method": "ar", "kind": "draftsmith", "tau": 1.0, "accept_per_pos": []},
                    {
                        "method": "suffix",
                        "kind": "draftsmith",
                        "tau": 2.0,
                        "accept_per_pos": [0.6, 0.8, 0.9, 0.9],
                    },
                ],
            }
        )
    )
    out = _json(
        capsys,
        "--model",
        "qwen3-8b",
        "--hardware",
        "h200",
        "--drafter",
        "suffix",
        "--acceptance",
        str(bench),
        "--k",
        "4",
    )
    assert out["tau"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--model", "nope", "--hardware", "h100"], "catalog"),
        (["--model", "qwen3-8b", "--hardware", "tpu"], "unknown --hardware"),
        (["--model", "qwen3-8b", "--hardware", "a100", "--dtype", "fp8"], "no fp8"),
        (
            ["--model", "qwen3-8b", "--hardware", "h100", "--drafter", "dflash", "--tau", "20", "--k", "4"],
            "impossible",
        ),
        (["--model", "qwen3-8b", "--hardware", "h100", "--drafter", "eagle3", "--k", "zero"], "--k"),
        (["--model", "qwen3-8b", "--hardware", "l40s", "--gpus", "0"], "--gpus"),
        (["--model", "qwen3-8b", "--hardware", "h100", "--tau", "3"], "--drafter"),
    ],
)
def test_user_errors_are_one_line_exit_2(argv: list[str], msg: str, capsys) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_local_without_profile_says_how_to_fix(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    assert main(["simulate", "--model", "smollm2-135m", "--hardware", "local"]) == 2
    assert "draftsmith calibrate" in capsys.readouterr().err


def test_calibrate_writes_the_local_profile(tmp_path: Path, monkeypatch, capsys) -> None:
    from conftest import make_tiny_checkpoint

    from draftsmith.simulate.calibrate import calibrate

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    ckpt = make_tiny_checkpoint(tmp_path / "tiny")
    profile, path = calibrate(ckpt, "cpu", log=lambda s: None, small=True)
    assert path == tmp_path / "cache" / "hardware" / "local.json" and path.is_file()
    m = profile["measured"]
    assert m["bandwidth_gb_s"] > 0 and m["bf16_tflop_s"] > 0 and m["forward_q1_ms"] > 0
    out = _json(capsys, "--model", ckpt, "--hardware", "local", "--dtype", "fp32")
    assert out["baseline_tok_s"] > 0 and out["hardware"].startswith("local")
