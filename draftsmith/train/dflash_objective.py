"""DFlash training objective: random anchors, all blocks of a batch in one forward under a block mask,
and a position-weighted cross-entropy. Pure functions of tensors and the draft model's weights.

Words (as in `drafters/dflash.py`): a block of B slots starts at an anchor position a: slot 0 holds
the token x_a (the last committed token at inference), slots 1..B-1 hold the mask token and slot j
predicts x_{a+j}. The block sees the fused target features of its example's positions < a (the
tokens the target has run at inference), and itself bidirectionally; never another block.

- Anchors: per example, up to `n_anchors` positions drawn without replacement among assistant
  tokens whose next token is an assistant token of the same example (so every block has at least
  one label). Each example draws from its own generator seeded by (seed, step, example id), so the
  anchors do not depend on how examples are packed or sharded over ranks.
- Labels: slot j counts when a+j lies in the same example and x_{a+j} is an assistant token.
- Loss: cross-entropy of the target LM head's logits (the target's head, frozen) against x_{a+j},
  weighted w_j = exp(-(j-1)/gamma), normalised by the total weight of counted slots (given from
  outside in data-parallel runs, so every rank divides by the global total):

      loss = sum_{blocks, j} w_j * CE_j / sum_{blocks, j} w_j * [slot counted]

Attention is computed in chunks of blocks: a chunk's queries see the context keys (masked per block)
and the chunk's own block keys (block-diagonal), so the cost is blocks x (context + chunk) instead of
blocks x (context + all blocks) for the dense [N*B, T + N*B] mask that `block_mask` spells out.

The cross-entropy over the target vocabulary is fused and chunked (`_WeightedCrossEntropy`): its
gradient is computed in the forward, so no [n, V] tensor is kept for backward.

This module knows the model's layer math and the loss. It does not know batching, packing, the
target, optimisers or distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftsmith.drafters.dflash import DFlashModel
from draftsmith.train.soft_ce import chunk_rows

ATTENTION_CHUNK = 512  # query tokens per attention chunk


def loss_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B-1] w_j = exp(-(j-1)/gamma) for slots j = 1..B-1.

    >>> [round(w, 4) for w in loss_weights(4, 7.0).tolist()]
    [1.0, 0.8669, 0.7515]
    """
    j = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(j - 1) / gamma)


def anchor_candidates(loss_mask: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """[b, T] bool: assistant positions whose next token is an assistant token of the same example."""
    nxt_mask = F.pad(loss_mask[:, 1:], (0, 1))
    nxt_seg = F.pad(segments[:, 1:], (0, 1), value=-1)
    return loss_mask.bool() & nxt_mask.bool() & (nxt_seg == segments) & (segments >= 0)


@dataclass
class Blocks:
    anchors: torch.Tensor  # [b, N] long: anchor positions in the packed row (0 on padding)
    valid: torch.Tensor  # [b, N] bool: a real block (rows hold different numbers of blocks)
    labels: torch.Tensor  # [b, N, B-1] long: x_{a+j}, 0 where not counted
    counted: torch.Tensor  # [b, N, B-1] bool

    @property
    def block_size(self) -> int:
        return self.labels.shape[-1] + 1

    def counts(self) -> torch.Tensor:
        """[B-1] long: counted slots per position j (what a data-parallel run all-reduces)."""
        return self.counted.sum((0, 1))

    def to(self, device) -> Blocks:
        return Blocks(*(t.to(device) for t in (self.anchors, self.valid, self.labels, self.counted)))


def sample_blocks(
    input_ids: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T]
    segments: torch.Tensor,  # [b, T] example id within the batch, -1 on padding
    *,
    block_size: int,
    n_anchors: int,
    seeds: dict[int, int],  # example id -> generator seed
) -> Blocks:
    """Anchors per example (sorted by position) and the labels of their blocks."""
    b, T = input_ids.shape
    cand = anchor_candidates(loss_mask, segments)
    rows: list[list[int]] = []
    for r in range(b):
        picked: list[int] = []
        for s in segments[r][segments[r] >= 0].unique().tolist():
            pos = (cand[r] & (segments[r] == s)).nonzero().flatten()
            if len(pos) > n_anchors:
                g = torch.Generator().manual_seed(seeds[s])
                pos = pos[torch.randperm(len(pos), generator=g)[:n_anchors]].sort().values
            picked += pos.tolist()
        rows.append(sorted(picked))
    N = max(1, max(len(p) for p in rows))
    anchors = torch.zeros(b, N, dtype=torch.long)
    valid = torch.zeros(b, N, dtype=torch.bool)
    for r, p in enumerate(rows):
        anchors[r, : len(p)] = torch.tensor(p, dtype=torch.long)
        valid[r, : len(p)] = True
    at = anchors[:, :, None] + torch.arange(1, block_size)  # [b, N, B-1] label positions
    inside = at < T
    at = at.clamp(max=T - 1)
    gather = lambda x: x.gather(1, at.view(b, -1)).view(at.shape)  # noqa: E731
    seg_a = segments.gather(1, anchors)[:, :, None]
    counted = valid[:, :, None] & inside & (gather(segments) == seg_a) & gather(loss_mask).bool()
    labels = torch.where(counted, gather(input_ids), 0)
    return Blocks(anchors=anchors, valid=valid, labels=labels, counted=counted)


