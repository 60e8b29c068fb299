"""EAGLE-3 export to SGLang and vLLM speculators layouts, and loading them back."""

import json

import pytest
import torch
from safetensors.torch import load_file
from tiny import tiny_target

from draftsmith.cli import main
from draftsmith.drafters.eagle3 import Eagle3Model, load_eagle3, make_config
from draftsmith.formats.eagle3_formats import export_eagle3


@pytest.fixture
def drafter(tmp_path):
    t = tiny_target("llama")
    torch.manual_seed(0)
    m = Eagle3Model(make_config(t.model.config, 50, feature_layers=[0, 0, 1]), t.model.get_input_embeddings())
    m.set_vocab_map(torch.arange(96).flip(0)[:50])
    m.save(tmp_path / "src", extra={"target": "smollm2-135m", "steps": 3})
    return t, m, tmp_path


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_round_trip(drafter, fmt):
    t, m, tmp = drafter
    dst = export_eagle3(tmp / "src", tmp / fmt, fmt, k=4)
    back = load_eagle3(dst, t.model.get_input_embeddings())
    for (k1, a), (k2, b) in zip(
        sorted(m.state_dict().items()), sorted(back.state_dict().items()), strict=True
    ):
        assert k1 == k2 and torch.equal(a, b)
    names = set(load_file(str(dst / "model.safetensors")))
    assert "embed_tokens.weight" not in names and {"fc.weight", "d2t", "t2d", "lm_head.weight"} <= names
    prefix = "midlayer." if fmt == "sglang" else "layers.0."
    assert any(n.startswith(prefix + "self_attn.q_proj") for n in names)


def test_vllm_config_fields(drafter):
    _, _, tmp = drafter
    cfg = json.loads((export_eagle3(tmp / "src", tmp / "v", "vllm", k=5) / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["draft_vocab_size"] == 50 and cfg["eagle_aux_hidden_state_layer_ids"] == [1, 1, 2]  # ours + 1
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["proposal_methods"][0]["speculative_tokens"] == 5
    assert spec["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1


def test_sglang_config_fields(drafter):
    _, _, tmp = drafter
    cfg = json.loads((export_eagle3(tmp / "src", tmp / "s", "sglang") / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["tie_word_embeddings"] is False
    assert cfg["draft_vocab_size"] == 50 and cfg["num_hidden_layers"] == 1


def test_export_cli_errors(drafter, capsys):
    _, _, tmp = drafter
    assert main(["export", "--format", "sglang", str(tmp / "src"), str(tmp / "out")]) == 0
    assert main(["export", "--format", "sglang", str(tmp / "src"), str(tmp / "out")]) == 2  # not empty
    assert main(["export", "--format", "vllm", str(tmp / "nope"), str(tmp / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("draftsmith: error:") for line in err)
