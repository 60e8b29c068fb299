"""vLLM's `speculators` 0.9.0 (in .peers/speculators) validates and loads what `draftsmith export`
writes, with its own classes.

- EAGLE-3, `--format vllm --verifier DIR`: `SpeculatorModelConfig.from_pretrained` validates the
  config and `SpeculatorModel.from_pretrained` resolves it to `Eagle3DraftModel`; every tensor of
  ours loads bit-exact under its speculators name (`midlayer.*` -> `layers.0.*`), the embedding it
  fills from the verifier equals the target's, and the feature layers it reads are ours in vLLM's
  numbering (id j = the input of decoder layer j, ours + 1).
- DFlash: its `DFlashConverter` turns our z-lab-layout folder into its own format (with its own
  validation); the converted model's draft tensors equal ours and its aux layer ids are ours + 1.

The library does not generate (vLLM does, in test_vllm.py), so there is no output or acceptance
check here.
"""

from __future__ import annotations

import json

import pytest
import torch
from ecosystem import SHIPPED, deeper_checkpoint, record, run_program, venv_python
from safetensors.torch import load_file

from draftsmith.drafters.dflash import DFlashModel
from draftsmith.drafters.dflash import make_config as dflash_config
from draftsmith.drafters.eagle3 import Eagle3Model
from draftsmith.drafters.eagle3 import make_config as eagle3_config
from draftsmith.formats.eagle3_formats import read_eagle3_checkpoint
from draftsmith.formats.export import export
from draftsmith.target.model import load_target
from draftsmith.target.resolve import resolve_target

LIBRARY = "speculators 0.9.0"


def _eagle3(tmp_path, src, verifier: str, target, name: str) -> None:
    dst = tmp_path / "export"
    export(src, dst, "vllm", verifier=verifier, k=3)
    out = tmp_path / "out"
    out.mkdir()
    run_program("speculators", "speculators_check.py", "eagle3", dst, out)
    lib = json.loads((out / "result.json").read_text())
    loaded = load_file(str(out / "loaded.safetensors"))

    config, ours = read_eagle3_checkpoint(src)
    ids = list(config.eagle_config["eagle_aux_hidden_state_layer_ids"])
    config_ok = (
        lib["model_class"] == "Eagle3DraftModel"
        and lib["speculators_model_type"] == "eagle3"
        and lib["algorithm"] == "eagle3"
        and lib["speculative_tokens"] == [3]
        and lib["verifier"] == verifier
        and lib["draft_vocab_size"] == config.draft_vocab_size
        and lib["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]
    )
    named = {k.replace("midlayer.", "layers.0."): v for k, v in ours.items()}
    missing = sorted(set(named) - set(loaded))
    unequal = sorted(
        k
        for k in named
        if k in loaded and not (loaded[k].dtype == named[k].dtype and torch.equal(loaded[k], named[k]))
    )
    embed_ok = torch.equal(
        loaded["embed_tokens.weight"],
        target.model.get_input_embeddings().weight.to(loaded["embed_tokens.weight"].dtype),
    )
    weights_equal = not missing and not unequal and embed_ok and not lib["nan_tensors"]
    record(
        {
            "library": LIBRARY,
            "speculator": name,
            "config_ok": config_ok,
            "weights_equal": weights_equal,
            "tensors": len(named),
            "output_equal": None,
            "tau_library": None,
            "tau_ours": None,
            "note": "Eagle3DraftModel.from_pretrained; embed_tokens filled from the verifier equals the target's",
        }
    )
    assert config_ok, (lib, ids)
    assert not missing and not unequal, (missing, unequal)
    assert embed_ok and not lib["nan_tensors"], lib["nan_tensors"]


def _dflash(tmp_path, src, verifier: str, name: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dst = tmp_path / "export"
    export(src, dst, "vllm")
    run_program("speculators", "speculators_check.py", "dflash", dst, verifier, out)
    lib = json.loads((out / "result.json").read_text())
    loaded = load_file(str(out / "loaded.safetensors"))
    ours = load_file(str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())["dflash_config"]
    config_ok = (
        lib["model_class"] == "DFlashDraftModel"
        and lib["algorithm"] == "dflash"
        and lib["block_size"] == cfg["block_size"]
        and lib["speculative_tokens"] == [cfg["block_size"] - 1]
        and lib["aux_hidden_state_layer_ids"] == [i + 1 for i in cfg["target_layer_ids"]]
    )
    unequal = sorted(k for k in ours if k not in loaded or not torch.equal(loaded[k], ours[k]))
    weights_equal = not unequal and not lib["nan_tensors"]
    record(
        {
            "library": LIBRARY,
            "speculator": name,
            "config_ok": config_ok,
            "weights_equal": weights_equal,
            "tensors": len(ours),
            "output_equal": None,
            "tau_library": None,
            "tau_ours": None,
            "note": "DFlashConverter (z-lab layout -> speculators), then DFlashDraftModel.from_pretrained",
        }
    )
    assert config_ok, (lib, cfg)
    assert weights_equal, (unequal, lib["nan_tensors"])


@pytest.mark.slow
def test_shipped_smollm2_eagle3(tmp_path):
    venv_python("speculators")
    folder = resolve_target("smollm2-135m").model_path
    target = load_target("smollm2-135m", "bfloat16")
    _eagle3(tmp_path, SHIPPED / "smollm2-135m-eagle3", folder, target, "smollm2-135m-eagle3 (shipped)")


@pytest.mark.slow
def test_shipped_smollm2_dflash(tmp_path):
    venv_python("speculators")
    folder = resolve_target("smollm2-135m").model_path
    _dflash(tmp_path, SHIPPED / "smollm2-135m-dflash", folder, "smollm2-135m-dflash (shipped)")


def test_fabricated_tiny_eagle3(tmp_path, tiny_checkpoint):
    """A random EAGLE-3 over 40 draft tokens, for a four-layer copy of the tiny Llama checkpoint."""
    venv_python("speculators")
    verifier = deeper_checkpoint(tiny_checkpoint, tmp_path / "verifier", layers=4)
    target = load_target(verifier, "float32")
    torch.manual_seed(0)
    cfg = eagle3_config(target.model.config, 40, feature_layers=[0, 1, 2])
    m = Eagle3Model(cfg, target.model.get_input_embeddings())
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    m.set_vocab_map(torch.randperm(target.vocab_size)[:40])
    m.save(tmp_path / "src", extra={"target": verifier})
    _eagle3(tmp_path, tmp_path / "src", verifier, target, "tiny EAGLE-3 (fabricated)")


def test_fabricated_tiny_dflash(tmp_path, tiny_checkpoint):
    """A random two-layer DFlash for a four-layer copy of the tiny Llama checkpoint. Its feature layers
    stay below the last one: the converter drops a last-layer id (its training feeds that layer
    separately) and then refuses the wider `fc`; published drafters read layers 1..L-3."""
    venv_python("speculators")
    verifier = deeper_checkpoint(tiny_checkpoint, tmp_path / "verifier", layers=4)
    target = load_target(verifier, "float32")
    torch.manual_seed(0)
    cfg = dflash_config(target.model.config, layers=2, block_size=4, mask_token_id=0, target_layer_ids=[0, 2])
    m = DFlashModel(cfg, target.model.get_input_embeddings(), target.model.get_output_embeddings())
    m.save(tmp_path / "src", extra={"kind": "dflash", "target": verifier})
    _dflash(tmp_path, tmp_path / "src", verifier, "tiny DFlash (fabricated)")
