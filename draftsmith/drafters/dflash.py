"""DFlash draft model (Chen et al., arXiv:2602.06036), laid out as z-lab's `DFlashDraftModel`, the
layout SGLang and vLLM load.

What it computes for one block of B positions starting at position s (s = the position of the last
committed token, whose own target features are not known yet):

    c_t      = hidden_norm(fc([f_1 ; ... ; f_K]_t))        # K*H -> H: fused target features, t < s
    h^0_j    = embed(block_j)                               # block = [last token, MASK x (B-1)]
    per layer:
      x      = input_layernorm(h)
      q      = rope(q_norm(q_proj(x)))                      # queries only from the block
      k, v   = [rope(k_norm(k_proj(c))) ; rope(k_norm(k_proj(x)))], [v_proj(c) ; v_proj(x)]
      h      = h + o_proj(attn(q, k, v))                    # no causal mask: the block sees itself whole
      h      = h + mlp(post_attention_layernorm(h))
    logits_j = lm_head(norm(h_j))                           # j = 1..B-1 predicts the token at s + j

The context keys/values ("KV injection") go through each layer's own k/v projections, k_norm and
RoPE at their absolute positions, but not through input_layernorm: `hidden_norm` plays that role.
The embedding and the LM head are the target's, shared and frozen, and never saved.

Layer id i in `target_layer_ids` means the output of target decoder layer i (HF
`hidden_states[i + 1]`). The mask token is a target token id whose (frozen) embedding fills the
slots to predict; models without a spare token use a reserved special token that never occurs in
chat data (see `default_mask_token_id`).

This module knows the model, its context K/V and its checkpoint format. It does not know how blocks
are proposed (`dflash_drafter.py`) or trained (`train/dflash_objective.py`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, rotate_half

from draftsmith.drafters.layers import RMSNorm, SwiGLU
from draftsmith.errors import UserError
from draftsmith.formats.dflash_formats import (  # noqa: F401 (the format's rules, used here and by callers)
    ARCHITECTURE,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_NUM_FEATURES,
    config_dict,
    default_target_layer_ids,
    read_dflash_checkpoint,
)

DEFAULT_LAYERS = 5


def default_mask_token_id(tokenizer, vocab_size: int) -> int:
    """A token id for the masked slots: the tokenizer's mask token, SGLang's `<|MASK|>` if the
    vocabulary has it, else the highest-id special token that is neither BOS/EOS/PAD/UNK nor used by
    the chat template (SmolLM2: id 16, `<empty_output>`, a Jupyter marker from pretraining that chat
    data never contains), else the last id of the vocabulary (tokenizer-less test targets)."""
    if tokenizer is None:
        return vocab_size - 1
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    vocab = tokenizer.get_vocab()
    if "<|MASK|>" in vocab:
        return int(vocab["<|MASK|>"])
    template = str(getattr(tokenizer, "chat_template", "") or "")
    taken = {getattr(tokenizer, f"{n}_token_id", None) for n in ("bos", "eos", "pad", "unk")}
    spare = [
        i
        for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if tok.special and i < vocab_size and i not in taken and tok.content not in template
    ]
    return int(max(spare)) if spare else vocab_size - 1


def make_config(
    target_config,
    *,
    layers: int = DEFAULT_LAYERS,
    block_size: int = DEFAULT_BLOCK_SIZE,
    mask_token_id: int,
    target_layer_ids: list[int] | None = None,
) -> Qwen3Config:
    """A draft config from the target's: same width, heads and RoPE; `layers` Qwen3-style layers."""
    tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    heads = tc.num_attention_heads
    ids = list(target_layer_ids or default_target_layer_ids(tc.num_hidden_layers))
    rope = dict(getattr(tc, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(tc, "rope_theta", None) or 10000.0)
    # Multimodal (mrope) and partial-rotary settings belong to the target's own attention; the draft
    # rotates whole heads, as the published Qwen3.5 drafters do.
    kind = rope.get("rope_type", "default")
    rope = {"rope_type": "default", "rope_theta": theta} if kind in ("default", "mrope") else rope
    for key in ("partial_rotary_factor", "mrope_section", "mrope_interleaved"):
        rope.pop(key, None)
    cfg = Qwen3Config(
        architectures=[ARCHITECTURE],
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        num_hidden_layers=layers,
        max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=tc.rms_norm_eps,
        vocab_size=tc.vocab_size,
        rope_parameters=rope,
        hidden_act="silu",
        attention_bias=False,
        tie_word_embeddings=False,
        layer_types=["full_attention"] * layers,
        use_cache=False,
    )
    cfg.num_target_layers = tc.num_hidden_layers
    cfg.block_size = block_size  # older loaders read it here, newer ones under dflash_config
    cfg.dflash_config = {
        "block_size": block_size,
        "mask_token_id": int(mask_token_id),
        "target_layer_ids": ids,
    }
    cfg.target_model_type = getattr(tc, "model_type", None)
    return cfg


class _Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[b, n, H] -> keys and values [b, kv_heads, n, d], keys normed and rotated."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rope(k, cos, sin), v


class DFlashLayer(nn.Module):
    """One draft layer, split where training and drafting differ: how attention is assembled."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = _Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def context_kv(self, c: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused target features [b, n, H] -> this layer's context keys/values [b, kv_heads, n, d]."""
        return self.self_attn.kv(c, cos, sin)

    def block_qkv(self, h: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Block hidden states [b, q, H] -> queries [b, heads, q, d], keys and values [b, kv, q, d]."""
        attn = self.self_attn
        b, n, _ = h.shape
        x = self.input_layernorm(h)
        q = attn.q_norm(attn.q_proj(x).view(b, n, attn.heads, attn.head_dim)).transpose(1, 2)
        k, v = attn.kv(x, cos, sin)
        return _rope(q, cos, sin), k, v

    def finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual, o_proj and MLP after attention; attn_out [b, heads, q, d]."""
        b, _, n, _ = attn_out.shape
        h = h + self.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, n, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, n, d]; cos/sin [b, n, d] at each token's absolute position."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashModel(nn.Module):
    def __init__(self, config: Qwen3Config, embed_tokens: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        k = len(config.dflash_config["target_layer_ids"])
        self.fc = nn.Linear(k * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(config)
        # The target's embedding and LM head: shared, frozen, kept out of state_dict().
        object.__setattr__(self, "embed_tokens", embed_tokens)
        object.__setattr__(self, "lm_head", lm_head)
        self.embed_scale = float(config.dflash_config.get("input_embedding_scale", 1.0))
        self.vocab_order: torch.Tensor | None = None  # token ids by training-data frequency, if known

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.config.dflash_config["target_layer_ids"])

    @property
    def block_size(self) -> int:
        return int(self.config.dflash_config["block_size"])

    @property
    def mask_token_id(self) -> int:
        return int(self.config.dflash_config["mask_token_id"])

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[..., K, H] target features -> [..., H] fused context feature c."""
        return self.hidden_norm(self.fc(features.flatten(-2)))

    def rope(self, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [b, n, d] for positions [b, n]."""
        return self.rotary(like, positions)

    def context_kv(self, c: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fused features [b, n, H] at positions [b, n] -> per layer (keys, values) [b, kv_heads, n, d]."""
        cos, sin = self.rope(c, positions)
        return [layer.context_kv(c, cos, sin) for layer in self.layers]

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        e = self.embed_tokens(ids).to(dtype)
        return e * self.embed_scale if self.embed_scale != 1.0 else e

    def forward(
        self,
        block_ids: torch.Tensor,  # [b, q] the last committed token, then mask tokens
        positions: torch.Tensor,  # [b, q] absolute positions of the block
        context: list[tuple[torch.Tensor, torch.Tensor]],  # per layer [b, kv_heads, S, d] context K/V
    ) -> torch.Tensor:
        """One block, attending to the whole context and (bidirectionally) to itself.

        Returns the final-normed hidden states [b, q, H]; `logits` turns them into target-vocab logits."""
        dtype = self.fc.weight.dtype
        h = self.embed(block_ids, dtype)
        cos, sin = self.rope(h, positions)
        for layer, (ck, cv) in zip(self.layers, context, strict=True):
            q, k, v = layer.block_qkv(h, cos, sin)
            keys, values = torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)
            out = F.scaled_dot_product_attention(
                q, keys, values, enable_gqa=layer.self_attn.kv_heads != layer.self_attn.heads
            )
            h = layer.finish(h, out)
        return self.norm(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))

    # ---- checkpoints: the z-lab / SGLang / vLLM layout (no embedding, no LM head) ----------------

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """The weights and config; with `vocab_order` set, the token ranking `dflash:PATH:vocab=N` reads."""
        from draftsmith.fileio import save_checkpoint_dir
        from draftsmith.formats import vocab_order

        state = {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        save_checkpoint_dir(path, state, config_dict(self.config, self.fc.weight.dtype), extra)
        if self.vocab_order is not None:
            vocab_order.save(path, self.vocab_order, as_json=True)


@torch.no_grad()
def scale_output_norm(model: DFlashModel) -> None:
    """Start a new draft's final norm at 1 / (median row norm of the target's LM head), so that its
    first logits have about unit spread over the vocabulary.

    At weight 1 the first hidden states, dominated by the mask token's embedding, meet the target's
    head at full scale and one token takes nearly all the probability (SmolLM2: p = 0.996 on one
    token, first losses 35-49 instead of ln V = 10.8); the first hundreds of updates then only undo
    that. What a trained draft needs from this weight it learns as before."""
    rows = model.lm_head.weight.detach().float().norm(dim=-1)
    model.norm.weight.fill_(1.0 / float(rows.median().clamp(min=1e-6)))


def load_dflash(
    path: str | Path, embed_tokens: nn.Module, lm_head: nn.Module, dtype: torch.dtype | None = None
) -> DFlashModel:
    """Load a DFlash checkpoint in the published layout (ours is the same)."""
    config, state = read_dflash_checkpoint(path)
    vocab = embed_tokens.weight.shape[0]
    if vocab != config.vocab_size:
        raise UserError(
            f"DFlash drafter at {path} was made for a vocabulary of {config.vocab_size} tokens but the target has "
            f"{vocab}: use a drafter trained for this target"
        )
    if embed_tokens.weight.shape[1] != config.hidden_size:
        raise UserError(
            f"DFlash drafter at {path} has hidden size {config.hidden_size} but the target's is "
            f"{embed_tokens.weight.shape[1]}: use a drafter trained for this target"
        )
    model = DFlashModel(config, embed_tokens, lm_head)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary.")]
    if missing or unexpected:
        raise UserError(
            f"DFlash checkpoint at {path} does not match the model: missing {missing}, extra {unexpected}"
        )
    model = model.to(dtype or embed_tokens.weight.dtype).eval()
    model.rotary.float()  # RoPE frequencies stay fp32; cos/sin come out in the activations' dtype
    return model
