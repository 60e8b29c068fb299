"""`draftsmith train draft-lm` on a tiny local checkpoint: the distillation loss (packed rows score
as separate ones, and it is the soft cross-entropy against the target), an overfit run whose folder
keeps only the layers and norm, exact resume, offline features, and user errors. (Batching,
checkpoint atomicity and data parallelism are the shared trainer's, tested with EAGLE-3.)"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_checkpoint
from safetensors.torch import load_file
from tiny import tiny_model
from train_fixtures import files, read_metrics, run_args, sharp_target  # noqa: F401 (fixtures)
from transformers import LlamaForCausalLM

from draftsmith.data.tokenize import Example
from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.drafters import registry
from draftsmith.formats.draft_lm_format import (
    build_shared,
    load_shared,
    load_vocab_order,
    shares_target_embedding,
)
from draftsmith.target.model import load_target
from draftsmith.train import checkpoint
from draftsmith.train.data import pack
from draftsmith.train.draft_lm_cli import main
from draftsmith.train.draft_lm_objective import draft_lm_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def _student(target_model, layers: int = 1):
    config = target_model.config.__class__(**{**target_model.config.to_dict(), "num_hidden_layers": layers})
    torch.manual_seed(1)
    return build_shared(config, target_model, torch.float32)


def test_loss_is_soft_cross_entropy_and_packing_keeps_examples_apart():
    target = tiny_model("llama", seed=0, scale=3.0)
    student = _student(target)
    examples = [Example([5, 9, 2, 7, 7, 3], [0, 0, 1, 1, 1, 1]), Example([4, 8, 8, 1], [0, 1, 1, 1])]
    with torch.no_grad():
        packed = pack(examples, 64, packing=True)
        assert packed.input_ids.shape[0] == 1  # both in one row
        logits = target(packed.input_ids, position_ids=packed.positions).logits  # per-example positions
        alone = [pack([ex], 64) for ex in examples]
        alone_logits = [target(a.input_ids).logits for a in alone]
    # The target's logits of the packed row, taken per example, are what each example alone gives
    # only if the row is scored per example; compute the target side per example to be exact.
    at = 0
    for a, lg in zip(alone, alone_logits, strict=True):
        n = a.input_ids.shape[1]
        logits[0, at : at + n] = lg[0]
        at += n
    res = draft_lm_loss(
        student,
        packed.input_ids,
        packed.loss_mask,
        logits,
        segments=packed.segments,
        positions=packed.positions,
    )
    # By hand: scored positions t (x_{t+1} an assistant token of the same example), mean over them
    # of the cross-entropy of the student's softmax against the target's.
    total, n = 0.0, 0
    for a, lg in zip(alone, alone_logits, strict=True):
        with torch.no_grad():
            s = student(a.input_ids).logits[0]
        for t in range(a.input_ids.shape[1] - 1):
            if a.loss_mask[0, t + 1]:
                total += float(-(lg[0, t].softmax(-1) * s[t].log_softmax(-1)).sum())
                n += 1
    assert int(res.counts) == n == 7
    assert abs(float(res.loss.detach()) - total / n) < 1e-4
    res.loss.backward()
    assert student.model.layers[0].self_attn.q_proj.weight.grad is not None


@pytest.fixture(scope="module")
def mixing_target(tmp_path_factory) -> str:
    """The tiny Llama with its own random, scaled LM head: its next token is a function of the
    context that a fresh draft must learn (with the head tied, or the sharp target's head = 20 x the
    embedding, a random model's residual stream keeps the current token on top, and any untrained
    draft on the same head already agrees with it)."""
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("mixing"))
    model = LlamaForCausalLM.from_pretrained(path)
    model.config.tie_word_embeddings = False
    torch.manual_seed(5)
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.5)
    model.save_pretrained(path)
    return path


def test_overfit_saves_layers_only_and_reloads(mixing_target, files, tmp_path):
    out = tmp_path / "run"
    args = run_args(mixing_target, files, out, "--layers", "1", "--epochs", 25)
    assert main(args + ["--batch-tokens", "400", "--lr", "3e-3", "--eval-every", "0", "--eval-k", "3"]) == 0
    m = read_metrics(out)
    assert len(m) == 25 and len(m[0]["acc"]) == 1
    first, last = m[0]["loss"], sum(r["loss"] for r in m[-3:]) / 3
    assert last < 0.7 * first, (first, last)
    assert m[-1]["acc"][0] > m[0]["acc"][0]
    assert m[-1]["tau"] > 1.0  # measured by the engine through draft:PATH
    info = json.loads((out / "draftsmith.json").read_text())
    assert info["kind"] == "draft-lm" and info["shares_target_embedding"] and shares_target_embedding(out)
    assert info["layers"] == 1 and info["init_layers"] is None and info["steps"] == 25
    keys = set(load_file(str(out / "model.safetensors")))
    assert "model.embed_tokens.weight" not in keys and "lm_head.weight" not in keys
    assert "model.norm.weight" in keys and "model.layers.0.self_attn.q_proj.weight" in keys
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    # The token ranking for `draft:PATH:vocab=N`: every id once, frequent assistant tokens first.
    order = load_vocab_order(out)
    assert sorted(order.tolist()) == list(range(int(order.numel()))) and order.numel() >= 64
    assert order.tolist() != sorted(order.tolist())  # ranked by the data, not left in id order
    # Reloaded onto the target's embedding and head, it computes what training left.
    target = load_target(mixing_target, "float32")
    draft = load_shared(out, target.model, torch.float32)
    ckpt = checkpoint.load(out, torch.device("cpu"))
    ids = torch.tensor([[3, 17, 42, 5, 9]])
    with torch.no_grad():
        got = draft(ids).logits
        trained = draft.__class__(draft.config)
        trained.load_state_dict({k.removeprefix("lm."): v for k, v in ckpt.model.items()})
        assert torch.allclose(got, trained(ids).logits, atol=1e-5)
    # It drafts losslessly: greedy equals plain decoding in float32.
    prompts = [[3, 17, 42, 5, 9], [11, 12, 13], [40, 41, 40, 41, 40, 41, 2]]
    plain = generate(target, None, prompts, max_new_tokens=20)
    spec = generate(target, registry.build(f"draft:{out}"), prompts, k=3, max_new_tokens=20)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert DecodeStats.combined(r.stats for r in spec).tau > 1.0


def test_init_from_target_layers_copies_them(sharp_target, files, tmp_path):
    out = tmp_path / "copied"
    args = run_args(sharp_target, files, out, "--init-from-target-layers", "1", "--max-steps", 1)
    assert main(args + ["--lr", "1e-12", "--eval-prompts", "0", "--batch-tokens", "120"]) == 0
    assert json.loads((out / "draftsmith.json").read_text())["init_layers"] == [1]
    saved = load_file(str(out / "model.safetensors"))
    theirs = load_file(f"{sharp_target}/model.safetensors")
    for name in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
        assert torch.allclose(saved[f"model.layers.0.{name}"], theirs[f"model.layers.1.{name}"], atol=1e-6)
    assert torch.allclose(saved["model.norm.weight"], theirs["model.norm.weight"])


def test_resume_continues_the_loss_curve_exactly(sharp_target, files, tmp_path):
    common = ["--layers", 1, "--epochs", 4, "--batch-tokens", 120, "--lr", 2e-3, "--eval-prompts", 0]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(run_args(sharp_target, files, a, *common, "--max-steps", 7, "--save-every", 3)) == 0
    assert main(run_args(sharp_target, files, b, *common, "--max-steps", 4, "--save-every", 3)) == 0
    assert main(run_args(sharp_target, files, b, *common, "--max-steps", 7, "--resume")) == 0
    for ra, rb in zip(read_metrics(a), read_metrics(b), strict=True):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-6 and ra["lr"] == rb["lr"], (ra, rb)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_init_continues_from_a_trained_draft(mixing_target, files, tmp_path):
    common = ["--epochs", 8, "--batch-tokens", 400, "--lr", 3e-3, "--eval-prompts", 0]
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(run_args(mixing_target, files, first, "--layers", 1, *common)) == 0
    assert main(run_args(mixing_target, files, second, "--init", first, *common)) == 0
    info = json.loads((second / "draftsmith.json").read_text())
    assert info["layers"] == 1 and info["init"] == str(first.resolve())
    # The second run starts where the first ended: its first loss is the first run's latest level,
    # far below a fresh draft's first loss.
    m1, m2 = read_metrics(first), read_metrics(second)
    assert m2[0]["loss"] < 0.8 * m1[0]["loss"], (m1[0]["loss"], m2[0]["loss"])
    assert [r["lr"] for r in m2] == [r["lr"] for r in m1]  # a new schedule of its own


def test_offline_features_train_like_online(sharp_target, files, tmp_path):
    from draftsmith.cli import main as cli_main

    common = ["--layers", 1, "--epochs", 2, "--batch-tokens", 120, "--lr", 2e-3, "--eval-prompts", 0]
    store = tmp_path / "feats"
    rc = cli_main(["data", "features", "--target", sharp_target, "--data", files["data"], "--dtype", "float32",
                   "--layers", "0", "--out", str(store), "--no-progress"])  # fmt: skip
    assert rc == 0
    assert main(run_args(sharp_target, files, tmp_path / "a", *common, "--max-steps", 3)) == 0
    assert (
        main(run_args(sharp_target, files, tmp_path / "b", *common, "--max-steps", 3, "--features", store))
        == 0
    )
    for ra, rb in zip(read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b"), strict=True):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-4 * max(1.0, ra["loss"]), (ra, rb)


def test_own_width_trains_its_own_embedding(sharp_target, files, tmp_path):
    out = tmp_path / "narrow"
    args = run_args(
        sharp_target, files, out, "--layers", 1, "--hidden", 16, "--max-steps", 2, "--eval-prompts", 0
    )
    assert main(args + ["--batch-tokens", "120"]) == 0
    keys = set(load_file(str(out / "model.safetensors")))
    assert "model.embed_tokens.weight" in keys and not shares_target_embedding(out)
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 16


def test_user_errors(sharp_target, files, tmp_path, capsys):
    def error(args) -> str:
        assert main([str(a) for a in args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), lines
        return lines[0]

    out = tmp_path / "out"
    common = ["--eval-prompts", 0, "--max-steps", 1]
    assert "not [99]" in error(
        run_args(sharp_target, files, out, "--init-from-target-layers", "0,99", *common)
    )
    assert "separated by commas" in error(
        run_args(sharp_target, files, out, "--init-from-target-layers", "a,b")
    )
    assert "exclude each other" in error(
        run_args(sharp_target, files, out, "--init-from-target-layers", "0", "--hidden", 16)
    )
    assert "--layers 0" in error(run_args(sharp_target, files, out, "--layers", 0))
    assert "config.json missing" in error(run_args(sharp_target, files, out, "--init", tmp_path, *common))
    assert not out.exists()  # nothing written by a refused run
