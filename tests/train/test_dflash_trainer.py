"""`draftsmith train dflash` on a tiny local checkpoint: an overfit run measured by the real engine,
the speculator in the published layout, exact resume, and user errors. (Batching, packing,
checkpoint atomicity and data parallelism are the shared trainer's, tested with EAGLE-3.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_fixtures import files, read_metrics, run_args, sharp_target  # noqa: F401 (fixtures)

from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.drafters import registry
from draftsmith.drafters.dflash import load_dflash
from draftsmith.formats import vocab_order
from draftsmith.target.model import load_target
from draftsmith.train import checkpoint
from draftsmith.train.dflash_cli import main
from draftsmith.train.evaluate import eval_prompts

SMALL = ["--block-size", 4, "--layers", 1, "--anchors", 8, "--target-layers", "0,1"]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_overfit_loss_decreases_and_engine_tau(sharp_target, files, tmp_path):
    out = tmp_path / "run"
    args = run_args(sharp_target, files, out, *SMALL, "--epochs", 30, "--batch-tokens", 400, "--lr", 3e-3)
    assert main(args + ["--eval-every", "0"]) == 0
    m = read_metrics(out)
    assert len(m) == 30 and len(m[0]["acc"]) == 3
    first, last = m[0]["loss"], sum(r["loss"] for r in m[-3:]) / 3
    assert last < 0.6 * first, (first, last)
    assert m[-1]["acc"][0] > m[0]["acc"][0]
    # The recorded tau is the engine's on the eval prompts (the target's answers there are not in the
    # data, and this small run's drafts are not accepted on them yet: 1.0 measured).
    target = load_target(sharp_target, "float32")
    prompts = eval_prompts(target, files["eval"], 8, 12, 3)
    res = generate(target, registry.build(f"dflash:{out}"), prompts, k=3, max_new_tokens=12)
    stats = DecodeStats.combined(r.stats for r in res)
    assert m[-1]["tau"] == stats.tau and stats.draft_tokens > 0
    info = json.loads((out / "draftsmith.json").read_text())
    assert info["steps"] == 30 and info["tau"] == m[-1]["tau"] and info["block_size"] == 4
    assert info["command"].startswith("draftsmith train dflash --target")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["target_layer_ids"] == [0, 1]
    assert cfg["dflash_config"]["block_size"] == cfg["block_size"] == 4
    assert set(load_file(str(out / "model.safetensors"))) == {
        "fc.weight", "hidden_norm.weight", "norm.weight",
        *(f"layers.0.{n}.weight" for n in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
            "input_layernorm", "post_attention_layernorm",
        )),
    }  # fmt: skip
    vocab = cfg["vocab_size"]
    order = vocab_order.load(out)  # JSON: vLLM would load a second *.safetensors as weights
    assert (out / vocab_order.JSON).is_file() and sorted(order.tolist()) == list(range(vocab))
    emb = torch.nn.Embedding(vocab, 64)
    assert load_dflash(out, emb, torch.nn.Linear(64, vocab)).fc.weight.dtype == torch.float32


def test_resume_continues_the_loss_curve_exactly(sharp_target, files, tmp_path):
    common = [*SMALL, "--epochs", 4, "--batch-tokens", 120, "--lr", 2e-3, "--eval-prompts", 0]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(run_args(sharp_target, files, a, *common, "--max-steps", 7, "--save-every", 3)) == 0
    assert main(run_args(sharp_target, files, b, *common, "--max-steps", 4, "--save-every", 3)) == 0
    assert checkpoint.read_state(b)["step"] == 4
    assert main(run_args(sharp_target, files, b, *common, "--max-steps", 7, "--resume")) == 0
    ma, mb = read_metrics(a), read_metrics(b)
    assert [r["step"] for r in mb] == list(range(1, 8))
    for ra, rb in zip(ma, mb, strict=True):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-6 and ra["lr"] == rb["lr"], (ra, rb)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    assert len(json.loads((b / "draftsmith.json").read_text())["commands"]) == 2


def test_init_continues_from_a_trained_speculator(sharp_target, files, tmp_path, capsys):
    """`--init DIR` starts a new schedule from a trained DFlash speculator's weights, so its first
    step's loss is the trained model's, not a random one's; a shape that differs is refused."""
    common = [*SMALL, "--batch-tokens", 400, "--lr", 3e-3, "--eval-prompts", 0]
    first, second, fresh = tmp_path / "first", tmp_path / "second", tmp_path / "fresh"
    assert main(run_args(sharp_target, files, first, *common, "--epochs", 20)) == 0
    assert main(run_args(sharp_target, files, second, *common, "--epochs", 1, "--init", first)) == 0
    assert main(run_args(sharp_target, files, fresh, *common, "--epochs", 1)) == 0
    trained_loss = sum(r["loss"] for r in read_metrics(first)[-3:]) / 3
    assert read_metrics(second)[0]["loss"] < 0.8 * read_metrics(fresh)[0]["loss"]
    assert read_metrics(second)[0]["loss"] < 1.5 * trained_loss
    assert json.loads((second / "draftsmith.json").read_text())["init"] == str(first.resolve())
    bad = [a if a != 4 else 3 for a in common]  # --block-size 3: not the trained speculator's 4
    capsys.readouterr()
    assert main(run_args(sharp_target, files, tmp_path / "bad", *bad, "--init", first)) == 2
    assert "--block-size 4 (this run: 3)" in capsys.readouterr().err