def context_mask(blocks: Blocks, segments: torch.Tensor) -> torch.Tensor:
    """[b, N, T] bool: block i may attend to context position t (same example, t < anchor)."""
    T = segments.shape[1]
    t = torch.arange(T, device=segments.device)
    seg_a = segments.gather(1, blocks.anchors)  # [b, N]
    same = segments[:, None, :] == seg_a[:, :, None]
    return same & (t[None, None, :] < blocks.anchors[:, :, None]) & blocks.valid[:, :, None]


def block_mask(blocks: Blocks, segments: torch.Tensor) -> torch.Tensor:
    """[b, N*B, T + N*B] bool, True = may attend: every query of block i sees the context before its
    anchor (same example) and the whole of block i; nothing of any other block. Dense, for reading
    and tests; the loss uses the same rule chunk by chunk."""
    B = blocks.block_size
    b, N = blocks.anchors.shape
    ctx = context_mask(blocks, segments).repeat_interleave(B, dim=1)  # [b, N*B, T]
    block_id = torch.arange(N * B, device=segments.device) // B
    own = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
    return torch.cat([ctx, own], dim=-1)


@dataclass
class DFlashResult:
    loss: torch.Tensor  # scalar, differentiable
    step_loss: torch.Tensor  # [B-1] detached: mean CE at slot j (normalised by the given counts)
    correct: torch.Tensor  # [B-1] counted slots where the draft argmax equals the label
    counts: torch.Tensor  # [B-1] counted slots of this batch


def dflash_loss(
    model: DFlashModel,
    input_ids: torch.Tensor,  # [b, T]
    features: torch.Tensor,  # [b, T, K, H] target hidden states of the feature layers
    blocks: Blocks,
    *,
    segments: torch.Tensor,  # [b, T]
    positions: torch.Tensor,  # [b, T] position inside its example
    gamma: float,
    counts: torch.Tensor | None = None,  # [B-1] normalisers (global over ranks); None = this batch's
) -> DFlashResult:
    B = blocks.block_size
    b, N = blocks.anchors.shape
    device = input_ids.device
    local = blocks.counts()
    norm_counts = (local if counts is None else counts).to(device).float()
    w = loss_weights(B, gamma).to(device)
    total_weight = (w * norm_counts).sum().clamp(min=1e-6)

    # ---- context: fused features -> every layer's keys/values at their example positions -------
    c = model.fuse(features)  # [b, T, H]
    context = model.context_kv(c, positions)
    ctx_mask = context_mask(blocks, segments)  # [b, N, T]

    # ---- blocks: [x_a, MASK x (B-1)] at positions pos(a) + j, all packed in one sequence --------
    ids = torch.full((b, N, B), model.mask_token_id, dtype=torch.long, device=device)
    ids[:, :, 0] = input_ids.gather(1, blocks.anchors)
    pos = positions.gather(1, blocks.anchors)[:, :, None] + torch.arange(B, device=device)
    h = model.embed(ids.view(b, N * B), c.dtype)
    cos, sin = model.rope(h, pos.view(b, N * B))
    for layer, (ck, cv) in zip(model.layers, context, strict=True):
        q, k, v = layer.block_qkv(h, cos, sin)
        out = _block_attention(
            q, k, v, ck, cv, ctx_mask, B, layer.self_attn.kv_heads != layer.self_attn.heads
        )
        h = layer.finish(h, out)
    hidden = model.norm(h).view(b, N, B, -1)[:, :, 1:]  # [b, N, B-1, H]: the mask slots

    # ---- weighted cross-entropy on counted slots -----------------------------------------------
    r, i, j = blocks.counted.nonzero(as_tuple=True)
    ce_sum, ce, argmax = _WeightedCrossEntropy.apply(
        hidden[r, i, j], model.lm_head.weight, blocks.labels[r, i, j], w[j] / total_weight
    )
    step_loss = torch.zeros(B - 1, device=device).index_add_(0, j, ce) / norm_counts.clamp(min=1)
    correct = torch.zeros(B - 1, dtype=torch.long, device=device).index_add_(
        0, j, (argmax == blocks.labels[r, i, j]).long()
    )
    return DFlashResult(loss=ce_sum, step_loss=step_loss, correct=correct, counts=local)


