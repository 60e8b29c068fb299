"""EAGLE-3 training-time test (TTT): the draft unrolled S steps on its own outputs, scored against
the target's distribution. A pure function of tensors and the draft model's weights.

Words (as in `drafters/eagle3.py`): draft position t pairs the fused target feature g_t with token
x_{t+1} and predicts x_{t+2}. For every anchor t of a batch, step s = 0..S-1 computes

    step 0:   hidden g_t,            token x_{t+1},   RoPE position t     -> predicts x_{t+2}
    step s:   hidden h_t^(s-1),      token x_{t+1+s}, RoPE position t+s   -> predicts x_{t+2+s}

where h_t^(s-1) is the layer's own output at step s-1 for the same anchor (gradients flow through
it), and the tokens are ground truth. The query of (step s, anchor t) attends to the step-0 keys at
positions <= t and, for each step 1 <= j <= s, to the key of step j at the same anchor: exactly what
chain drafting sees at inference (the paired positions up to the frontier, then its own chain).

Attention is computed as one causal [L, L] block per packed example (queries x step-0 keys) plus s
"diagonal" scores q_t . k_t^(j), softmaxed together: the [T, (s+1)T] mask of the naive formulation
is diagonal outside its first block, so this costs one step-0 attention per step instead of s+1
(SpecForge computes it the same way). Each example of a packed row gets its own block instead of
one masked [T, T] block per row: with ~600-token conversations packed into 2048-token rows, the
masked form spent three quarters of its attention on pairs across examples.

Loss at (s, t): soft cross-entropy between the draft distribution over the draft vocabulary and the
target's next-token distribution at t+1+s restricted to the draft vocabulary (target logits at the
draft ids, softmaxed). It is counted where x_{t+2+s} is an assistant token (loss mask), lies in the
same packed example as t, and the target's argmax over the full vocabulary is in the draft
vocabulary. Each step's loss is normalised by its count (or by counts given from outside, which is
how data-parallel ranks agree on one normaliser), and total = sum_s decay^s * loss_s. What the loss
needs from the target's [b, T, V] logits (p over the draft vocab, the full-vocab argmax) is taken
once per batch into a `TargetSignal`, so the full logits can be freed before the draft runs.

The LM head and soft cross-entropy are fused and chunked (`soft_ce.soft_cross_entropy`): no
[n, draft_vocab] tensor is kept for backward, which is what bounds memory on a CPU with a 32k draft
vocabulary and 7 steps.

This module knows the model's layer math and the loss. It does not know batching, packing, the
target, optimisers or distribution (it takes `segments`/`positions` and optional global counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftsmith.drafters.eagle3 import Eagle3Model
from draftsmith.train.data import segment_runs
from draftsmith.train.soft_ce import soft_cross_entropy

DECAY = 0.8


@dataclass
class TTTResult:
    loss: torch.Tensor  # scalar, differentiable: sum_s decay^s * loss_s
    step_loss: torch.Tensor  # [S] detached, each step's normalised loss
    correct: torch.Tensor  # [S] counted positions where the draft argmax equals the target argmax
    counts: torch.Tensor  # [S] counted positions of this batch (local, even when normalised globally)
    logits: list[torch.Tensor] | None = None  # per step [b, T, Vd], only with return_logits

    @property
    def acc(self) -> list[float]:
        return [
            c / n if n else float("nan")
            for c, n in zip(self.correct.tolist(), self.counts.tolist(), strict=True)
        ]


def target_to_draft(model: Eagle3Model) -> torch.Tensor:
    """[V] long: draft id of each target id, -1 where the target id is outside the draft vocab."""
    lookup = torch.full((model.t2d.shape[0],), -1, dtype=torch.long, device=model.d2t.device)
    lookup[model.draft_to_target()] = torch.arange(model.d2t.shape[0], device=model.d2t.device)
    return lookup


@dataclass
class TargetSignal:
    """What the loss needs from the target's logits, computed once per batch (one pass over [b, T, V])."""

    p: torch.Tensor  # [b, T, Vd] fp32: next-token distribution restricted to the draft vocab
    argmax: torch.Tensor  # [b, T] long: argmax over the FULL vocab as a draft id, -1 outside it

    @classmethod
    def from_logits(cls, model: Eagle3Model, target_logits: torch.Tensor) -> TargetSignal:
        restricted = target_logits.index_select(-1, model.draft_to_target())  # [b, T, Vd]
        p = torch.softmax(restricted, -1, dtype=torch.float32)
        top = target_logits.max(-1).indices  # as argmax (first maximum), twice as fast on a CPU
        return cls(p=p, argmax=target_to_draft(model)[top])


