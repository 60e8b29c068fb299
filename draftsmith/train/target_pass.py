"""What the frozen target contributes to a training batch, computed online: the hidden states of the
drafter's feature layers and the next-token logits at every position of packed rows.

Packed rows need a block-diagonal causal mask and positions restarting per example; transformers
takes a 4D boolean mask as-is (and a dict of them, per layer type, for models that mix full and
sliding-window attention). Linear-attention layers get no mask: the data side never packs such
targets (one example per row, right padding, which a recurrent state never reads back). Where every
layer is full attention, `packed_forward` runs the target with a kernel that attends inside each
example only (`target.attention.packed_sdpa`): the same result at a fraction of the T x T work.

This module knows the HF forward and the feature-layer convention (layer id i = hidden_states[i+1];
`FINAL_HIDDEN` = the state after the final norm, which the LM head reads and MTP heads are fed). It
does not know the drafter or the loss.
"""

from __future__ import annotations

import torch

from draftsmith.errors import UserError
from draftsmith.target import attention
from draftsmith.target.model import FINAL_HIDDEN, Target
from draftsmith.train.data import Packed, segment_runs


def can_pack(target: Target) -> bool:
    return not target.is_hybrid


def packed_mask(target: Target, segments: torch.Tensor):
    """[b, 1, T, T] bool (True = attend) or a dict of them by layer type."""
    T = segments.shape[1]
    i = torch.arange(T, device=segments.device)
    same = segments[:, :, None] == segments[:, None, :]
    causal = (same & (i[:, None] >= i[None, :]))[:, None]
    if not target._mask_dict:
        return causal
    masks: dict[str, torch.Tensor | None] = {}
    for kind in set(target.layer_types):
        if kind == "full_attention":
            masks[kind] = causal
        elif kind == "sliding_attention":
            masks[kind] = causal & (i[:, None] - i[None, :] < target.sliding_window)
        elif kind == "linear_attention":
            masks[kind] = None
        else:
            raise UserError(f"target layer type '{kind}' is not supported for training yet")
    return masks


def packed_forward(target: Target, module: torch.nn.Module, batch: Packed, hidden_states: bool = True):
    """`module` (the target's `model` for logits, or its decoder `base`) over the packed rows of
    `batch`, without a cache. Call it in inference mode."""
    kwargs = {}
    stock = target.config._attn_implementation
    per_example = set(target.layer_types) == {"full_attention"} and stock in ("sdpa", None)
    if per_example:
        kwargs["packed_runs"] = segment_runs(batch.segments)
    try:
        if per_example:
            target.config._attn_implementation_internal = attention.PACKED_NAME
        return module(
            input_ids=batch.input_ids,
            attention_mask=packed_mask(target, batch.segments),
            position_ids=batch.positions,
            output_hidden_states=hidden_states,
            use_cache=False,
            **kwargs,
        )
    finally:
        target.config._attn_implementation_internal = stock


def target_pass(
    target: Target, batch: Packed, feature_layers: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [b, T, 3, H], logits [b, T, V]) for a packed batch on the target's device.

    Features are cloned out of inference mode because the draft's `fc` saves its input for
    backward; the logits are only read (restricted and softmaxed) so they stay as they are.
    """
    feats, logits = _forward(target, batch, feature_layers)
    return feats.clone(), logits


@torch.inference_mode()
def _forward(target: Target, batch: Packed, feature_layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    out = packed_forward(target, target.model, batch)
    feats = torch.stack([_hidden(out.hidden_states, i) for i in feature_layers], dim=2)
    return feats, out.logits


def _hidden(hidden_states: tuple[torch.Tensor, ...], layer: int) -> torch.Tensor:
    """Layer id -> hidden state. transformers' last entry is the final-normed state; without the
    special case `FINAL_HIDDEN + 1 == 0` would silently pick the embeddings."""
    return hidden_states[-1] if layer == FINAL_HIDDEN else hidden_states[layer + 1]


def stored_pass(
    target: Target,
    store,
    batch: Packed,
    example_ids: list[int],
    feature_layers: list[int],
    logits: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What `target_pass` returns, read from an offline feature store (`draftsmith data features`).

    `example_ids[j]` is the store index of the example that `batch.segments == j` marks. Logits come
    from the stored final hidden state through the target's LM head (and soft-cap, if any), so they
    equal the online ones up to the store's dtype.
    """
    b, T = batch.input_ids.shape
    H = target.config.hidden_size
    stored = [i for i in feature_layers if i != FINAL_HIDDEN]  # the store keeps the final state apart
    feats = torch.zeros(b, T, len(stored), H, dtype=target.dtype)
    final = torch.zeros(b, T, H, dtype=target.dtype)
    for j, ex in enumerate(example_ids):
        rows, cols = (batch.segments.cpu() == j).nonzero(as_tuple=True)
        f, h = store.get(ex, stored)
        feats[rows, cols] = f.to(target.dtype)
        final[rows, cols] = h.to(target.dtype)
    if len(stored) < len(feature_layers):
        feats = torch.stack(
            [final if i == FINAL_HIDDEN else feats[:, :, stored.index(i)] for i in feature_layers], dim=2
        )
    if not logits:
        return feats.to(target.device), None
    with torch.inference_mode():
        out = target.head(final.to(target.device))
        if target.softcap:
            out = torch.tanh(out / target.softcap) * target.softcap
    return feats.to(target.device), out
