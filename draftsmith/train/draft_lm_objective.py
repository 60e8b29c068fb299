"""Draft-LM distillation: a small causal LM trained to match the target's next-token distribution.

The classic draft model (Leviathan et al. 2023; Chen et al. 2023) drafts autoregressively from its
own hidden states: it never sees the target's features, so the only thing to learn is the target's
distribution itself. Distillation on text the target wrote, with the target's full distribution as
soft labels (DistillSpec, Zhou et al. 2024: forward KL on on-policy data is a strong default),
gives a draft whose argmax agrees with the target's far more often than next-token training on the
same text would.

Loss at position t of a packed example: soft cross-entropy between the draft's distribution and the
target's at t (both predict x_{t+1}), which equals the forward KL up to the target's entropy. It is
counted where x_{t+1} is an assistant token of t's own example (loss mask), normalised by the count
(or by counts given from outside, so data-parallel ranks agree on one normaliser).

The LM head may be the target's, frozen (`draft_lm_format`'s shared-embedding folders): the soft
cross-entropy is fused with the head and chunked (`soft_ce`), so no [n, V] tensor is kept for
backward, and the target's logits are softmaxed chunk by chunk.

Teacher-forced accuracy here is one number (the draft's argmax against the target's at each
position): an autoregressive draft predicts every chain position the same way, from the committed
context plus its own earlier drafts, so how acceptance decays along a chain shows only in the
engine's tau, which the trainer measures beside it.

This module knows the student's forward over packed rows and the loss. It does not know batching,
the target's forward, optimisers or distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from draftsmith.target import attention
from draftsmith.train.data import segment_runs
from draftsmith.train.soft_ce import soft_cross_entropy


@dataclass
class DraftLMResult:
    loss: torch.Tensor  # scalar, differentiable: the normalised soft cross-entropy
    step_loss: torch.Tensor  # [1] detached
    correct: torch.Tensor  # [1] counted positions where the draft's argmax equals the target's
    counts: torch.Tensor  # [1] counted positions of this batch (local, even when normalised globally)


def counted(loss_mask: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """[b, T] bool: position t is scored (x_{t+1} is an assistant token of t's packed example).

    >>> counted(torch.tensor([[0, 1, 1, 1]]), torch.tensor([[0, 0, 0, 1]])).int().tolist()
    [[1, 1, 0, 0]]
    """
    m = torch.zeros_like(loss_mask, dtype=torch.bool)
    m[:, :-1] = loss_mask[:, 1:].bool() & (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] >= 0)
    return m


def student_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,  # [b, T]
    segments: torch.Tensor,  # [b, T] packed example id, -1 on padding
    positions: torch.Tensor,  # [b, T] position inside its example
) -> torch.Tensor:
    """[b, T, H] the draft's final-normed hidden states, attention kept inside each packed example."""
    config = model.config
    stock = config._attn_implementation
    try:
        config._attn_implementation_internal = attention.PACKED_NAME
        out = model.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=_block_causal(segments),
            use_cache=False,
            packed_runs=segment_runs(segments),
        )
    finally:
        config._attn_implementation_internal = stock
    return out.last_hidden_state


def _block_causal(segments: torch.Tensor) -> torch.Tensor:
    T = segments.shape[1]
    i = torch.arange(T, device=segments.device)
    return ((segments[:, :, None] == segments[:, None, :]) & (i[:, None] >= i[None, :]))[:, None]


def draft_lm_loss(
    model: PreTrainedModel,
    input_ids: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T] 1 on assistant tokens
    target_logits: torch.Tensor,  # [b, T, V] the target's logits (row t predicts x_{t+1})
    *,
    segments: torch.Tensor | None = None,  # [b, T] packed example id; None = one example per row
    positions: torch.Tensor | None = None,  # [b, T] position within the example; None = 0..T-1
    counts: torch.Tensor | None = None,  # [1] normaliser (global over ranks); None = this batch's
) -> DraftLMResult:
    b, T = input_ids.shape
    dev = input_ids.device
    if segments is None:
        segments = torch.zeros(b, T, dtype=torch.long, device=dev)
    if positions is None:
        positions = torch.arange(T, device=dev).expand(b, T)
    scored = counted(loss_mask, segments)
    local = scored.sum().reshape(1).long()
    norm = (local if counts is None else counts.to(dev)).clamp_min(1).float()
    rows, cols = scored.nonzero(as_tuple=True)
    hidden = student_hidden(model, input_ids, segments, positions)
    head = model.get_output_embeddings().weight
    vocab = target_logits.shape[-1]
    loss_sum, argmax = soft_cross_entropy(
        hidden[rows, cols], head[:vocab], p_logits=target_logits[rows, cols].float()
    )
    loss = loss_sum / norm[0]
    correct = (argmax == target_logits[rows, cols].argmax(-1)).sum().reshape(1)
    return DraftLMResult(loss=loss, step_loss=loss.detach().reshape(1), correct=correct, counts=local)
