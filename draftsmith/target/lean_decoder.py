"""The decoder forward of Llama-family targets written directly on their weights, one compiled
layer function shared by every layer: the engine's fast path on a CPU.

A SmolLM2 decode step through transformers' modules spent about a third of its time outside the
matrix products (hundreds of small ops per step, each a dispatch and, with two threads, an OpenMP
fork), and its products read the weights at half the machine's bandwidth. Here each layer is: one
fused q/k/v product, RoPE, the cache write at each row's own slots, grouped-query attention, the
output product, one fused gate/up product and the down product, on weights packed for oneDNN
(`packed.py`). The layer is compiled by torch.compile with dynamic shapes, which fuses the norms,
RoPE, softmax and residuals into a few vectorised loops; only the products stay library calls.
Sizes of 1 are still specialised, so there are up to four graphs (one row or several, one query or
several), 5-15 s each on first use; the 30 layers and every context length reuse them. Measured on
a 2-core AMD EPYC (AVX512-BF16), SmolLM2-135M at 256 tokens of context (benchmarks/step_time.py):
bf16 q=1 step 48.7 -> 24.9 ms, q=8 verification 48.0 -> 31.6 ms; float32 61.0 -> 37.9 and
83.8 -> 41.1 ms. Compiling all 30 layers as one graph took 165 s and ran slower (32.5 against
28.1 ms a step), so the unit stays one layer.

Attention is written as two grouped matmuls (each KV head's query group folded into the rows of one
product, softmax in float32), not SDPA: PyTorch's CPU SDPA costs 2-3x more for one query at long
context (a q=1 step at 4,000 tokens: 112 ms with SDPA, 46 ms this way).

What it covers: decoder-only models whose layers are all full attention with the Llama layout
(`llama`, `mistral` without sliding windows, `qwen2`, `qwen3`: RMSNorm, SwiGLU, optional q/k/v
bias and q/k norms), every row of the cache or a prefill group of rows, chain or tree masks, logits
at chosen positions and hidden states of chosen layers. Anything else goes through transformers' modules
(`Target.forward` decides). The rotary embedding is the model's own module, so every RoPE scaling
it supports is supported here. `DRAFTSMITH_FAST=0` turns this path off; `DRAFTSMITH_COMPILE=0`
runs the same layer function uncompiled (for A/B timing of each part).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftsmith.target.attention import grouped_attention
from draftsmith.target.packed import can_pack, pack_weight, packed_linear
from draftsmith.target.quantize import int8_linear, quantize_int8

# A linear layer's weight as the layer function takes it: the matrix (plain, oneDNN-packed or
# int8) and, for int8, the per-row scales.
Weight = tuple[torch.Tensor, torch.Tensor | None]

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
PREFILL_SDPA_MIN = 1 << 20  # query x key pairs above which attention goes through SDPA


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float


def supports(model) -> bool:
    """True when `model` (a transformers causal LM) is one this forward computes exactly."""
    cfg = model.config.get_text_config()
    if getattr(cfg, "model_type", None) not in ARCHITECTURES:
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ["full_attention"]):
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return False
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping", None):
        return False
    return all(_has_llama_layout(layer) for layer in model.get_decoder().layers)


def _has_llama_layout(layer) -> bool:
    a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    return (
        a is not None
        and m is not None
        and all(hasattr(a, n) for n in names)
        and all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj"))
        and hasattr(layer, "input_layernorm")
        and hasattr(layer, "post_attention_layernorm")
    )


def enabled(device: torch.device) -> bool:
    return device.type == "cpu" and os.environ.get("DRAFTSMITH_FAST", "1") != "0"


class LeanDecoder:
    """The fast forward of one loaded model; built by `Target` when `supports` and `enabled` hold."""

    def __init__(self, model, quantize: str = "none") -> None:
        cfg = model.config.get_text_config()
        base = model.get_decoder()
        heads = cfg.num_attention_heads
        self.shape = Shape(
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            intermediate=cfg.intermediate_size,
            eps=cfg.rms_norm_eps,
        )
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.norm = base.norm.weight
        head = model.get_output_embeddings().weight
        dtype = head.dtype
        self.dtype = dtype
        if quantize == "int8":
            self.mode = "int8"
        else:
            self.mode = "packed" if can_pack(dtype, head.device) else "plain"
        self.model_head = head
        self.head = self._weight(head)
        self.layers = [self._layer(layer) for layer in base.layers]
        self.layer_fn = _layer
        if os.environ.get("DRAFTSMITH_COMPILE", "1") != "0":
            # One graph per (architecture shape, dtype, one row or several, one query or several):
            # dynamic shapes still specialise sizes of 1. Raise dynamo's default limit of 8 so that a
            # process holding several targets keeps compiling instead of failing.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self.layer_fn = torch.compile(_layer, dynamic=True, fullgraph=True)

    def _weight(self, w: torch.Tensor) -> Weight:
        return prepare_weight(w, self.mode, self.dtype)

    def _layer(self, layer) -> dict:
        a, m = layer.self_attn, layer.mlp
        qkv = [a.q_proj, a.k_proj, a.v_proj]
        bias = None
        if any(p.bias is not None for p in qkv):
            bias = torch.cat(
                [p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in qkv]
            )
        q_norm, k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        return {
            "wqkv": self._weight(torch.cat([p.weight for p in qkv])),
            "bqkv": None if bias is None else bias.detach(),
            "wo": self._weight(a.o_proj.weight),
            "bo": None if a.o_proj.bias is None else a.o_proj.bias.detach(),
            "wgu": self._weight(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
            "wd": self._weight(m.down_proj.weight),
            "n1": layer.input_layernorm.weight.detach(),
            "n2": layer.post_attention_layernorm.weight.detach(),
            "qn": None if q_norm is None else q_norm.weight.detach(),
            "kn": None if k_norm is None else k_norm.weight.detach(),
        }

    @torch.inference_mode()
    def forward(
        self,
        keys: list[torch.Tensor],  # per layer [rows, kv_heads, capacity, dim], the cache's buffers
        values: list[torch.Tensor],
        input_ids: torch.Tensor,  # [b, q]
        slots: torch.Tensor,  # [b, q] cache positions the new tokens are written at
        positions: torch.Tensor,  # [b, q] their positions for RoPE (slots, or length + depth in a tree)
        mask: torch.Tensor,  # [b, 1, q, kv] bool, True = may attend
        rows: torch.Tensor | None = None,  # [b] the cache rows these are, or None for rows 0..b-1
        keep_layers: tuple[int, ...] = (),
        causal: bool = False,  # `mask` is exactly causal over q == kv positions (a prefill into empty rows)
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Final-normed hidden states [b, q, hidden] and the outputs of `keep_layers`."""
        x = self.embed(input_ids)
        cos, sin = self.rotary(x, positions)
        subset = rows is not None
        rows = (torch.arange(input_ids.shape[0]) if rows is None else rows)[:, None]
        kept: dict[int, torch.Tensor] = {}
        for i, w in enumerate(self.layers):
            x = self.layer_fn(
                x, cos, sin, keys[i], values[i], rows, subset, slots, mask, w, self.shape, self.mode, causal
            )
            if i in keep_layers:
                kept[i] = x
        return _rms(x, self.norm, self.shape.eps), kept

    def restrict_head(self, rows: torch.Tensor) -> None:
        """Logits for these token ids only (see `Target.restrict_head`)."""
        self.head = self._weight(self.model_head[rows].contiguous())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.head, None, self.mode).float()


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' LlamaRMSNorm, operation for operation: normalise in float32, round, then scale.
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def prepare_weight(w: torch.Tensor, mode: str, dtype: torch.dtype) -> Weight:
    """A [out, in] weight as `linear` takes it in `mode` ("packed", "plain" or "int8")."""
    if mode == "int8":
        q, scale = quantize_int8(w)
        return q, scale.to(dtype)
    return (pack_weight(w) if mode == "packed" else w.detach()), None


def linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None, mode: str) -> torch.Tensor:
    """x @ W.T (+ bias) for a weight made by `prepare_weight` in the same mode."""
    if mode == "packed":
        return packed_linear(x, w[0], bias)
    if mode == "int8":
        y = int8_linear(x, w[0], w[1])
        return y if bias is None else y + bias
    return F.linear(x, w[0], bias)


def _layer(
    x: torch.Tensor,  # [b, q, hidden]
    cos: torch.Tensor,  # [b, q, dim]
    sin: torch.Tensor,
    kbuf: torch.Tensor,  # [rows, kv_heads, capacity, dim]
    vbuf: torch.Tensor,
    rows: torch.Tensor,  # [b, 1] the cache rows written and read
    subset: bool,  # rows are not simply 0..b-1
    slots: torch.Tensor,  # [b, q]
    mask: torch.Tensor,  # [b, 1, q, kv]
    w: dict,
    s: Shape,
    mode: str,
    causal: bool = False,
) -> torch.Tensor:
    b, q, _ = x.shape
    kv = mask.shape[-1]
    h, kvh, d = s.heads, s.kv_heads, s.head_dim
    y = _rms(x, w["n1"], s.eps)
    qkv = linear(y, w["wqkv"], w["bqkv"], mode)
    query, key, value = qkv.split([h * d, kvh * d, kvh * d], dim=-1)
    query, key = query.view(b, q, h, d), key.view(b, q, kvh, d)
    if w["qn"] is not None:
        query, key = _rms(query, w["qn"], s.eps), _rms(key, w["kn"], s.eps)
    # [b, h, q, d] and [b, kvh, q, d], rotated as transformers' Llama does
    query, key = apply_rotary_pos_emb(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
    # Advanced indices on dims 0 and 2 broadcast to [b, q] and lead: the written value is [b, q, kvh, d].
    kbuf[rows, :, slots] = key.transpose(1, 2)
    vbuf[rows, :, slots] = value.view(b, q, kvh, d)
    if subset:  # a prefill group: gather its rows (a copy, once per prompt)
        keys, values = kbuf[rows[:, 0], :, :kv], vbuf[rows[:, 0], :, :kv]
    else:
        keys, values = kbuf[:b, :, :kv], vbuf[:b, :, :kv]
    if q * kv >= PREFILL_SDPA_MIN:
        # A long prefill: SDPA's blocked kernel never holds the whole [q, kv] score matrix.
        # (KV heads repeated per query group: dynamic shapes make enable_gqa a symbolic bool it refuses)
        g = h // kvh
        k_all, v_all = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
        if causal:  # SDPA skips the key blocks above the diagonal: half the work of a masked prefill
            attn = F.scaled_dot_product_attention(query, k_all, v_all, is_causal=True)
        else:
            attn = F.scaled_dot_product_attention(query, k_all, v_all, attn_mask=mask)
    else:
        attn = grouped_attention(query, keys, values, mask)
    attn = attn.transpose(1, 2).reshape(b, q, h * d)
    x = x + linear(attn, w["wo"], w["bo"], mode)
    y = _rms(x, w["n2"], s.eps)
    gate, up = linear(y, w["wgu"], None, mode).split([s.intermediate, s.intermediate], dim=-1)
    return x + linear(F.silu(gate) * up, w["wd"], None, mode)
