"""EAGLE-3 draft model (Li et al., arXiv:2503.01840), laid out as SGLang's `LlamaForCausalLMEagle3`.

What it computes, for a draft position t that pairs the target's features at t with token x_{t+1}:

    g_t    = fc([f_low ; f_mid ; f_high]_t)                 # 3H -> H, no bias (target features)
    a_t    = attn([norm_in(embed(x_{t+1})) ; norm_h(g_t)])  # q/k/v take 2H; RoPE at position t
    r_t    = g_t + a_t
    h_t    = r_t + mlp(norm_post(r_t))                      # the layer's output, before the final norm
    logits = lm_head(norm(h_t))                             # over the draft vocabulary -> x_{t+2}

The next draft step feeds h_t where the target's fused feature g would go (the model drafts from its
own hidden state). The token embedding is the target's, frozen and never saved; the LM head is its
own, over the `draft_vocab_size` most frequent target tokens: draft id i means target id
`i + d2t[i]`, and `t2d` marks which target ids are in the draft vocabulary.

This module knows the model, its KV layout and its checkpoint format. It does not know how drafts
are proposed (`eagle3_drafter.py`) or trained (the trainer).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from draftsmith.drafters.layers import RMSNorm, SwiGLU
from draftsmith.errors import UserError
from draftsmith.target.attention import attend

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE's low/middle/high features: the inputs of layers 2, L//2 and L-3, i.e. the outputs of
    layers 1, L//2 - 1 and L - 4 (layer id i = output of decoder layer i)."""
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    return sorted({min(max(i, 0), num_layers - 1) for i in ids})


