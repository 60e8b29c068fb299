"""Offline features: what is stored equals the online target pass, resumable, refused when short."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import tiny_target

from draftsmith.cli import main
from draftsmith.data.features import FeatureStore, plan_shards, write_features
from draftsmith.data.tokenize import Example
from draftsmith.errors import UserError


def _examples(n: int = 7, seed: int = 0) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(5, 40, (1,), generator=g))
        ids = torch.randint(3, 60, (length,), generator=g).tolist()
        out.append(Example(input_ids=ids, loss_mask=[1] * length))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_stored_features_equal_a_solo_forward(tmp_path, kind):
    target = tiny_target(kind, vocab=64)
    examples = _examples()
    layers = [0, 1]
    write_features(
        target, examples, layers, tmp_path / "f", shard_tokens=60, batch_tokens=70, dtype=torch.float32
    )
    store = FeatureStore.open(tmp_path / "f", examples, layers)
    assert len(store.index["shards"]) > 1  # several shards, several packed forwards per shard
    for i, ex in enumerate(examples):
        with torch.inference_mode():
            out = target.base(input_ids=torch.tensor([ex.input_ids]), output_hidden_states=True)
        feats, hidden = store.get(i)
        want = torch.stack([out.hidden_states[j + 1][0] for j in layers], dim=1)
        torch.testing.assert_close(feats, want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(hidden, out.last_hidden_state[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(store.get(i, [1])[0][:, 0], want[:, 1])


def test_rerun_keeps_finished_shards_and_completes(tmp_path, monkeypatch):
    target = tiny_target("llama", vocab=64)
    examples = _examples()
    out = tmp_path / "f"
    from draftsmith.data import features as mod

    real = mod.target_features
    calls = {"n": 0}

    def dying(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(mod, "target_features", dying)
    with pytest.raises(KeyboardInterrupt):
        write_features(target, examples, [1], out, shard_tokens=40, batch_tokens=40)
    kept = sorted(p.name for p in out.glob("shard-*.safetensors"))
    assert kept and not list(out.glob(".*tmp"))
    assert not json.loads((out / "index.json").read_text())["complete"]
    with pytest.raises(UserError, match="incomplete"):
        FeatureStore.open(out)
    before = {p: (out / p).stat().st_mtime_ns for p in kept}
    monkeypatch.setattr(mod, "target_features", real)
    write_features(target, examples, [1], out, shard_tokens=40, batch_tokens=40)
    assert all((out / p).stat().st_mtime_ns == t for p, t in before.items())
    store = FeatureStore.open(out, examples, [1])
    assert sum(store.get(i)[0].shape[0] for i in range(len(examples))) == sum(
        len(e.input_ids) for e in examples
    )


def test_refusals(tmp_path):
    target = tiny_target("llama", vocab=64)
    examples = _examples()
    with pytest.raises(UserError, match="only 1.0 kB is free"):
        write_features(target, examples, [1], tmp_path / "a", free_bytes=1000)
    assert not (tmp_path / "a").exists()  # refused before writing anything
    write_features(target, examples, [1], tmp_path / "b")
    with pytest.raises(UserError, match="other settings"):
        write_features(target, examples, [0, 1], tmp_path / "b")
    with pytest.raises(UserError, match="other data"):
        FeatureStore.open(tmp_path / "b", _examples(seed=1))
    with pytest.raises(UserError, match="needs"):
        FeatureStore.open(tmp_path / "b", examples, [0])


def test_plan_shards_never_splits_an_example():
    assert plan_shards([5, 5, 5], 100) == [(0, 3)]
    assert plan_shards([50, 50], 10) == [(0, 1), (1, 2)]
    assert plan_shards([], 10) == []


def test_cli_writes_a_store(tmp_path, tiny_checkpoint, capsys):
    data = tmp_path / "d.jsonl"
    msgs = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello you"}]
    data.write_text(json.dumps({"id": "a", "messages": msgs, "finish_reasons": ["stop"]}) + "\n")
    rc = main(["data", "features", "--target", tiny_checkpoint, "--data", str(data), "--layers", "0,1",
               "--out", str(tmp_path / "f"), "--no-progress"])  # fmt: skip
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["examples"] == 1
    index = json.loads((tmp_path / "f" / "index.json").read_text())
    assert index["complete"] and index["layers"] == [0, 1] and index["num_tokens"] > 0
    rc = main(["data", "features", "--target", tiny_checkpoint, "--data", str(data), "--layers", "7",
               "--out", str(tmp_path / "g")])  # fmt: skip
    assert rc == 2
    assert "--layers '7'" in capsys.readouterr().err
