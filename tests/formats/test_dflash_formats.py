"""DFlash checkpoints in the published layout: fabricated z-lab-style (qwen3 target, top-level
block_size) and modal-labs-style (qwen3_5 hybrid target, dflash_config.block_size) drafters load and
run losslessly; the block forward matches a direct transcription of the published math; ours round
trip; what the model does not compute is refused."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import VOCAB, random_prompts, tiny_target

from draftsmith.decoding.engine import generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry
from draftsmith.drafters.dflash import DFlashModel, load_dflash, make_config
from draftsmith.errors import UserError


def _published(path, target, *, layers: int, ids: list[int], block_in_config: bool, seed: int = 0) -> None:
    """Write a drafter exactly as the hub repos lay it out (names, shapes, config keys, bf16)."""
    tc = target.config
    H, d, heads, kv, inter = tc.hidden_size, tc.head_dim, tc.num_attention_heads, tc.num_key_value_heads, 128
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.2).to(torch.bfloat16)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    state = {"fc.weight": w(H, len(ids) * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(layers):
        p = f"layers.{i}."
        state |= {
            p + "self_attn.q_proj.weight": w(heads * d, H),
            p + "self_attn.k_proj.weight": w(kv * d, H),
            p + "self_attn.v_proj.weight": w(kv * d, H),
            p + "self_attn.o_proj.weight": w(H, heads * d),
            p + "self_attn.q_norm.weight": norm(d),
            p + "self_attn.k_norm.weight": norm(d),
            p + "mlp.gate_proj.weight": w(inter, H),
            p + "mlp.up_proj.weight": w(inter, H),
            p + "mlp.down_proj.weight": w(H, inter),
            p + "input_layernorm.weight": norm(H),
            p + "post_attention_layernorm.weight": norm(H),
        }
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "head_dim": d,
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": inter,
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": 512,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "num_target_layers": tc.num_hidden_layers,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": VOCAB,
        "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": ids},
    }
    if block_in_config:  # newer drafters (modal-labs/Qwen3.5-*-DFlash)
        config["dflash_config"]["block_size"] = 8
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000000.0}
    else:  # z-lab/Qwen3-8B-DFlash-b16
        config |= {
            "block_size": 8,
            "rope_theta": 1000000.0,
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        }
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


CASES = {
    "qwen3": dict(layers=2, ids=[0, 1], block_in_config=False),
    "qwen3_5": dict(layers=1, ids=[1, 3], block_in_config=True),
}


def _reference_block_logits(state, cfg, target, ctx_feats, last, pos0):
    """The published forward written out directly: fused context through each layer's k/v
    projections (no input norm), k_norm on context and block keys, RoPE at absolute positions,
    no attention mask, final norm and the target's head on slots 1..B-1."""
    B = 8
    d, heads, kvh, eps = (
        cfg["head_dim"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["rms_norm_eps"],
    )
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    S = {k: v.float() for k, v in state.items()}

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wt

    def rope(x, pos):  # x [n, h, d]
        inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
        ang = pos.float()[:, None] * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
        rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * cos + rot * sin

    n = ctx_feats.shape[0]
    c = rms(ctx_feats.flatten(1) @ S["fc.weight"].t(), S["hidden_norm.weight"])
    ids = torch.tensor([last] + [VOCAB - 1] * (B - 1))
    h = target.model.get_input_embeddings().weight[ids].float()
    pc, pb = torch.arange(n), torch.arange(pos0, pos0 + B)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms(h, S[p + "input_layernorm.weight"])
        q = rope(
            rms(
                (x @ S[p + "self_attn.q_proj.weight"].t()).view(B, heads, d), S[p + "self_attn.q_norm.weight"]
            ),
            pb,
        )
        kn = S[p + "self_attn.k_norm.weight"]
        k = torch.cat(
            [
                rope(rms((c @ S[p + "self_attn.k_proj.weight"].t()).view(n, kvh, d), kn), pc),
                rope(rms((x @ S[p + "self_attn.k_proj.weight"].t()).view(B, kvh, d), kn), pb),
            ]
        )
        v = torch.cat([c, x]) @ S[p + "self_attn.v_proj.weight"].t()
        v = v.view(n + B, kvh, d)
        k, v = k.repeat_interleave(heads // kvh, 1), v.repeat_interleave(heads // kvh, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / d**0.5, -1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(B, heads * d)
        h = h + o @ S[p + "self_attn.o_proj.weight"].t()
        m = rms(h, S[p + "post_attention_layernorm.weight"])
        gate, up = m @ S[p + "mlp.gate_proj.weight"].t(), m @ S[p + "mlp.up_proj.weight"].t()
        h = h + (torch.nn.functional.silu(gate) * up) @ S[p + "mlp.down_proj.weight"].t()
    h = rms(h, S["norm.weight"])
    return (h @ target.model.get_output_embeddings().weight.float().t())[1:]


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_5"])
def test_published_layout_loads_matches_the_math_and_is_lossless(tmp_path, kind):
    t = tiny_target(kind)
    case = CASES[kind]
    _published(tmp_path / "d", t, **case)
    f = registry.build(f"dflash:{tmp_path / 'd'}")
    f.bind(t, SamplingParams())
    m = f.model
    assert m.block_size == 8 and m.mask_token_id == VOCAB - 1 and list(f.needs_features) == case["ids"]

    # the block forward equals the published math (float32 drafter on the float32 target)
    m.float()
    prompt = random_prompts(1, seed=2)[0]
    with torch.no_grad():
        hs = t.model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    feats = torch.stack([hs[i + 1][0] for i in case["ids"]], dim=1)
    d = f()
    d.start(prompt, feats)
    d.commit([7], feats[:0])
    got = d.block_logits()
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    want = _reference_block_logits(
        load_file(str(tmp_path / "d" / "model.safetensors")), cfg, t, feats, 7, len(prompt)
    )
    assert torch.allclose(got, want, atol=1e-3, rtol=1e-3)

    prompts = random_prompts(2, seed=4)
    ar = generate(t, None, prompts, max_new_tokens=16)
    out = generate(t, registry.build(f"dflash:{tmp_path / 'd'}"), prompts, k=7, max_new_tokens=16)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]


def test_missing_target_layer_ids_use_the_published_default(tmp_path):
    t = tiny_target("qwen3_5")
    _published(tmp_path / "d", t, layers=1, ids=[1], block_in_config=True)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    del cfg["dflash_config"]["target_layer_ids"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    m = load_dflash(tmp_path / "d", t.model.get_input_embeddings(), t.model.get_output_embeddings())
    assert m.target_layer_ids == [2]  # one feature layer: num_target_layers // 2


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_5"])
def test_ours_round_trip_in_the_published_layout(tmp_path, kind):
    t = tiny_target(kind)
    torch.manual_seed(0)
    cfg = make_config(t.model.config, layers=2, block_size=8, mask_token_id=5, target_layer_ids=[0, 1])
    m = DFlashModel(cfg, t.model.get_input_embeddings(), t.model.get_output_embeddings())
    m.save(tmp_path / "d")
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["model_type"] == "qwen3"
    assert raw["dflash_config"] == {"block_size": 8, "mask_token_id": 5, "target_layer_ids": [0, 1]}
    assert (
        raw["block_size"] == 8 and raw["num_target_layers"] == t.num_layers and raw["num_hidden_layers"] == 2
    )
    assert raw["hidden_size"] == t.config.hidden_size and raw["layer_types"] == ["full_attention"] * 2
    assert (
        raw["rope_parameters"]["rope_type"] == "default"
        and "partial_rotary_factor" not in raw["rope_parameters"]
    )
    state = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert state["fc.weight"].shape == (64, 2 * 64) and not any("embed" in k or "lm_head" in k for k in state)
    again = load_dflash(tmp_path / "d", t.model.get_input_embeddings(), t.model.get_output_embeddings())
    for k, v in m.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


def test_refuses_what_it_does_not_compute(tmp_path):
    t = tiny_target("qwen3")
    embed, head = t.model.get_input_embeddings(), t.model.get_output_embeddings()
    with pytest.raises(UserError, match="no DFlash checkpoint"):
        load_dflash(tmp_path / "missing", embed, head)
    _published(tmp_path / "d", t, layers=1, ids=[0], block_in_config=True)
    cfg_file = tmp_path / "d" / "config.json"
    base = json.loads(cfg_file.read_text())
    for change, match in [
        ({"architectures": ["DFlash2DraftModel"]}, "not a DFlash drafter"),
        ({"dflash_config": base["dflash_config"] | {"selector_rank": 256}}, "selector_rank"),
        ({"layer_types": ["sliding_attention"], "sliding_window": 16}, "sliding"),
        ({"dflash_config": {"target_layer_ids": [0]}}, "mask_token_id"),
        ({"vocab_size": VOCAB + 4}, "vocabulary"),
    ]:
        cfg_file.write_text(json.dumps(base | change))
        with pytest.raises(UserError, match=match):
            load_dflash(tmp_path / "d", embed, head)
