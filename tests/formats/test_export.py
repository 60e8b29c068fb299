"""`draftsmith export` for every kind: DFlash round trips bit-exact from our layout and z-lab's
older one; a shared-embedding draft LM becomes a standalone transformers folder with the same
logits; MTP heads and unknown folders are refused in one line; everything written has plain modes."""

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import VOCAB, tiny_target

from draftsmith.cli import main
from draftsmith.drafters.dflash import DFlashModel, load_dflash, make_config
from draftsmith.drafters.eagle3 import Eagle3Model
from draftsmith.drafters.eagle3 import make_config as eagle3_config
from draftsmith.fileio import atomic_dir, atomic_write_text
from draftsmith.formats import vocab_order
from draftsmith.formats.export import export
from draftsmith.formats.kind import speculator_kind

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def umask_022():
    before = os.umask(0o022)
    yield
    os.umask(before)


def assert_plain_modes(root: Path) -> None:
    """Folders 0o755 and files 0o644 (open()/mkdir() under umask 022), the root included."""
    for p in [root, *root.rglob("*")]:
        want = 0o755 if p.is_dir() else 0o644
        assert stat.S_IMODE(p.stat().st_mode) == want, (p, oct(p.stat().st_mode))


def _dflash(tmp_path, dtype=torch.float32) -> tuple:
    t = tiny_target("qwen3")
    torch.manual_seed(0)
    cfg = make_config(t.model.config, layers=1, block_size=8, mask_token_id=5, target_layer_ids=[1])
    m = DFlashModel(cfg, t.model.get_input_embeddings(), t.model.get_output_embeddings()).to(dtype)
    m.save(tmp_path / "src", extra={"kind": "dflash", "target": "tiny-qwen3"})
    return t, tmp_path / "src"


