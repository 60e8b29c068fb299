"""The DFlash draft forward for the engine on a CPU: prepacked weights, one compiled graph for the
block and one for the context keys/values.

A DFlash proposal is a short forward (one block of B positions through a few layers) whose products
are small, so on a CPU its time went mostly to the ~40 separate ops each layer issues (norms, RoPE,
views, concatenations, residuals: each a dispatch and, with two threads, an OpenMP fork), not to
reading weights. This module runs the same computation as `DFlashModel.forward` and
`DFlashModel.context_kv` as functions over weights packed once for oneDNN (`target/packed.py`,
q/k/v and gate/up fused into one product each), compiled by torch.compile with dynamic shapes as
the target's lean forward is (`target/lean_decoder.py`): the context length varies at every step and
the graphs are shared by every length. Weights are arguments, not constants, so a drafter reloaded
with new weights (held-out tau during training) reuses the compiled graphs.

The values differ from the module forward only by floating-point rounding (fused products, fused
norms). A draft never changes what is decoded, only how much of it is accepted, so losslessness does
not depend on this path; `tests/drafters/test_dflash_fast.py` pins it to the module forward.
`DRAFTSMITH_FAST=0` keeps the module forward; `DRAFTSMITH_COMPILE=0` runs these functions eagerly.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import rotate_half

from draftsmith.drafters.dflash import DFlashModel
from draftsmith.target import lean_decoder
from draftsmith.target.attention import grouped_attention
from draftsmith.target.packed import can_pack


def available(model: DFlashModel) -> bool:
    """True where this path runs `model`: on a CPU, with the lean fast path not switched off."""
    p = next(model.parameters())
    return lean_decoder.enabled(p.device)


class FastDFlash:
    """The packed weights of one loaded `DFlashModel` and its compiled forward."""

    def __init__(self, model: DFlashModel) -> None:
        p = next(model.parameters())
        self.mode = "packed" if can_pack(p.dtype, p.device) else "plain"
        cfg = model.config
        a = model.layers[0].self_attn
        self.shape = lean_decoder.Shape(
            a.heads, a.kv_heads, a.head_dim, cfg.intermediate_size, cfg.rms_norm_eps
        )
        self.fc = self._weight(model.fc.weight)
        self.hidden_norm = model.hidden_norm.weight.detach()
        self.norm = model.norm.weight.detach()
        self.layers = [self._layer(layer) for layer in model.layers]
        self.block_fn, self.context_fn = _block, _context
        if os.environ.get("DRAFTSMITH_COMPILE", "1") != "0":
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self.block_fn = torch.compile(_block, dynamic=True, fullgraph=True)
            self.context_fn = torch.compile(_context, dynamic=True, fullgraph=True)
            self._warm_up(model)

    @torch.inference_mode()  # as the drafter calls it: guards tell inference tensors apart
    def _warm_up(self, model: DFlashModel) -> None:
        """Build every graph now, not in the middle of a measured decode: a commit of one token and
        of several (sizes of 1 are specialised), and blocks over contexts of two lengths unlike any
        other size (equal sizes would be assumed equal ever after)."""
        p = next(model.parameters())
        k, h = len(model.target_layer_ids), model.config.hidden_size
        context = []
        for n in (1, 37, 41):
            feats = torch.zeros(1, n, k, h, dtype=p.dtype, device=p.device)
            pos = torch.arange(n, device=p.device)[None]
            context = self.context_kv(feats, *model.rope(feats, pos))
        for length in (41, 39):
            ctx = [(ck[:, :, :length], cv[:, :, :length]) for ck, cv in context]
            ids = torch.full((1, model.block_size), model.mask_token_id, device=p.device)
            pos = torch.arange(length, length + model.block_size, device=p.device)[None]
            x = model.embed(ids, p.dtype)
            self.block(x, *model.rope(x, pos), ctx)

    def _weight(self, w: torch.Tensor) -> lean_decoder.Weight:
        return lean_decoder.prepare_weight(w.detach(), self.mode, w.dtype)

    def _layer(self, layer) -> dict:
        a, m = layer.self_attn, layer.mlp
        return {
            "wqkv": self._weight(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
            "wkv": self._weight(torch.cat([a.k_proj.weight, a.v_proj.weight])),
            "wo": self._weight(a.o_proj.weight),
            "wgu": self._weight(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
            "wd": self._weight(m.down_proj.weight),
            "n1": layer.input_layernorm.weight.detach(),
            "n2": layer.post_attention_layernorm.weight.detach(),
            "qn": a.q_norm.weight.detach(),
            "kn": a.k_norm.weight.detach(),
        }

    @torch.inference_mode()
    def context_kv(
        self, features: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Target features [1, n, K, H] -> per layer context (keys, values) [1, kv_heads, n, d]."""
        return self.context_fn(
            features, cos, sin, self.fc, self.hidden_norm, self.layers, self.shape, self.mode
        )

    @torch.inference_mode()
    def block(
        self,
        h: torch.Tensor,  # [1, B, H] the block's embeddings
        cos: torch.Tensor,
        sin: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Final-normed hidden states [1, B, H] of the block, as `DFlashModel.forward`."""
        # Contiguous copies: a view of the cache's buffer has strides that change as it grows, and
        # each new stride would compile the graph again.
        context = [(k.contiguous(), v.contiguous()) for k, v in context]
        return self.block_fn(h, cos, sin, context, self.layers, self.norm, self.shape, self.mode)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def _heads(x: torch.Tensor, heads: int, norm: torch.Tensor | None, s: lean_decoder.Shape) -> torch.Tensor:
    """[b, n, heads * d] -> [b, heads, n, d], RMS-normed per head when `norm` is given."""
    b, n, _ = x.shape
    x = x.view(b, n, heads, s.head_dim)
    if norm is not None:
        x = F.rms_norm(x, (s.head_dim,), norm, s.eps)
    return x.transpose(1, 2)


def _context(features, cos, sin, fc, hidden_norm, layers: list[dict], s: lean_decoder.Shape, mode: str):
    b, n = features.shape[:2]
    c = lean_decoder.linear(features.reshape(b, n, -1), fc, None, mode)
    c = F.rms_norm(c, (c.shape[-1],), hidden_norm, s.eps)
    out = []
    for w in layers:
        k, v = lean_decoder.linear(c, w["wkv"], None, mode).split([s.kv_heads * s.head_dim] * 2, dim=-1)
        out.append((_rope(_heads(k, s.kv_heads, w["kn"], s), cos, sin), _heads(v, s.kv_heads, None, s)))
    return out


def _block(h, cos, sin, context, layers: list[dict], norm, s: lean_decoder.Shape, mode: str):
    b, n, width = h.shape
    hd, kvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for w, (ck, cv) in zip(layers, context, strict=True):
        x = F.rms_norm(h, (width,), w["n1"], s.eps)
        q, k, v = lean_decoder.linear(x, w["wqkv"], None, mode).split([hd, kvd, kvd], dim=-1)
        q = _rope(_heads(q, s.heads, w["qn"], s), cos, sin)
        k = _rope(_heads(k, s.kv_heads, w["kn"], s), cos, sin)
        keys, values = torch.cat([ck, k], dim=2), torch.cat([cv, _heads(v, s.kv_heads, None, s)], dim=2)
        # No mask: the block sees the whole context and itself (bidirectionally).
        attn = grouped_attention(q, keys, values, None).transpose(1, 2).reshape(b, n, hd)
        h = h + lean_decoder.linear(attn, w["wo"], None, mode)
        gate, up = lean_decoder.linear(F.rms_norm(h, (width,), w["n2"], s.eps), w["wgu"], None, mode).split(
            [s.intermediate, s.intermediate], dim=-1
        )
        h = h + lean_decoder.linear(F.silu(gate) * up, w["wd"], None, mode)
    return F.rms_norm(h, (width,), norm, s.eps)