def _signal(model: Eagle3Model, target: torch.Tensor | TargetSignal) -> TargetSignal:
    return target if isinstance(target, TargetSignal) else TargetSignal.from_logits(model, target)


def step_masks(
    loss_mask: torch.Tensor,  # [b, T]
    signal: TargetSignal,
    ttt_steps: int,
    segments: torch.Tensor | None = None,  # [b, T] example id per token, -1 on padding
) -> list[torch.Tensor]:
    """Which anchors count at each step: [b, T] bool each."""
    b, T = loss_mask.shape
    seg = segments if segments is not None else loss_mask.new_zeros(b, T, dtype=torch.long)
    masks = []
    for s in range(ttt_steps):
        same = (_shift(seg, 2 + s, -2) == seg) & (seg >= 0)
        counted = same & _shift(loss_mask, 2 + s, 0).bool() & (_shift(signal.argmax, 1 + s, -1) >= 0)
        masks.append(counted)
    return masks


def count_positions(
    model: Eagle3Model,
    loss_mask: torch.Tensor,  # [b, T]
    target: torch.Tensor | TargetSignal,  # [b, T, V] target logits, or their TargetSignal
    ttt_steps: int,
    segments: torch.Tensor | None = None,
) -> torch.Tensor:
    """[S] long: counted positions per step (what a data-parallel run all-reduces before the loss)."""
    masks = step_masks(loss_mask, _signal(model, target), ttt_steps, segments)
    return torch.stack([m.sum() for m in masks])


def ttt_loss(
    model: Eagle3Model,
    input_ids: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T] 1 on assistant tokens
    features: torch.Tensor,  # [b, T, 3, H_target] target hidden states of the feature layers
    target: torch.Tensor | TargetSignal,  # [b, T, V] target next-token logits, or their TargetSignal
    *,
    ttt_steps: int = 7,
    decay: float = DECAY,
    segments: torch.Tensor | None = None,  # [b, T] packed example id, -1 on padding; None = one each
    positions: torch.Tensor | None = None,  # [b, T] position inside its example; None = 0..T-1
    counts: torch.Tensor | None = None,  # [S] normalisers (global over ranks); None = this batch's
    return_logits: bool = False,
) -> TTTResult:
    """The TTT loss of one (packed) batch; see the module docstring."""
    b, T = input_ids.shape
    device = input_ids.device
    if segments is None:
        segments = torch.zeros(b, T, dtype=torch.long, device=device)
    if positions is None:
        positions = torch.arange(T, device=device).expand(b, T)
    signal = _signal(model, target)
    masks = step_masks(loss_mask, signal, ttt_steps, segments)
    local_counts = torch.stack([m.sum() for m in masks])
    norm = local_counts if counts is None else counts.to(device)
    p_rows = signal.p.view(b * T, -1)  # [b*T, Vd]
    tgt_rows = signal.argmax.view(-1)

    runs = segment_runs(segments)
    hidden = model.fuse(features)  # [b, T, H]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    total = hidden.new_zeros((), dtype=torch.float32)
    step_loss, correct, logits_out = [], [], []
    for s in range(ttt_steps):
        ids = _shift(input_ids, 1 + s, 0)  # x_{t+1+s}; past the end a dummy token, never counted
        h, k, v = _layer(model, ids, hidden, positions + s, keys, values, runs)
        keys.append(k)
        values.append(v)
        if return_logits:
            with torch.no_grad():
                logits_out.append(model.lm_head(model.norm(h)).float())

        rows, cols = masks[s].nonzero(as_tuple=True)
        at = rows * T + cols + 1 + s  # the target's position t+1+s, flattened
        x = model.norm(h[rows, cols])  # [n, H]
        loss_sum, argmax = soft_cross_entropy(x, model.lm_head.weight, p_rows.index_select(0, at))
        loss_s = loss_sum / norm[s].clamp(min=1)
        total = total + decay**s * loss_s
        step_loss.append(loss_s.detach())
        correct.append((argmax == tgt_rows[at]).sum())
        hidden = h
    return TTTResult(
        loss=total,
        step_loss=torch.stack(step_loss),
        correct=torch.stack(correct),
        counts=local_counts,
        logits=logits_out if return_logits else None,
    )


