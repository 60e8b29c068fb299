"""`draftsmith train eagle3` on a tiny local checkpoint: data batching, an overfit run measured by the
real engine, exact resume, atomic checkpoints, data parallelism over gloo, and user errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import tiny_target
from train_fixtures import files, read_metrics, run_args, sharp_target  # noqa: F401 (fixtures)

from draftsmith.data.tokenize import Example
from draftsmith.drafters.eagle3 import load_eagle3
from draftsmith.train import checkpoint, trainer
from draftsmith.train.data import draft_vocab, pack, plan_batches, shard
from draftsmith.train.eagle3_cli import main
from draftsmith.train.target_pass import can_pack, target_pass

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- data


def test_draft_vocab_most_frequent_assistant_tokens_ties_by_id():
    ex = [Example([5, 7, 7, 9, 3, 3], [0, 1, 1, 1, 1, 1]), Example([9, 2], [1, 0])]
    # assistant counts: 7 -> 2, 3 -> 2, 9 -> 2; 5 and 2 are not assistant tokens
    assert draft_vocab(ex, 2, 12).tolist() == [3, 7]
    assert draft_vocab(ex, 4, 12).tolist() == [0, 3, 7, 9]  # the rest by id among zero counts
    assert draft_vocab(ex, 20, 12).tolist() == list(range(12))
    # An old vocabulary breaks ties (a speculator continued with --init keeps what it knew).
    assert draft_vocab(ex, 2, 12, prefer=torch.tensor([9, 11])).tolist() == [3, 9]
    assert draft_vocab(ex, 4, 12, prefer=torch.tensor([9, 11])).tolist() == [3, 7, 9, 11]


def test_plan_shard_and_pack():
    lengths = [5, 3, 8, 2, 6, 4]
    plan = plan_batches(lengths, batch_tokens=10, epochs=2, seed=0)
    for epoch in (0, 1):
        got = [i for b in plan if b.epoch == epoch for i in b.examples]
        assert sorted(got) == list(range(6))
    for b in plan:
        assert sum(lengths[i] for i in b.examples) <= 10 or len(b.examples) == 1
    assert plan == plan_batches(lengths, batch_tokens=10, epochs=2, seed=0)
    batch = plan[0].examples
    parts = [shard(batch, lengths, r, 2) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(batch) and not set(parts[0]) & set(parts[1])

    exs = [Example(list(range(10, 10 + n)), [1] * n) for n in (5, 3, 2)]
    p = pack(exs, max_len=8)
    assert p.input_ids.shape == (2, 8) and p.num_tokens == 10  # first fit: [5 + 3], [2 + padding]
    assert p.segments.tolist() == [[0] * 5 + [1] * 3, [2, 2] + [-1] * 6]
    assert p.positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1] + [0] * 6]
    assert pack(exs, max_len=8, packing=False).input_ids.shape == (3, 5)


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_target_pass_on_packed_rows_equals_separate_forwards(kind):
    """Packed rows (attention-only) or padded rows (hybrid: never packed) change nothing per example."""
    target = tiny_target(kind)
    exs = [Example(list(range(3, 3 + n)), [1] * n) for n in (7, 4, 3)]
    batch = pack(exs, 16, packing=can_pack(target))
    assert batch.input_ids.shape[0] == (1 if kind == "llama" else 3)
    feats, logits = target_pass(target, batch, [0, 0, 1])
    for i, ex in enumerate(exs):
        with torch.no_grad():
            ref = target.model(input_ids=torch.tensor([ex.input_ids]), output_hidden_states=True)
        rows = batch.segments == i
        assert torch.allclose(logits[rows], ref.logits[0], atol=1e-5)
        assert torch.allclose(feats[rows][:, 2], ref.hidden_states[2][0], atol=1e-5)


# ---------------------------------------------------------------- training


def test_overfit_loss_decreases_and_engine_tau(sharp_target, files, tmp_path):
    out = tmp_path / "run"
    args = run_args(sharp_target, files, out, "--epochs", 30, "--batch-tokens", 400, "--lr", 3e-3)
    assert main(args + ["--ttt-steps", "3", "--eval-every", "0", "--eval-k", "3"]) == 0
    m = read_metrics(out)
    assert len(m) == 30
    first, last = m[0]["loss"], sum(r["loss"] for r in m[-3:]) / 3
    assert last < 0.6 * first, (first, last)
    assert m[-1]["acc"][0] > m[0]["acc"][0]
    assert m[-1]["tau"] > 2.0  # of at most 4 (k = 3): the overfit draft is accepted (3.67 measured)
    info = json.loads((out / "draftsmith.json").read_text())
    assert info["steps"] == 30 and info["tau"] == m[-1]["tau"] and info["draft_vocab_size"] > 0
    assert info["command"].startswith("draftsmith train eagle3 --target")
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    assert load_eagle3(out, torch.nn.Embedding(vocab, 64)).lm_head.weight.dtype == torch.float32


def test_resume_continues_the_loss_curve_exactly(sharp_target, files, tmp_path):
    common = ["--epochs", 4, "--batch-tokens", 120, "--lr", 2e-3, "--ttt-steps", 3, "--eval-prompts", 0]
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


def test_time_budget_anneals_and_ends_on_time(sharp_target, files, tmp_path, monkeypatch):
    """`--time-budget`: the run stops when the budget is spent, long before its epochs are done, and
    its learning rate has reached 0 by then. A fake clock that gains one second per reading makes
    the spending deterministic."""
    clock = iter(range(10**9))
    monkeypatch.setattr("draftsmith.train.trainer.time.perf_counter", lambda: float(next(clock)))
    out = tmp_path / "timed"
    common = ["--epochs", 1000, "--batch-tokens", 120, "--lr", 2e-3, "--ttt-steps", 2, "--eval-prompts", 0]
    assert main(run_args(sharp_target, files, out, *common, "--time-budget", 60, "--warmup-ratio", 0.1)) == 0
    m = read_metrics(out)
    lrs = [r["lr"] for r in m]
    assert 5 < len(m) < 100, len(m)  # about 60 s of fake clock, a few readings per step
    assert lrs[-1] == 0.0 and max(lrs) > 1e-3
    peak = lrs.index(max(lrs))
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :], strict=False))  # cosine after warmup
    info = json.loads((out / "draftsmith.json").read_text())
    assert info["steps"] == len(m) and info["train"]["time_budget"] == 60


def test_time_budget_reserves_the_final_evaluation_and_save(sharp_target, files, tmp_path, monkeypatch):
    """The last step is chosen so that the final evaluation and save end within the budget too: with
    a held-out evaluation costing 20 s of a 60 s budget (fake clock: 0.1 s per reading), the run's
    last save ends by 60 s after training began (the evaluation before the first step is outside the
    budget)."""
    now = [0.0]

    def read() -> float:
        now[0] += 0.1
        return now[0]

    monkeypatch.setattr("draftsmith.train.trainer.time.perf_counter", read)
    real_score, real_save = trainer.score, trainer._save
    seen: list[float] = []

    def slow_score(*a, **kw):
        seen.append(now[0])
        now[0] += 20.0
        return real_score(*a, **kw)

    def timed_save(*a, **kw):
        real_save(*a, **kw)
        seen.append(now[0])

    monkeypatch.setattr("draftsmith.train.trainer.score", slow_score)
    monkeypatch.setattr("draftsmith.train.trainer._save", timed_save)
    out = tmp_path / "timed"
    common = ["--epochs", 1000, "--batch-tokens", 120, "--ttt-steps", 2, "--eval-prompts", 0]
    common += ["--eval-data", files["data"], "--eval-every-minutes", 100]
    assert main(run_args(sharp_target, files, out, *common, "--time-budget", 60)) == 0
    training_began = seen[0] + 20.0  # the first evaluation ran just before the first step
    assert 50 < seen[-1] - training_began <= 61, seen  # without the reserve: about 80
    info = json.loads((out / "draftsmith.json").read_text())
    assert info["wall_time_s"] <= 61 and info["steps"] > 2 and "heldout" in info


def test_init_continues_from_a_trained_speculator(sharp_target, files, tmp_path):
    """`--init DIR` starts a new schedule from a trained speculator: its weights and its draft
    vocabulary, so the first step's loss is the trained model's, not a random one's."""
    common = ["--batch-tokens", 120, "--lr", 3e-3, "--ttt-steps", 3, "--eval-prompts", 0]
    first, second, fresh = tmp_path / "first", tmp_path / "second", tmp_path / "fresh"
    assert main(run_args(sharp_target, files, first, *common, "--epochs", 6)) == 0
    assert main(run_args(sharp_target, files, second, *common, "--epochs", 1, "--init", first)) == 0
    assert main(run_args(sharp_target, files, fresh, *common, "--epochs", 1)) == 0
    trained_loss = sum(r["loss"] for r in read_metrics(first)[-3:]) / 3
    assert read_metrics(second)[0]["loss"] < 0.8 * read_metrics(fresh)[0]["loss"]
    assert read_metrics(second)[0]["loss"] < 1.5 * trained_loss
    wa, wb = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
    assert torch.equal(wa["d2t"], wb["d2t"])
    assert json.loads((second / "draftsmith.json").read_text())["init"] == str(first.resolve())


