"""MTP drafter on tiny fabricated Qwen3.5 checkpoints whose safetensors carry `mtp.*` tensors in the
layout Qwen ships (dense: inside `model.safetensors`; MoE: a second shard named by the index, experts
one per index), plus heads built for a target without one (Llama) and saved in the same layout.

Float32 throughout, so greedy ties cannot flip between plain and speculative decoding.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tiny import CONFIGS, VOCAB, assert_target_law, random_prompts, tiny_model, tiny_target
from transformers import AutoConfig, AutoModelForCausalLM

from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry
from draftsmith.drafters.mtp import build_head, load_head, save_head
from draftsmith.errors import UserError
from draftsmith.formats.mtp_formats import read_mtp_tensors, to_checkpoint_layout, to_module_layout
from draftsmith.target.model import FINAL_HIDDEN, Target

MOE = dict(
    CONFIGS["qwen3_5"],
    model_type="qwen3_5_moe_text",
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)


def _model(kind: str, seed: int, vocab: int = VOCAB, scale: float = 1.0):
    if kind != "qwen3_5_moe":
        return tiny_model(kind, seed=seed, scale=scale, vocab=vocab)
    cfg = dict(MOE, vocab_size=vocab)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model.eval()


def _fabricate_head(target: Target, seed: int) -> dict[str, torch.Tensor]:
    """Random `mtp.*` tensors in checkpoint layout; norm weights away from 0 so 1 + w matters."""
    head = build_head(target, std=0.15, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return to_checkpoint_layout(head.state_dict())


def make_checkpoint(
    path, kind: str = "qwen3_5", seed: int = 0, vocab: int = VOCAB, scale: float = 1.0, head=True
):
    """A checkpoint folder as Qwen ships it: the model's tensors and, when `head`, the `mtp.*` ones."""
    model = _model(kind, seed, vocab, scale)
    model.save_pretrained(path)
    if not head:
        return str(path)
    target = Target(model, tokenizer=None, name=f"tiny-{kind}")
    mtp = _fabricate_head(target, seed + 100)
    if kind == "qwen3_5":  # one file holding both
        state = load_file(str(path / "model.safetensors"))
        save_file({**state, **mtp}, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:  # two shards and an index, the MTP tensors in the second
        main = "model-00001-of-00002.safetensors"
        extra = "model-00002-of-00002.safetensors"
        (path / "model.safetensors").rename(path / main)
        save_file(mtp, str(path / extra), metadata={"format": "pt"})
        weight_map = {k: main for k in load_file(str(path / main))} | {k: extra for k in mtp}
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    return str(path)


def load(path) -> Target:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return Target(model.eval(), tokenizer=None, name=str(path))


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3_5-mtp"), "qwen3_5")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3_5_moe-mtp"), "qwen3_5_moe", seed=1)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def test_native_head_step_matches_the_formula(dense):
    """At the first position the one key is the only one, so attention returns its (gated) value and
    the whole step can be written from the raw tensors: checks names, [emb ; hidden] order, 1 + w."""
    t = load(dense)
    w = read_mtp_tensors(dense)
    assert "fc.weight" in w and w["fc.weight"].shape == (64, 128)
    head = load_head(t)
    cfg, eps = t.config, t.config.rms_norm_eps
    tok, h = 7, torch.randn(64)
    e = t.model.get_input_embeddings().weight[tok]
    x = w["fc.weight"] @ torch.cat(
        [_rms(e, w["pre_fc_norm_embedding.weight"], eps), _rms(h, w["pre_fc_norm_hidden.weight"], eps)]
    )
    a = _rms(x, w["layers.0.input_layernorm.weight"], eps)
    heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    gate = (w["layers.0.self_attn.q_proj.weight"] @ a).view(heads, 2 * hd)[:, hd:]
    v = (w["layers.0.self_attn.v_proj.weight"] @ a).view(kv, hd).repeat_interleave(heads // kv, 0)
    x = x + w["layers.0.self_attn.o_proj.weight"] @ (v * torch.sigmoid(gate)).reshape(-1)
    m = _rms(x, w["layers.0.post_attention_layernorm.weight"], eps)
    mlp = w["layers.0.mlp.down_proj.weight"] @ (
        F.silu(w["layers.0.mlp.gate_proj.weight"] @ m) * (w["layers.0.mlp.up_proj.weight"] @ m)
    )
    want_h = _rms(x + mlp, w["norm.weight"], eps)
    with torch.no_grad():
        logits, got_h = head(torch.tensor([[tok]]), h[None, None], torch.tensor([[0]]))
    assert torch.allclose(got_h[0, 0], want_h, atol=1e-5)
    assert torch.allclose(logits[0, 0], t.head.weight @ want_h, atol=1e-4)


def test_moe_experts_read_per_index(moe):
    t = load(moe)
    raw = read_mtp_tensors(moe)
    head = load_head(t)
    fused = head.layers[0].mlp.experts
    e2 = torch.cat(
        [raw["layers.0.mlp.experts.2.gate_proj.weight"], raw["layers.0.mlp.experts.2.up_proj.weight"]]
    )
    assert torch.equal(fused.gate_up_proj[2], e2)
    assert torch.equal(fused.down_proj[3], raw["layers.0.mlp.experts.3.down_proj.weight"])
    assert "layers.0.mlp.shared_expert_gate.weight" in raw
    assert to_checkpoint_layout(head.state_dict()).keys() == {"mtp." + k for k in raw}
    assert to_module_layout(raw).keys() == head.state_dict().keys()


def test_final_hidden_feature_is_what_the_lm_head_reads(dense):
    t = load(dense)
    ids = torch.tensor([random_prompts(1, seed=2)[0]])
    cache = t.new_cache(1, 64)
    out = t.forward(cache, ids, feature_layers=(FINAL_HIDDEN, 1))
    assert out.features.shape == (1, ids.shape[1], 2, 64)
    with torch.inference_mode():
        assert torch.allclose(t.head(out.features[:, :, 0]).float(), out.logits, atol=1e-5)


def test_incremental_drafting_equals_recompute(dense):
    """Paired positions computed across start/commit, with rejected speculative keys in between, equal
    one causal pass over all of them."""
    t = load(dense)
    factory = registry.build("mtp")
    factory.bind(t, SamplingParams())
    d = factory()
    prompt = random_prompts(1, seed=3)[0]
    seq = prompt + [5, 6, 7, 8, 9]
    with torch.no_grad():
        feats = t.model.model(input_ids=torch.tensor([seq])).last_hidden_state[0][:, None]  # [len, 1, H]
    n = len(prompt)
    d.start(prompt, feats[:n])
    d.commit([seq[n]], feats[:0])
    d.propose(4)  # speculative keys past the frontier must not leak into what follows
    d.commit(seq[n + 1 : n + 3], feats[n : n + 2])
    d.propose(3)
    d.commit(seq[n + 3 : n + 5], feats[n + 2 : n + 4])
    pairs = n + 4
    with torch.no_grad():
        logits, _ = factory.head(
            torch.tensor([seq[1 : pairs + 1]]), feats[:pairs, 0][None], torch.arange(pairs)[None]
        )
    assert torch.allclose(d.last[0], logits[0, -1], atol=1e-4)


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_greedy_with_mtp_equals_plain(which, request):
    t = load(request.getfixturevalue(which))
    prompts = random_prompts(2, seed=5, hi=12)
    ar = generate(t, None, prompts, max_new_tokens=12)
    out = generate(t, registry.build("mtp"), prompts, k=3, max_new_tokens=12)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    assert sum(DecodeStats.combined(r.stats for r in out).proposed) > 0


def test_hybrid_rollback_with_mixed_acceptance(tmp_path):
    """A small, peaked vocabulary so the random head is sometimes right: steps accept some drafts and
    reject others, and the target's recurrent state is restored and replayed after each rejection."""
    t = load(make_checkpoint(tmp_path / "c", "qwen3_5", seed=4, vocab=8, scale=6.0))
    prompts = random_prompts(2, seed=6, hi=8)
    prompts = [[x % 8 for x in p] for p in prompts]
    ar = generate(t, None, prompts, max_new_tokens=24)
    out = generate(t, registry.build("mtp"), prompts, k=4, max_new_tokens=24)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    stats = DecodeStats.combined(r.stats for r in out)
    assert 0 < sum(stats.accepted) < sum(stats.proposed)


def test_sampling_with_mtp_keeps_target_law(tmp_path):
    """With 4 new tokens the first step drafts 2 (one slot stays for the target's own token), so new
    tokens 2 and 3 come out of draft -> min(1, p/q) -> resample or bonus, the third drafted from the
    head's own h'. Their frequencies over 1500 rows must match the exact marginals of the target."""
    vocab, rows = 10, 1500
    t = load(make_checkpoint(tmp_path / "c", "qwen3_5", seed=2, vocab=vocab, scale=4.0))
    sampling = SamplingParams(temperature=1.0, top_k=6, seed=11)
    prompt = [1, 5, 7]
    out = generate(t, registry.build("mtp"), [prompt] * rows, k=3, sampling=sampling, max_new_tokens=4)
    assert_target_law(t, prompt, sampling, out)


def test_no_head_is_a_clear_error(tmp_path):
    t = load(make_checkpoint(tmp_path / "plain", "qwen3_5", head=False))
    with pytest.raises(UserError, match="has no MTP head"):
        registry.build("mtp").bind(t, SamplingParams())
    with pytest.raises(UserError, match="has no MTP head"):
        registry.build("mtp").bind(tiny_target("llama"), SamplingParams())  # built in memory, no folder
    with pytest.raises(UserError, match="no MTP head at"):
        registry.build(f"mtp:{tmp_path / 'missing'}").bind(t, SamplingParams())


def test_head_for_a_target_without_one_round_trips(tmp_path):
    """Item 2's model side: a head built for Llama (from its last layer), saved as `mtp.*`, read back
    through `mtp:PATH`, and lossless in the engine."""
    t = tiny_target("llama")
    head = build_head(t, init="last_layer")
    assert torch.equal(head.layers[0].mlp.up_proj.weight, t.base.layers[-1].mlp.up_proj.weight)
    save_head(head, tmp_path / "h", t.config, extra={"target": t.name})
    keys = read_mtp_tensors(tmp_path / "h").keys()
    assert {"fc.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= keys
    assert json.loads((tmp_path / "h" / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    again = load_head(t, tmp_path / "h")
    for (k, a), (k2, b) in zip(
        sorted(head.state_dict().items()), sorted(again.state_dict().items()), strict=True
    ):
        assert k == k2 and torch.equal(a, b)
    prompts = random_prompts(3, seed=8)
    ar = generate(t, None, prompts, max_new_tokens=16)
    out = generate(t, registry.build(f"mtp:{tmp_path / 'h'}"), prompts, k=4, max_new_tokens=16)
    assert [r.token_ids for r in out] == [r.token_ids for r in ar]


def test_head_for_another_target_is_refused(tmp_path):
    save_head(build_head(tiny_target("llama")), tmp_path / "h", tiny_target("llama").config)
    with pytest.raises(UserError, match="does not fit target"):
        load_head(tiny_target("qwen3"), tmp_path / "h")


def test_cli_mtp_on_a_folder(capsys, tiny_checkpoint, tmp_path):
    """Through `draftsmith generate`: a target folder without a head is one line and exit 2; a head
    saved for it and passed as mtp:PATH gives the same tokens as plain decoding."""
    from draftsmith.cli import main
    from draftsmith.target.model import load_target

    base = ["generate", "--target", tiny_checkpoint, "--dtype", "float32", "--json", "--max-new-tokens", "24"]
    assert main([*base, "--drafter", "mtp", "abc"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no MTP head" in err and len(err.splitlines()) == 1
    t = load_target(tiny_checkpoint, dtype="float32")
    save_head(build_head(t, init="last_layer"), tmp_path / "h", t.config)
    outs = {}
    for drafter in ("ar", f"mtp:{tmp_path / 'h'}"):
        assert main([*base, "--drafter", drafter, "--k", "3", "hello hello"]) == 0
        outs[drafter] = json.loads(capsys.readouterr().out)["token_ids"]
    assert len(set(map(tuple, outs.values()))) == 1