def test_offline_features_train_like_online(sharp_target, files, tmp_path):
    from draftsmith.cli import main as cli_main

    common = [
        *SMALL,
        "--epochs",
        2,
        "--batch-tokens",
        120,
        "--lr",
        2e-3,
        "--eval-prompts",
        0,
        "--max-steps",
        3,
    ]
    store = tmp_path / "feats"
    rc = cli_main(["data", "features", "--target", sharp_target, "--data", files["data"], "--dtype", "float32",
                   "--layers", "0,1", "--out", str(store), "--no-progress"])  # fmt: skip
    assert rc == 0
    assert main(run_args(sharp_target, files, tmp_path / "a", *common)) == 0
    assert main(run_args(sharp_target, files, tmp_path / "b", *common, "--features", store)) == 0
    for ra, rb in zip(read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b"), strict=True):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-4 * max(1.0, ra["loss"]), (ra, rb)


def test_user_errors(sharp_target, files, tmp_path, capsys):
    def error(args) -> str:
        assert main([str(a) for a in args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), lines
        return lines[0]

    out = tmp_path / "out"
    assert "--block-size" in error(run_args(sharp_target, files, out, "--block-size", 1))
    assert "--anchors" in error(run_args(sharp_target, files, out, "--anchors", 0))
    assert "--target-layers" in error(run_args(sharp_target, files, out, "--target-layers", "0,x"))
    assert "--target-layers" in error(
        run_args(sharp_target, files, out, "--target-layers", "0,7", "--eval-prompts", 0)
    )
    assert "--init" in error(run_args(sharp_target, files, out, "--init", tmp_path / "none"))
    common = [*SMALL, "--max-steps", 1, "--eval-prompts", 0, "--batch-tokens", 100]
    assert main(run_args(sharp_target, files, out, *common)) == 0
    capsys.readouterr()
    assert "pass --resume" in error(run_args(sharp_target, files, out, *common))
    assert "other settings" in error(run_args(sharp_target, files, out, *common, "--resume", "--gamma", 3))
    assert Path(out / "config.json").exists()


def test_data_parallel_gloo_equals_single_process(sharp_target, files, tmp_path):
    """Anchors are drawn per example, so two ranks see the same blocks as one process."""
    import os
    import subprocess
    import sys

    from test_eagle3_trainer import _free_port

    common = [*SMALL, "--epochs", 2, "--batch-tokens", 200, "--lr", 2e-3, "--eval-prompts", 0]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    assert main(run_args(sharp_target, files, single, *common)) == 0
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(_free_port())]
    cmd += ["-m", "draftsmith.train.dflash_cli", *run_args(sharp_target, files, ddp, *common)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ms, md = read_metrics(single), read_metrics(ddp)
    assert len(ms) == len(md) >= 4
    for rs, rd in zip(ms, md, strict=True):
        assert rs["tokens"] == rd["tokens"] and abs(rs["loss"] - rd["loss"]) < 1e-4
    ws, wd = load_file(str(single / "model.safetensors")), load_file(str(ddp / "model.safetensors"))
    for k in ws:
        assert torch.allclose(ws[k], wd[k], atol=1e-4), k