def _block_attention(q, k, v, ck, cv, ctx_mask, B: int, gqa: bool) -> torch.Tensor:
    """q [b, heads, N*B, d]; block k/v [b, kv, N*B, d]; context ck/cv [b, kv, T, d]; ctx_mask [b, N, T].

    Chunks of blocks attend to [context ; their own blocks] under the block mask. -> [b, heads, N*B, d]"""
    b, _, NB, _ = q.shape
    N = NB // B
    per = max(1, ATTENTION_CHUNK // B)
    outs = []
    for i0 in range(0, N, per):
        i1 = min(N, i0 + per)
        s, e = i0 * B, i1 * B
        block_id = torch.arange(e - s, device=q.device) // B
        own = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
        mask = torch.cat([ctx_mask[:, i0:i1].repeat_interleave(B, dim=1), own], dim=-1)[:, None]
        keys = torch.cat([ck, k[:, :, s:e]], dim=2)
        values = torch.cat([cv, v[:, :, s:e]], dim=2)
        outs.append(
            F.scaled_dot_product_attention(q[:, :, s:e], keys, values, attn_mask=mask, enable_gqa=gqa)
        )
    return torch.cat(outs, dim=2)


class _WeightedCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(x_i W^T, y_i), chunked over rows, the gradient for x computed in the forward
    (W is the target's frozen LM head: no gradient). Also returns each row's CE and argmax."""

    CHUNK = 1024

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, w: torch.Tensor):
        dev = x.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        W, xs = weight.detach().to(dtype), x.detach().to(dtype)
        n = x.shape[0]
        ce = torch.empty(n, dtype=torch.float32, device=x.device)
        gx = torch.empty(n, x.shape[1], dtype=torch.float32, device=x.device)
        argmax = torch.empty(n, dtype=torch.long, device=x.device)
        with torch.autocast(dev, enabled=False):
            step = chunk_rows(x, _WeightedCrossEntropy.CHUNK)
            for i in range(0, n, step):
                j = min(i + step, n)
                z = (xs[i:j] @ W.t()).float()  # [c, V]
                lse = torch.logsumexp(z, -1)
                ce[i:j] = lse - z.gather(1, labels[i:j, None]).squeeze(1)
                argmax[i:j] = z.argmax(-1)
                g = torch.softmax(z, -1)
                g[torch.arange(j - i), labels[i:j]] -= 1.0  # d CE / d z = softmax - onehot
                gx[i:j] = (g * w[i:j, None]).to(dtype) @ W
                del z, g
        ctx.save_for_backward(gx.to(x.dtype))
        ctx.mark_non_differentiable(ce, argmax)
        return (w * ce).sum(), ce, argmax

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_argmax):
        (gx,) = ctx.saved_tensors
        return grad_loss * gx, None, None, None


def anchor_seed(seed: int, step: int, example: int) -> int:
    """The generator seed of one example's anchors at one step (independent of packing and ranks)."""
    return ((seed * 1_000_003 + step) * 1_000_033 + example) % (1 << 63)


__all__ = [
    "Blocks",
    "DFlashResult",
    "anchor_candidates",
    "anchor_seed",
    "block_mask",
    "context_mask",
    "dflash_loss",
    "loss_weights",
    "sample_blocks",
]