def _load(t, path):
    return load_dflash(path, t.model.get_input_embeddings(), t.model.get_output_embeddings()).state_dict()


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_dflash_round_trips_bit_exact(tmp_path, fmt):
    t, src = _dflash(tmp_path, torch.bfloat16)
    vocab_order.save(src, torch.arange(t.vocab_size).flip(0), as_json=True)
    what, serve = export(src, tmp_path / "out", fmt)
    dst = tmp_path / "out"
    assert torch.equal(vocab_order.load(dst), vocab_order.load(src))  # `dflash:OUT:vocab=N` works too
    assert [f.name for f in dst.glob("*.safetensors")] == ["model.safetensors"]
    assert what == "DFlash" and speculator_kind(dst) == "dflash"
    a, b = load_file(str(src / "model.safetensors")), load_file(str(dst / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    assert json.loads((dst / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    assert json.loads((dst / "draftsmith.json").read_text())["exported_as"] == fmt
    again, before = _load(t, dst), _load(t, src)
    assert all(torch.equal(v, again[k]) for k, v in before.items())
    assert any('"method": "dflash", "num_speculative_tokens": 7' in s for s in serve)  # B - 1
    assert any("--speculative-algorithm DFLASH" in s for s in serve)
    assert_plain_modes(dst)
    assert_plain_modes(src)  # save_checkpoint_dir's files too


def test_dflash_normalises_an_older_published_layout(tmp_path):
    """z-lab's -b16 style: `model.` prefixes, block_size only at the top level, no target_layer_ids
    (the published default for one draft layer), an auto_map whose code is not in the folder."""
    t, src = _dflash(tmp_path)
    ours = load_file(str(src / "model.safetensors"))
    save_file({f"model.{k}": v for k, v in ours.items()}, str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["dflash_config"] = {"mask_token_id": 5}
    cfg["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    (src / "config.json").write_text(json.dumps(cfg))
    export(src, tmp_path / "out", "vllm")
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert out["dflash_config"] == {"block_size": 8, "mask_token_id": 5, "target_layer_ids": [1]}
    assert "auto_map" not in out and out["architectures"] == ["DFlashDraftModel"]
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert back.keys() == ours.keys() and all(torch.equal(back[k], v) for k, v in ours.items())
    again, before = _load(t, tmp_path / "out"), _load(t, src)
    assert all(torch.equal(v, again[k]) for k, v in before.items())


@pytest.mark.parametrize("fmt,layout", [("vllm", "shared"), ("sglang", "shared"), ("vllm", "full")])
def test_draft_lm_exports_a_standalone_folder(tmp_path, tiny_checkpoint, capsys, fmt, layout):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.fileio import save_checkpoint_dir
    from draftsmith.formats.draft_lm_format import build_shared, load_shared, save_shared
    from draftsmith.target.model import load_target

    target = load_target(tiny_checkpoint, "float32")
    config = target.model.config.__class__.from_dict(target.model.config.to_dict() | {"num_hidden_layers": 1})
    torch.manual_seed(0)
    draft = build_shared(config, target.model, torch.float32).eval()
    src, dst = tmp_path / "src", tmp_path / "out"
    meta = {"target_spec": tiny_checkpoint}
    if layout == "shared":
        save_shared(draft, src, meta, torch.float32)
        assert "model.embed_tokens.weight" not in load_file(str(src / "model.safetensors"))
        draft = load_shared(src, target.model, torch.float32)
    else:  # its own embedding (`--hidden`): already whole, but without the target's tokenizer
        state = {k: v for k, v in draft.state_dict().items() if k != "lm_head.weight"}  # tied
        save_checkpoint_dir(src, state, config.to_dict(), {"kind": "draft-lm", **meta})

    assert main(["export", "--format", fmt, str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    assert '"method": "draft_model"' in out and "--speculative-algorithm STANDALONE" in out
    assert "assistant_model" in out
    assert speculator_kind(dst) == "draft-lm"
    assert json.loads((dst / "draftsmith.json").read_text())["shares_target_embedding"] is False
    full = AutoModelForCausalLM.from_pretrained(dst).eval()
    ids = torch.tensor([[1, 5, 9, 30, 2, 17]])
    with torch.no_grad():
        assert torch.equal(full(ids).logits, draft(ids).logits)
    assert AutoTokenizer.from_pretrained(dst).get_vocab() == target.tokenizer.get_vocab()
    assert_plain_modes(dst)


def test_eagle3_export_has_plain_modes(tmp_path):
    t = tiny_target("llama")
    m = Eagle3Model(
        eagle3_config(t.model.config, 50, feature_layers=[0, 0, 1]), t.model.get_input_embeddings()
    )
    m.set_vocab_map(torch.arange(VOCAB).flip(0)[:50])
    m.save(tmp_path / "src", extra={"target": "smollm2-135m"})
    for fmt in ("sglang", "vllm"):
        what, serve = export(tmp_path / "src", tmp_path / fmt, fmt, k=4)
        assert what == "EAGLE-3" and len(serve) == 1 and ("EAGLE3" in serve[0] or '"eagle3"' in serve[0])
        assert "HuggingFaceTB/SmolLM2-135M-Instruct" in serve[0]
        assert_plain_modes(tmp_path / fmt)


def test_writers_respect_the_umask(tmp_path):
    os.umask(0o027)
    atomic_write_text(tmp_path / "a" / "f.txt", "x")
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "g.txt").write_text("y")
    assert stat.S_IMODE((tmp_path / "a" / "f.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporaries left


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftsmith: error:"), err
    return err[0]


def test_mtp_head_is_refused_in_one_line(tmp_path, capsys):
    src = tmp_path / "mtp"
    src.mkdir()
    (src / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    (src / "draftsmith.json").write_text(json.dumps({"target": "smollm2-135m", "steps": 3}))
    save_file(
        {"mtp.fc.weight": torch.zeros(4, 8), "mtp.norm.weight": torch.ones(4)}, str(src / "model.safetensors")
    )
    assert main(["export", "--format", "vllm", str(src), str(tmp_path / "out")]) == 2
    line = _one_error_line(capsys)
    assert "MTP head" in line and f"--drafter mtp:{src}" in line
    assert not (tmp_path / "out").exists()


def test_unknown_folder_is_refused_in_one_line(tmp_path, capsys):
    src = tmp_path / "plain"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert main(["export", "--format", "sglang", str(src), str(tmp_path / "out")]) == 2
    line = _one_error_line(capsys)
    assert str(src) in line and "EAGLE-3, DFlash and draft-LM" in line
