"""Token attention: a new EAGLE-3 draft's heads start on each position's own token."""

from __future__ import annotations

import torch
from tiny import tiny_target
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftsmith.drafters.eagle3 import Eagle3Model, make_config
from draftsmith.train.eagle3_init import token_attention, typical_rms


def _attention_weights(model: Eagle3Model, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """[heads, T, T] causal attention probabilities of the draft layer (one row)."""
    layer, attn = model.midlayer, model.midlayer.self_attn
    T = ids.shape[1]
    x = torch.cat([layer.input_layernorm(model.embed_tokens(ids)), layer.hidden_norm(hidden)], -1)
    q = attn.q_proj(x).view(1, T, attn.heads, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(1, T, attn.kv_heads, attn.head_dim).transpose(1, 2)
    cos, sin = model.rotary(k, torch.arange(T)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k = k.repeat_interleave(attn.heads // attn.kv_heads, 1)
    scores = (q @ k.transpose(-1, -2))[0] * attn.head_dim**-0.5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


def test_heads_start_on_their_own_token():
    target = tiny_target("llama", vocab=96)
    torch.manual_seed(0)
    model = Eagle3Model(make_config(target.model.config, 96, [0, 0, 1]), target.model.get_input_embeddings())
    ids = torch.randperm(96)[None, :40]  # distinct tokens: only the position itself holds its token
    hidden = torch.randn(1, 40, 64) * 5
    before = torch.diagonal(_attention_weights(model, ids, hidden), dim1=-2, dim2=-1)
    token_attention(model, feature_rms=5.0)
    after = torch.diagonal(_attention_weights(model, ids, hidden), dim1=-2, dim2=-1)
    assert after[:, 10:].mean() > 0.8 and before[:, 10:].mean() < 0.2

    # The residual then receives the token at the fused feature's scale: swapping the last token
    # moves the layer's output by about as much as the feature itself.
    pos = torch.arange(40)[None]
    _, h1, _, _ = model(ids, hidden, pos)
    other = ids.clone()
    other[0, -1] = int(torch.tensor([i for i in range(96) if i not in ids[0].tolist()][0]))
    _, h2, _, _ = model(other, hidden, pos)
    moved = (h1[0, -1] - h2[0, -1]).pow(2).mean().sqrt()
    assert 0.3 * 5.0 < moved < 3 * 5.0


def test_typical_rms_ignores_sink_positions():
    g = torch.ones(1, 50, 8)
    g[0, 0] = 1000.0  # an attention-sink state
    assert abs(typical_rms(g) - 1.0) < 1e-6