def _shift(x: torch.Tensor, n: int, fill: int) -> torch.Tensor:
    """x[:, t + n] at column t; `fill` past the end. [b, T] -> [b, T]."""
    out = x.new_full(x.shape, fill)
    if n < x.shape[1]:
        out[:, : x.shape[1] - n] = x[:, n:]
    return out


def _layer(
    model: Eagle3Model,
    ids: torch.Tensor,  # [b, T]
    hidden: torch.Tensor,  # [b, T, H]
    positions: torch.Tensor,  # [b, T]
    keys: list[torch.Tensor],  # keys of steps 0..s-1, each [b, kv_heads, T, d]
    values: list[torch.Tensor],
    runs: list[list[tuple[int, int]]],  # `segment_runs`: the examples of each packed row
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft layer (as `Eagle3Model.forward`) with TTT attention. Returns (h, new keys, new values)."""
    layer = model.midlayer
    attn = layer.self_attn
    b, T, _ = hidden.shape
    emb = model.embed_tokens(ids).to(hidden.dtype)
    x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)
    q = attn.q_proj(x).view(b, T, attn.heads, attn.head_dim).transpose(1, 2)  # [b, heads, T, d]
    k = attn.k_proj(x).view(b, T, attn.kv_heads, attn.head_dim).transpose(1, 2)  # [b, kv, T, d]
    v = attn.v_proj(x).view(b, T, attn.kv_heads, attn.head_dim).transpose(1, 2)
    cos, sin = model.rotary(v, positions)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)

    rep = attn.heads // attn.kv_heads  # GQA: query head i reads kv head i // rep, as SDPA's enable_gqa
    ks = [kk.repeat_interleave(rep, 1) for kk in [*keys, k]]  # each [b, heads, T, d]
    vs = [vv.repeat_interleave(rep, 1) for vv in [*values, v]]
    scale = attn.head_dim**-0.5
    # Steps 1..s: each query's own earlier draft keys at the same anchor, one score per key.
    s = len(ks) - 1
    diag = torch.stack([(q * kj).sum(-1) for kj in ks[1:]], -1) * scale if s else q.new_zeros(*q.shape[:3], 0)
    # The step-0 keys: one causal block per packed example, softmaxed together with its s diagonal
    # scores. Examples are cut with `unbind`/`split`, whose backward is one concatenation; slicing
    # per example cost a zero-filled full-size gradient per slice.
    outs, w_diags = [], []
    for q_r, k_r, v_r, d_r, row_runs in zip(q, ks[0], vs[0], diag, runs, strict=True):
        lens = [e - a for a, e in row_runs]
        for qe, ke, ve, de in zip(*(x.split(lens, 1) for x in (q_r, k_r, v_r, d_r)), strict=True):
            L = qe.shape[1]
            causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril_()
            block = ((qe @ ke.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
            w = torch.softmax(torch.cat([block, de], -1), dim=-1, dtype=torch.float32).to(q.dtype)
            outs.append(w[..., :L] @ ve)  # [heads, L, d]
            w_diags.append(w[..., L:])  # [heads, L, s]
    # The examples tile the rows in order: [heads, b*T, .] -> [b, heads, T, .].
    out = torch.cat(outs, 1).view(attn.heads, b, T, -1).transpose(0, 1)
    w_diag = torch.cat(w_diags, 1).view(attn.heads, b, T, s).transpose(0, 1)
    for j, vj in enumerate(vs[1:]):
        out = out + w_diag[..., j : j + 1] * vj
    r = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, T, -1))
    h = r + layer.mlp(layer.post_attention_layernorm(r))
    return h, k, v
