"""What the trainer tests share: a tiny target with confident predictions, a small conversation file
with an eval prompt file, the CLI arguments of a float32 run on them, and a run's metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_checkpoint
from transformers import LlamaForCausalLM

CONVERSATIONS = [
    [("user", "say hello"), ("assistant", "hello hello hello world")],
    [
        ("user", "count"),
        ("assistant", "one two three four five"),
        ("user", "more"),
        ("assistant", "six seven"),
    ],
    [("user", "abc"), ("assistant", "abcdefghijklmnopqrstuvwxyz")],
    [("user", "yes?"), ("assistant", "yes yes no yes")],
]


@pytest.fixture(scope="module")
def sharp_target(tmp_path_factory) -> str:
    """The tiny Llama with an untied, scaled LM head: confident next-token distributions, so the
    draft has something to learn (the tied random head is nearly uniform)."""
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("sharp"))
    model = LlamaForCausalLM.from_pretrained(path)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone() * 20)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("data")
    rows = [
        {"id": f"c{i}", "messages": [{"role": r, "content": c} for r, c in conv]}
        for i, conv in enumerate(CONVERSATIONS)
    ]
    (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text(
        json.dumps({"id": "e1", "prompt": "say hello"})
        + "\n"
        + json.dumps({"id": "e2", "prompt": "abc"})
        + "\n"
    )
    return {"data": str(d / "data.jsonl"), "eval": str(d / "eval.jsonl")}


def run_args(target, files, out, *extra) -> list[str]:
    base = ["--target", target, "--data", files["data"], "--out", str(out), "--dtype", "float32"]
    base += ["--eval-workload", files["eval"], "--eval-max-new-tokens", "12", "--no-progress"]
    return base + [str(x) for x in extra]


def read_metrics(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