def feature_layers(num_layers: int) -> list[int]:
    """The three layers a trained EAGLE-3 reads; a target too shallow for three distinct ones
    repeats a layer."""
    layers = default_feature_layers(num_layers)
    if len(layers) < 3:
        layers = sorted(min(max(i, 0), num_layers - 1) for i in (1, num_layers // 2 - 1, num_layers - 4))
    return layers


def make_config(target_config, draft_vocab_size: int, feature_layers: list[int] | None = None) -> LlamaConfig:
    """A draft config from the target's: same width, heads and RoPE, one layer, its own LM head."""
    tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    heads = tc.num_attention_heads
    layers = feature_layers or default_feature_layers(tc.num_hidden_layers)
    rope = dict(getattr(tc, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
    cfg = LlamaConfig(
        architectures=[ARCHITECTURE],
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        num_hidden_layers=1,
        max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=tc.rms_norm_eps,
        vocab_size=tc.vocab_size,
        rope_parameters=rope,
        hidden_act="silu",
        tie_word_embeddings=False,  # SGLang ties lm_head to the embedding when this is true
    )
    cfg.draft_vocab_size = min(draft_vocab_size, tc.vocab_size)
    cfg.target_hidden_size = tc.hidden_size
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(layers), "use_aux_hidden_state": True}
    cfg.target_model_type = getattr(tc, "model_type", None)
    return cfg


class _Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)


class _MidLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = _Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)


class Eagle3Model(nn.Module):
    def __init__(self, config: LlamaConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(3 * config.target_hidden_size, h, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        # Until set_vocab_map is called, draft id i is target id i.
        self.register_buffer("t2d", torch.arange(config.vocab_size) < config.draft_vocab_size)
        self.rotary = LlamaRotaryEmbedding(config)
        # The target's embedding: shared, frozen, and kept out of state_dict() (serving reuses the target's).
        object.__setattr__(self, "embed_tokens", embed_tokens)

    @property
    def feature_layers(self) -> list[int]:
        return list(self.config.eagle_config["eagle_aux_hidden_state_layer_ids"])

    def set_vocab_map(self, draft_to_target: torch.Tensor) -> None:
        """draft_to_target[i] = target id of draft id i (the N most frequent target tokens)."""
        n = self.config.draft_vocab_size
        ids = draft_to_target.to(torch.long)[:n]
        self.d2t.copy_(ids - torch.arange(n))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_to_target(self) -> torch.Tensor:
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)

    @torch.no_grad()
    def init_head_from_target(self, target_head: nn.Linear, target_norm: nn.Module | None) -> None:
        """Start the LM head at the target's own rows for the draft vocabulary (and the final norm at
        the target's, when it is a plain `w * x / rms(x)`): the draft then begins in the target's
        output space instead of learning 8k-32k token directions from scratch, as EAGLE-1 did by
        sharing the head. Call after `set_vocab_map`."""
        self.lm_head.weight.copy_(target_head.weight[self.draft_to_target()].to(self.lm_head.weight))
        w = getattr(target_norm, "weight", None)
        if w is None or w.shape != self.norm.weight.shape:
            return
        probe = torch.randn(2, w.shape[0], dtype=torch.float32, device=w.device)
        plain = (
            probe * torch.rsqrt(probe.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps) * w.float()
        )
        theirs = copy.deepcopy(target_norm).float()(probe)  # a copy: the target stays in its dtype
        if torch.allclose(theirs, plain, atol=1e-4, rtol=1e-4):
            self.norm.weight.copy_(w.to(self.norm.weight))

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[..., 3, H_target] target features -> [..., H] fused feature g."""
        return self.fc(features.flatten(-2))

    def forward(
        self,
        input_ids: torch.Tensor,  # [b, q] token x_{t+1} at each draft position t
        hidden: torch.Tensor,  # [b, q, H] fused target feature g_t, or the draft's own h from a step before
        positions: torch.Tensor,  # [b, q] draft position t
        keys: torch.Tensor | None = None,  # [b, kv_heads, S, d] earlier keys to attend to (cache or unrolled)
        values: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,  # [b, 1, q, S + q] bool, True = may attend; None = causal over new
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pass of the layer. Returns (draft logits [b, q, Vd], h [b, q, H], new keys, new values)."""
        layer = self.midlayer
        attn = layer.self_attn
        b, q, _ = hidden.shape
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)
        qs = attn.q_proj(x).view(b, q, attn.heads, attn.head_dim).transpose(1, 2)
        ks = attn.k_proj(x).view(b, q, attn.kv_heads, attn.head_dim).transpose(1, 2)
        vs = attn.v_proj(x).view(b, q, attn.kv_heads, attn.head_dim).transpose(1, 2)
        cos, sin = self.rotary(vs, positions)
        qs, ks = apply_rotary_pos_emb(qs, ks, cos, sin)
        all_k = ks if keys is None else torch.cat([keys, ks], dim=2)
        all_v = vs if values is None else torch.cat([values, vs], dim=2)
        causal = mask is None and keys is None and q > 1
        out = attend(qs, all_k, all_v, mask, causal=causal)
        r = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, q, -1))
        h = r + layer.mlp(layer.post_attention_layernorm(r))
        return self.lm_head(self.norm(h)), h, ks, vs

    # ---- checkpoints: SGLang's layout (config.json + model.safetensors, no embed_tokens) ----------

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        from draftsmith.fileio import save_checkpoint_dir

        state = {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        save_checkpoint_dir(path, state, self.config.to_dict(), extra)


def load_eagle3(
    path: str | Path, embed_tokens: nn.Embedding, dtype: torch.dtype | None = None
) -> Eagle3Model:
    """Load any supported layout: ours/SGLang (`midlayer.*` or `layers.0.*`) or vLLM speculators."""
    from draftsmith.formats.eagle3_formats import read_eagle3_checkpoint

    config, state = read_eagle3_checkpoint(path)
    if embed_tokens.weight.shape[0] != config.vocab_size:
        raise UserError(
            f"EAGLE-3 drafter at {path} was made for a vocabulary of {config.vocab_size} tokens but the target has "
            f"{embed_tokens.weight.shape[0]}: use a drafter trained for this target"
        )
    model = Eagle3Model(config, embed_tokens)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary.")]
    if missing or unexpected:
        raise UserError(
            f"EAGLE-3 checkpoint at {path} does not match the model: missing {missing}, extra {unexpected}"
        )
    return model.to(dtype or embed_tokens.weight.dtype).eval()