def test_init_rebuilds_the_draft_vocabulary_from_the_new_data(sharp_target, files, tmp_path):
    """A smaller --draft-vocab with --init: the vocabulary is the new data's most frequent tokens
    (ties to the old vocabulary), shared tokens keep their head rows, new ones start at zero."""
    common = ["--batch-tokens", 120, "--ttt-steps", 2, "--eval-prompts", 0]
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(run_args(sharp_target, files, first, *common, "--draft-vocab", 40, "--max-steps", 2)) == 0
    assert (
        main(
            run_args(sharp_target, files, second, *common, "--draft-vocab", 7, "--init", first, "--lr", 1e-12)
        )
        == 0
    )
    wa, wb = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
    ids_a = (wa["d2t"] + torch.arange(40)).tolist()
    ids_b = (wb["d2t"] + torch.arange(7)).tolist()
    assert len(ids_b) == 7 and set(ids_b) <= set(ids_a)  # the most frequent tokens were in both
    for i, tid in enumerate(ids_b):
        torch.testing.assert_close(
            wb["lm_head.weight"][i], wa["lm_head.weight"][ids_a.index(tid)], atol=1e-6, rtol=0
        )
    torch.testing.assert_close(wb["fc.weight"], wa["fc.weight"], atol=1e-6, rtol=0)


