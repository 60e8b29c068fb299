"""The command line on a tiny local checkpoint: JSON output, losslessness across drafters, and bad
input ending in one clear line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from draftsmith.cli import main


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_is_equal_across_drafters(capsys, tiny_checkpoint):
    outs = {}
    for drafter in ("ar", "ngram", "suffix"):
        code, out, _ = _run(
            capsys,
            [
                "generate",
                "--target",
                tiny_checkpoint,
                "--dtype",
                "float32",
                "--drafter",
                drafter,
                "--json",
                "--max-new-tokens",
                "40",
                "--k",
                "4",
                "hello hello hello",
            ],
        )
        assert code == 0
        obj = json.loads(out)
        assert set(obj) >= {"text", "token_ids", "tau", "decode_tok_s", "steps"}
        outs[drafter] = obj
    assert outs["ngram"]["token_ids"] == outs["ar"]["token_ids"] == outs["suffix"]["token_ids"]
    assert outs["ar"]["tau"] == 1.0


def test_generate_streams_text(capsys, tiny_checkpoint):
    code, out, err = _run(capsys, ["generate", "--target", tiny_checkpoint, "--max-new-tokens", "12", "abc"])
    assert code == 0 and "tau" in err and len(out) > 1


def test_bench_writes_runs(capsys, tiny_checkpoint, tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"prompt": "abcabcabc"}\n{"messages": [{"role": "user", "content": "xyz xyz"}]}\n')
    out_path = tmp_path / "r.json"
    code, _, _ = _run(
        capsys,
        [
            "bench",
            "--target",
            tiny_checkpoint,
            "--dtype",
            "float32",
            "--drafters",
            "ngram,suffix,ngram@3",
            "--workload",
            str(wl),
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "16",
            "--out",
            str(out_path),
            "--peers",
            "hf",
            "--no-progress",
        ],
    )
    assert code == 0
    res = json.loads(out_path.read_text())
    runs = {r["method"]: r for r in res["runs"]}
    assert set(runs) == {"ar", "ngram", "suffix", "ngram@3", "hf"}
    assert (runs["ngram"]["k"], runs["ngram@3"]["k"]) == (8, 3)  # --k's default, and SPEC@K's own
    for r in runs.values():
        for key in (
            "tau",
            "accept_per_pos",
            "decode_tok_s",
            "e2e_tok_s",
            "speedup",
            "match_rate",
            "num_prompts",
            "new_tokens",
        ):
            assert key in r
    assert runs["ngram"]["match_rate"] == runs["suffix"]["match_rate"] == runs["ngram@3"]["match_rate"] == 1.0
    assert runs["ar"]["speedup"] == 1.0
    assert {"target", "dtype", "temperature", "k", "machine", "date"} <= set(res)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["generate", "   "], "empty prompt"),
        (["generate", "--target", "no-such-model", "hi"], "unknown target"),
        (["generate", "--k", "0", "hi"], "--k"),
        (["generate", "--temperature", "-1", "hi"], "temperature"),
        (["bench", "--drafters", "ar,bogus"], "unknown drafter"),
        (["bench", "--workload", "nope"], "workload"),
        (["bench", "--num-prompts", "0"], "--num-prompts"),
        (["bench", "--drafters", "ar,ngram@0"], "draft length"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, argv, needle):
    code, _, err = _run(capsys, argv)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_prompt_longer_than_context(capsys, tiny_checkpoint):
    code, _, err = _run(capsys, ["generate", "--target", tiny_checkpoint, "x" * 400])
    assert code == 2 and "context" in err and len(err.strip().splitlines()) == 1


def test_bad_workload_line(capsys, tiny_checkpoint, tmp_path):
    wl = tmp_path / "bad.jsonl"
    wl.write_text('{"prompt": "ok"}\n{"oops": 1}\n')
    code, _, err = _run(capsys, ["bench", "--target", tiny_checkpoint, "--workload", str(wl)])
    assert code == 2 and "line 2" in err and len(err.strip().splitlines()) == 1


def test_argparse_errors_are_one_line_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith", "generate", "--k", "notanumber", "hi"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
