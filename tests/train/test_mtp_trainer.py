"""`draftsmith train mtp` on a tiny local checkpoint: an overfit run measured by the real engine, the
head saved in Qwen's `mtp.*` layout and lossless through `mtp:PATH`, fine-tuning from a saved head,
exact resume, offline features, and user errors. (Batching, packing, checkpoint atomicity and data
parallelism are the shared trainer's, tested with EAGLE-3.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import tiny_model
from train_fixtures import files, read_metrics, run_args, sharp_target  # noqa: F401 (fixtures)
from transformers import AutoTokenizer

from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.drafters import registry
from draftsmith.drafters.mtp import build_head
from draftsmith.formats.mtp_formats import to_checkpoint_layout
from draftsmith.target.model import Target, load_target
from draftsmith.train import checkpoint
from draftsmith.train.mtp_cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_overfit_engine_tau_lossless_and_fine_tune(sharp_target, files, tmp_path):
    out = tmp_path / "run"
    args = run_args(sharp_target, files, out, "--ttt-steps", 2, "--epochs", 30, "--batch-tokens", 400)
    assert main(args + ["--lr", "3e-3", "--eval-every", "0", "--eval-k", "3"]) == 0
    m = read_metrics(out)
    assert len(m) == 30 and len(m[0]["acc"]) == 2
    first, last = m[0]["loss"], sum(r["loss"] for r in m[-3:]) / 3
    assert last < 0.5 * first, (first, last)
    assert m[-1]["acc"][0] > m[0]["acc"][0]
    assert m[-1]["tau"] > 1.0  # measured by the engine through mtp:PATH
    info = json.loads((out / "draftsmith.json").read_text())
    assert info["steps"] == 30 and info["tau"] == m[-1]["tau"] and info["init"] == "random"
    assert info["ttt_steps"] == 2 and info["feature_layers"] == [-1]
    assert info["command"].startswith("draftsmith train mtp --target")
    # Qwen's layout: only mtp.* tensors (the embedding and LM head stay the target's), and its config.
    keys = set(load_file(str(out / "model.safetensors")))
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight"} <= keys
    assert all(k.startswith("mtp.") for k in keys) and "mtp.layers.0.self_attn.q_proj.weight" in keys
    assert json.loads((out / "config.json").read_text())["mtp_num_hidden_layers"] == 1

    # The saved head drafts losslessly: greedy equals plain decoding in float32.
    target = load_target(sharp_target, "float32")
    prompts = [[3, 17, 42, 5, 9], [11, 12, 13], [40, 41, 40, 41, 40, 41, 2]]
    plain = generate(target, None, prompts, max_new_tokens=20)
    spec = generate(target, registry.build(f"mtp:{out}"), prompts, k=3, max_new_tokens=20)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert DecodeStats.combined(r.stats for r in spec).tau > 1.0

    # Fine-tuning from the saved head starts where the run ended, not where a new head starts.
    tuned = tmp_path / "tuned"
    tune = run_args(sharp_target, files, tuned, "--ttt-steps", 2, "--batch-tokens", 400, "--init", out)
    assert main(tune + ["--lr", "1e-6", "--max-steps", "1", "--eval-prompts", "0"]) == 0
    assert read_metrics(tuned)[0]["loss"] < 0.6 * first
    assert json.loads((tuned / "draftsmith.json").read_text())["init"] == str(out)


def test_resume_continues_the_loss_curve_exactly(sharp_target, files, tmp_path):
    common = ["--init", "last_layer", "--epochs", 4, "--batch-tokens", 120, "--lr", 2e-3, "--eval-prompts", 0]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(run_args(sharp_target, files, a, *common, "--max-steps", 7, "--save-every", 3)) == 0
    assert main(run_args(sharp_target, files, b, *common, "--max-steps", 4, "--save-every", 3)) == 0
    assert checkpoint.read_state(b)["step"] == 4
    assert main(run_args(sharp_target, files, b, *common, "--max-steps", 7, "--resume")) == 0
    ma, mb = read_metrics(a), read_metrics(b)
    assert [r["step"] for r in mb] == list(range(1, 8)) and len(ma[0]["acc"]) == 3  # --ttt-steps 3
    for ra, rb in zip(ma, mb, strict=True):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-6 and ra["lr"] == rb["lr"], (ra, rb)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    assert len(json.loads((b / "draftsmith.json").read_text())["commands"]) == 2


def test_fine_tune_a_native_qwen3_5_head(sharp_target, files, tmp_path):
    """A hybrid Qwen3.5 folder that ships `mtp.*` tensors: `--init native` starts from its head, and
    the result is saved under the very same tensor names, drafting losslessly."""
    folder = tmp_path / "qwen3_5"
    tokenizer = AutoTokenizer.from_pretrained(sharp_target)
    model = tiny_model("qwen3_5", seed=3, scale=3.0, vocab=len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    native = to_checkpoint_layout(build_head(Target(model, None, "q"), std=0.1, seed=4).state_dict())
    weights = load_file(str(folder / "model.safetensors"))
    save_file({**weights, **native}, str(folder / "model.safetensors"), metadata={"format": "pt"})

    out = tmp_path / "tuned"
    args = run_args(str(folder), files, out, "--init", "native", "--ttt-steps", 2, "--batch-tokens", 200)
    assert main(args + ["--lr", "1e-7", "--max-steps", "2", "--eval-prompts", "0"]) == 0
    saved = load_file(str(out / "model.safetensors"))
    assert set(saved) == set(native)
    assert all(torch.allclose(saved[k], native[k], atol=1e-5) for k in native)  # a tiny lr: barely moved

    target = load_target(str(folder), "float32")
    prompts = [[3, 17, 42, 5, 9], [11, 12, 13, 11, 12, 13]]
    plain = generate(target, None, prompts, max_new_tokens=12)
    spec = generate(target, registry.build(f"mtp:{out}"), prompts, k=3, max_new_tokens=12)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]


def test_offline_features_train_like_online(sharp_target, files, tmp_path):
    """The head reads the store's final hidden state (`hidden`), whatever layers the store holds."""
    from draftsmith.cli import main as cli_main

    common = ["--epochs", 2, "--batch-tokens", 120, "--lr", 2e-3, "--eval-prompts", 0, "--max-steps", 3]
    store = tmp_path / "feats"
    rc = cli_main(["data", "features", "--target", sharp_target, "--data", files["data"], "--dtype", "float32",
                   "--layers", "0", "--out", str(store), "--no-progress"])  # fmt: skip
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
    assert "--init" in error(run_args(sharp_target, files, out, "--init", "nonsense"))
    assert "--ttt-steps" in error(run_args(sharp_target, files, out, "--ttt-steps", 0))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no mtp.* tensors" in error(
        run_args(sharp_target, files, out, "--init", empty, "--eval-prompts", 0)
    )
    assert "has no MTP head" in error(
        run_args(sharp_target, files, out, "--init", "native", "--eval-prompts", 0)
    )
    common = ["--max-steps", 1, "--eval-prompts", 0, "--batch-tokens", 100]
    assert main(run_args(sharp_target, files, out, *common)) == 0
    capsys.readouterr()
    assert "pass --resume" in error(run_args(sharp_target, files, out, *common))
    assert "other settings" in error(
        run_args(sharp_target, files, out, *common, "--resume", "--init", "last_layer")
    )
