"""The lean forward (`target/lean_decoder.py`) computes what transformers' modules compute: logits
and hidden states for prefill, ragged verification and tree forwards, uncompiled and compiled; and
speculative decoding through the compiled path equals plain decoding (float32)."""

import pytest
import torch
from tiny import OracleFactory, TreeOracleFactory, random_prompts, tiny_model, tiny_target
from transformers import AutoConfig, AutoModelForCausalLM

from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.errors import UserError
from draftsmith.target import lean_decoder
from draftsmith.target.model import FINAL_HIDDEN, Target
from draftsmith.target.quantize import quantize_int8

pytestmark = pytest.mark.usefixtures("one_thread")


def _qwen2_with_bias() -> Target:
    cfg = AutoConfig.for_model(
        "qwen2", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, use_sliding_window=False,
    )  # fmt: skip
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_()  # transformers starts biases at 0
    return Target(model, tokenizer=None, name="tiny-qwen2")


def _forwards(t: Target, lean: bool):
    """Prefill of two rows, a ragged 4-token verification, a 1-token step and a tree forward."""
    t.lean_ok = lean
    cache = t.new_cache(3, 64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 96, (3, 9), generator=g)
    outs = [t.forward(cache, ids[:2], rows=torch.tensor([2, 0]), feature_layers=(0, 1, FINAL_HIDDEN))]
    outs.append(t.forward(cache, ids[2:, :5], rows=torch.tensor([1])))  # prefill groups: rows by index
    cache.advance(2, 9)
    cache.advance(0, 9)
    cache.advance(1, 5)  # ragged from here on
    ids = ids[[2, 0, 1]]
    outs.append(t.forward(cache, ids[:, :4], logit_index=torch.tensor([3, 1, 0]), feature_layers=(1,)))
    outs.append(t.forward(cache, ids[:, :1]))
    depth = torch.tensor([[0, 1, 1, 2]] * 3)
    anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    outs.append(t.forward(cache, ids[:, 4:8], tree=(depth, anc.expand(3, 4, 4))))
    return outs


def _assert_same(t: Target):
    stock, lean = _forwards(t, False), _forwards(t, True)
    for s, f in zip(stock, lean, strict=True):
        torch.testing.assert_close(f.logits, s.logits, rtol=1e-4, atol=1e-4)
        if s.features is not None:
            torch.testing.assert_close(f.features, s.features, rtol=1e-4, atol=1e-4)


def test_supported_architectures():
    assert lean_decoder.supports(tiny_model("llama")) and lean_decoder.supports(tiny_model("qwen3"))
    assert not lean_decoder.supports(tiny_model("qwen3_moe"))  # experts: transformers' modules
    assert not lean_decoder.supports(tiny_model("qwen3_5"))  # linear attention


@pytest.mark.parametrize(
    "make", [lambda: tiny_target("llama"), lambda: tiny_target("qwen3"), _qwen2_with_bias]
)
def test_lean_forward_equals_transformers(make):
    t = make()
    assert t.path == "lean"  # the suite runs it uncompiled (tests/conftest.py)
    _assert_same(t)


def test_compiled_forward_equals_transformers(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_COMPILE", "1")
    t = tiny_target("llama")
    assert t.path == "lean-compiled"
    _assert_same(t)


def test_compiled_speculative_decoding_equals_plain(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_COMPILE", "1")
    t = tiny_target("llama", seed=5)
    prompts = random_prompts(3, seed=4)
    ar = generate(t, None, prompts, max_new_tokens=24)
    refs = {tuple(p): r.token_ids for p, r in zip(prompts, ar, strict=True)}
    chain = generate(t, OracleFactory(refs, noise=0.3, seed=1), prompts, k=5, max_new_tokens=24)
    tree = generate(t, TreeOracleFactory(refs, width=3, noise=0.3, seed=2), prompts, k=4, max_new_tokens=24)
    for out in (chain, tree):
        assert [r.token_ids for r in out] == [r.token_ids for r in ar]
    assert DecodeStats.combined(r.stats for r in chain).tau > 1.3
    t.lean_ok = False  # and the stock path agrees with both
    assert [r.token_ids for r in generate(t, None, prompts, max_new_tokens=24)] == [r.token_ids for r in ar]


@pytest.mark.parametrize("compiled", ["0", "1"])
def test_long_prefill_through_sdpa_equals_transformers(monkeypatch, compiled):
    # Past PREFILL_SDPA_MIN query x key pairs attention is SDPA's; lowered here so the tiny forwards
    # (prefill and verification) take that branch while one-token steps keep the grouped products.
    monkeypatch.setattr(lean_decoder, "PREFILL_SDPA_MIN", 40)
    monkeypatch.setenv("DRAFTSMITH_COMPILE", compiled)
    _assert_same(tiny_target("llama"))


def test_switch_off_takes_the_stock_path(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_FAST", "0")
    assert tiny_target("llama").path == "stock"


def test_int8_target_is_exact_against_itself_and_close_to_its_dequantized_weights(monkeypatch):
    """`--quantize int8`: the lean forward equals transformers on the dequantized weights (q * scale),
    and speculative decoding through the compiled int8 path equals plain int8 decoding."""
    monkeypatch.setenv("DRAFTSMITH_COMPILE", "1")
    model = tiny_model("llama", seed=7, scale=4.0)
    q8 = Target(model, tokenizer=None, name="tiny-int8", quantize="int8")
    assert q8.path == "lean-compiled-int8"
    ref = tiny_model("llama", seed=7, scale=4.0)
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.Linear):
                q, scale = quantize_int8(m.weight)
                m.weight.copy_(q.float() * scale[:, None])
    deq = Target(ref, tokenizer=None, name="tiny-dequantized")
    deq.lean_ok = False
    cache_a, cache_b = q8.new_cache(1, 32), deq.new_cache(1, 32)
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        q8.forward(cache_a, ids).logits, deq.forward(cache_b, ids).logits, rtol=1e-4, atol=1e-4
    )

    prompts = random_prompts(3, seed=9)
    ar = generate(q8, None, prompts, max_new_tokens=20)
    refs = {tuple(p): r.token_ids for p, r in zip(prompts, ar, strict=True)}
    spec = generate(q8, OracleFactory(refs, noise=0.3, seed=3), prompts, k=4, max_new_tokens=20)
    assert [r.token_ids for r in spec] == [r.token_ids for r in ar]


def test_int8_refused_where_the_lean_forward_does_not_run():
    with pytest.raises(UserError, match="--quantize int8 needs the lean CPU forward"):
        Target(tiny_model("qwen3_moe"), tokenizer=None, name="tiny-moe", quantize="int8")


def test_prefill_into_empty_rows_takes_the_causal_kernel(monkeypatch):
    """A prefill into empty rows asks SDPA for `is_causal` (it skips the blocks above the diagonal)
    instead of passing the mask; any forward over cached keys passes its mask."""
    monkeypatch.setattr(lean_decoder, "PREFILL_SDPA_MIN", 40)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("is_causal", False), kwargs.get("attn_mask") is not None))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(lean_decoder.F, "scaled_dot_product_attention", spy)
    t = tiny_target("llama")
    cache = t.new_cache(2, 64)
    t.forward(cache, torch.randint(0, 96, (2, 9)))
    assert calls and all(c == (True, False) for c in calls)
    cache.advance(0, 9)
    cache.advance(1, 9)
    calls.clear()
    t.forward(cache, torch.randint(0, 96, (2, 9)))
    assert calls and all(c == (False, True) for c in calls)