def test_offline_features_train_like_online(sharp_target, files, tmp_path):
    from draftsmith.cli import main as cli_main

    common = ["--epochs", 2, "--batch-tokens", 120, "--lr", 2e-3, "--ttt-steps", 3, "--eval-prompts", 0]
    store = tmp_path / "feats"
    rc = cli_main(["data", "features", "--target", sharp_target, "--data", files["data"], "--dtype", "float32",
                   "--max-len", "2048", "--out", str(store), "--no-progress"])  # fmt: skip
    assert rc == 0
    assert main(run_args(sharp_target, files, tmp_path / "a", *common, "--max-steps", 4)) == 0
    assert (
        main(run_args(sharp_target, files, tmp_path / "b", *common, "--max-steps", 4, "--features", store))
        == 0
    )
    ma, mb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert len(ma) == len(mb) == 4
    for ra, rb in zip(ma, mb, strict=True):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-4 * max(1.0, ra["loss"]), (ra, rb)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    def ckpt(step):
        return checkpoint.Checkpoint(
            model={"w": torch.full((3,), float(step))},
            optimizer={"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}]},
            rng=checkpoint.capture_rng(),
            state={"step": step},
            metrics=[{"step": step}],
        )

    checkpoint.save(tmp_path, ckpt(1))
    real_save = torch.save

    def crash(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, ckpt(2))
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    got = checkpoint.load(tmp_path)
    assert got.state["step"] == 1 and got.model["w"].tolist() == [1.0] * 3
    assert got.optimizer["param_groups"][0]["betas"] == (0.9, 0.95)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]  # no temporary folder left

    # A crash between moving the old checkpoint aside and moving the new one in.
    real_rename = Path.rename
    calls = []

    def rename_then_crash(self, target):
        calls.append(target)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename_then_crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, ckpt(3))
    monkeypatch.setattr(Path, "rename", real_rename)
    assert checkpoint.load(tmp_path).state["step"] == 1
    checkpoint.save(tmp_path, ckpt(4))
    assert checkpoint.load(tmp_path).state["step"] == 4
    assert not (tmp_path / ".checkpoint.old").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_data_parallel_gloo_equals_single_process(sharp_target, files, tmp_path):
    common = ["--epochs", 2, "--batch-tokens", 200, "--lr", 2e-3, "--ttt-steps", 2, "--eval-prompts", 0]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    assert main(run_args(sharp_target, files, single, *common)) == 0
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        str(torchrun),
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
        "-m",
        "draftsmith.train.eagle3_cli",
    ]
    proc = subprocess.run(
        cmd + run_args(sharp_target, files, ddp, *common),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ms, md = read_metrics(single), read_metrics(ddp)
    assert len(ms) == len(md) >= 4
    for rs, rd in zip(ms, md, strict=True):
        assert rs["tokens"] == rd["tokens"] and abs(rs["loss"] - rd["loss"]) < 1e-4
    ws, wd = load_file(str(single / "model.safetensors")), load_file(str(ddp / "model.safetensors"))
    for k in ws:
        assert torch.allclose(ws[k], wd[k], atol=1e-4), k


# ---------------------------------------------------------------- user errors


def test_user_errors(sharp_target, files, tmp_path, capsys):
    def error(args) -> str:
        assert main([str(a) for a in args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), lines
        return lines[0]

    out = tmp_path / "out"
    assert "not found" in error(run_args(sharp_target, {**files, "data": str(tmp_path / "nope.jsonl")}, out))
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "is empty" in error(run_args(sharp_target, {**files, "data": str(tmp_path / "empty.jsonl")}, out))
    (tmp_path / "bad.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{oops\n')
    assert "line 2" in error(run_args(sharp_target, {**files, "data": str(tmp_path / "bad.jsonl")}, out))
    assert "holds no checkpoint" in error(run_args(sharp_target, files, out, "--resume"))
    assert "--lr" in error(run_args(sharp_target, files, out, "--lr", 0))
    assert "--time-budget" in error(run_args(sharp_target, files, out, "--time-budget", 0))

    common = ["--max-steps", 1, "--eval-prompts", 0, "--ttt-steps", 1, "--batch-tokens", 100]
    assert main(run_args(sharp_target, files, out, *common)) == 0
    capsys.readouterr()
    assert "pass --resume" in error(run_args(sharp_target, files, out, *common))
    assert "another run" in error(run_args(sharp_target, files, out, *common, "--lr", 5e-4))
    assert "other settings" in error(
        run_args(sharp_target, files, out, *common, "--resume", "--ttt-steps", 2)
    )
    assert "--init" in error(
        run_args(sharp_target, files, tmp_path / "o2", *common, "--init", tmp_path / "none")
    )


def test_dtype_auto_trains_in_float32_without_native_bf16(sharp_target, files, tmp_path, monkeypatch):
    from draftsmith import machine

    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "fma"})
    args = run_args(
        sharp_target, files, tmp_path / "run", "--max-steps", 1, "--eval-prompts", 0, "--ttt-steps", 2
    )
    assert main([*args[: args.index("--dtype")], *args[args.index("--dtype") + 2 :], "--dtype", "auto"]) == 0
    info = json.loads((tmp_path / "run" / "draftsmith.json").read_text())
    assert info["train"]["dtype"] == "float32"
    w = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert w["fc.weight"].dtype == torch.float32
