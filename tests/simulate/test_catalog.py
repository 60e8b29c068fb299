"""Model shapes: the catalog matches the sizes in the models' names, and any HF config reads the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.errors import UserError
from draftsmith.simulate.catalog import CATALOG, load_model, shape_from_config

# Total parameters implied by the names (billions); the catalog must land within 5%.
NAMED_SIZES = {
    "smollm2-135m": 0.135,
    "llama-3.1-8b": 8.03,
    "llama-3.3-70b": 70.6,
    "qwen3-8b": 8.19,
    "qwen3-32b": 32.8,
    "qwen3-30b-a3b": 30.5,
    "qwen3.5-4b": 4.2,
    "qwen3.5-9b": 8.95,
    "qwen3.5-27b": 27,
    "qwen3.5-35b-a3b": 35,
    "qwen3.5-122b-a10b": 122,
    "qwen3.5-397b-a17b": 397,
    "qwen3.6-35b-a3b": 35,
    "deepseek-v3": 671,
    "deepseek-r1": 671,
    "kimi-k2.5": 1040,  # Moonshot: 1.04T total, 32B active
    "kimi-k2.6": 1040,
    "minimax-m2.5": 229,
    "llama-4-scout-17b-16e": 109,  # with its vision tower, which text decoding never runs
}


def test_catalog_covers_the_issue_list_and_cites_sources() -> None:
    assert set(NAMED_SIZES) <= set(CATALOG)
    for name in CATALOG:
        m = load_model(name)
        assert m.source.startswith("https://huggingface.co/") and m.source.endswith("/config.json")


@pytest.mark.parametrize("name", sorted(NAMED_SIZES))
def test_total_params_match_the_name(name: str) -> None:
    m = load_model(name)
    assert m.total_params / 1e9 == pytest.approx(NAMED_SIZES[name], rel=0.05)


def test_active_params_of_moe_models() -> None:
    # A3B / A10B / A17B / 37B active, within what the embedding row and rounding explain.
    assert load_model("qwen3-30b-a3b").active_params / 1e9 == pytest.approx(3.3, rel=0.1)
    assert load_model("qwen3.5-122b-a10b").active_params / 1e9 == pytest.approx(10, rel=0.12)
    assert load_model("deepseek-v3").active_params / 1e9 == pytest.approx(37, rel=0.05)
    assert load_model("kimi-k2.6").active_params / 1e9 == pytest.approx(32, rel=0.05)
    assert load_model("minimax-m2.5").active_params / 1e9 == pytest.approx(10, rel=0.05)
    assert load_model("llama-4-scout-17b-16e").active_params / 1e9 == pytest.approx(17, rel=0.06)


def test_llama4_shared_expert_and_kimi_mla() -> None:
    scout = load_model("llama-4-scout-17b-16e")
    assert (scout.num_experts, scout.experts_per_token, scout.num_moe_layers) == (16, 1, 48)
    assert scout.shared_intermediate == scout.moe_intermediate == 8192
    kimi = load_model("kimi-k2.6")
    assert kimi.is_mla and kimi.num_heads == 64 and kimi.num_dense_layers == 1 and kimi.num_experts == 384


def test_llama_kv_bytes_per_token_by_hand() -> None:
    # 32 layers * (K and V) * 8 KV heads * 128 dims * 2 bytes
    assert load_model("llama-3.1-8b").kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2


def test_hybrid_and_mla_caches() -> None:
    q = load_model("qwen3.5-9b")
    assert (q.num_layers, q.num_linear_layers, q.num_attention_layers) == (32, 24, 8)
    assert q.kv_bytes_per_token() == 8 * 2 * 4 * 256 * 2  # only the 8 full-attention layers cache KV
    assert q.linear_state_elems > 0
    d = load_model("deepseek-v3")
    assert d.kv_bytes_per_token() == 61 * (512 + 64) * 2  # one latent of kv_lora + rope dims per layer


def test_nested_text_config_file_reads_like_the_catalog(tmp_path: Path) -> None:
    _, cfg = CATALOG["qwen3.5-122b-a10b"]
    path = tmp_path / "Qwen3.5-122B-A10B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    from_file = load_model(str(path))
    from_dir = load_model(str(path.parent))
    cat = load_model("qwen3.5-122b-a10b")
    for m in (from_file, from_dir):
        assert (m.num_experts, m.experts_per_token, m.moe_intermediate, m.shared_intermediate) == (
            256,
            8,
            1024,
            1024,
        )
        assert m.total_params == cat.total_params
        assert m.num_linear_layers == 36


def test_layer_types_list_and_mixtral_style_moe() -> None:
    cfg = {
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "intermediate_size": 128,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
    }
    m = shape_from_config(cfg, "tiny", "x")
    assert m.num_linear_layers == 2 and m.head_dim == 16 and m.attn_output_gate
    mix = shape_from_config(
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "vocab_size": 10,
            "intermediate_size": 96,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
        },
        "mixtral",
        "x",
    )
    assert mix.num_experts == 8 and mix.moe_intermediate == 96 and mix.intermediate == 0


def test_smollm2_matches_the_local_checkpoint_config() -> None:
    from draftsmith.simulate.hardware import cache_dir

    path = cache_dir() / "targets" / "smollm2-135m" / "config.json"
    if not path.is_file():
        pytest.skip("smollm2-135m not converted in the cache yet (scripts/setup.sh does it)")
    local = load_model(str(path))
    assert local.total_params == load_model("smollm2-135m").total_params


def test_bad_model_specs_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="catalog"):
        load_model("no-such-model")
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(UserError, match="lacks"):
        load_model(str(bad))
