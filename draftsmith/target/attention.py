"""The attention kernel the engine runs targets with: PyTorch SDPA with grouped-query attention
handled inside the kernel.

transformers' own `sdpa` path copies keys and values once per query group (`repeat_kv`) whenever an
attention mask is given, which is every verification forward. On a 5k-token context with 3 KV heads
for 9 query heads that copy made a 9-token verify cost 3.8 ms per layer instead of 0.7 ms (measured on
this CPU), enough to eat most of what speculation gains. `enable_gqa=True` reads the shared heads in
place.

Registered under a name of our own and switched on only for the engine's forwards (see
`Target.forward`), so peers that call `model.generate` still measure stock transformers.

`packed_sdpa` serves training forwards over packed rows (several examples back to back, see
`train/target_pass.py`): given each row's example runs it attends causally inside each example
only, so the work is sum(L_i^2) instead of T^2 for a row of length T. On a 2-core CPU a 2,000-token
row of ~400-token examples spent 2.0 of its 3.7 s in a masked T x T attention; per example the
attention is about 5x cheaper and the result is the same, since the block-diagonal mask only ever
let a query see its own example.

`attend` is the one entry both kernels (and the EAGLE-3 drafter) call. A single query (a decode step,
a chain drafter step) on a CPU in bf16/fp16 runs as two grouped matmuls: each KV head's query group is
folded into the rows of one product, so keys and values are read in place once, and the softmax runs in
float32. PyTorch 2.13's CPU SDPA took 2.7 ms for one bf16 query over a 4,800-token SmolLM2 layer
(9 heads, 3 KV heads) against 0.29 ms this way, 0.76 against 0.17 ms at 1,200 tokens (2 threads, AMD
EPYC without AMX). With 8 to 33 queries neither won throughout (SDPA ahead at short context and at
33 queries, the grouped form up to 20% ahead at 4,800 tokens with 8-17), so verification keeps SDPA.
Those figures are for contiguous keys; the cache hands over a slice of a longer buffer, on which
batched matmul is slow, so the slice is copied first or, when very large, multiplied per head
(`_per_head_matmul`): a SmolLM2 decode step at 4,800 tokens went from 84 to 64 ms (47 ms at 400
tokens), and a 48-row bf16 step at ~350 tokens from 161-171 to 145 ms.
Inference only; `DRAFTSMITH_CPU_ATTN=0` keeps SDPA everywhere (for A/B timing).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "draftsmith_gqa_sdpa"


def gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [b, heads, q, dim]
    key: torch.Tensor,  # [b, kv_heads, kv, dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # [b, 1, q, kv] bool, or None when every key is visible
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("attention logit soft-capping is not supported by the draftsmith kernel")
    # No mask and several queries only happens in a plain prefill with an empty cache.
    causal = attention_mask is None and query.shape[2] > 1
    out = attend(query, key, value, attention_mask, scaling, causal)
    return out.transpose(1, 2).contiguous(), None


def attend(
    query: torch.Tensor,  # [b, heads, q, dim]
    key: torch.Tensor,  # [b, kv_heads, kv, dim]
    value: torch.Tensor,
    mask: torch.Tensor | None,  # [b, 1, q, kv] bool (True = may attend), or None
    scale: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Attention with grouped-query heads, [b, heads, q, dim]; see the module note for the kernel."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if causal or not _grouped_pays(query) or (mask is not None and mask.dtype != torch.bool):
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, is_causal=causal, enable_gqa=kv_heads != heads
        )
    return grouped_attention(query, _compact(key), _compact(value), mask, scale, matmul=_per_head_matmul)


def grouped_attention(
    query: torch.Tensor,  # [b, heads, q, dim]
    key: torch.Tensor,  # [b, kv_heads, kv, dim]
    value: torch.Tensor,
    mask: torch.Tensor | None,  # [b, 1, q, kv] bool (True = may attend), or None
    scale: float | None = None,
    matmul=torch.matmul,
) -> torch.Tensor:
    """Attention as two grouped products, softmax in float32, [b, heads, q, dim]; `matmul` is the
    product to use (the engine's CPU kernel reads long cache slices per head; the compiled lean
    forward lets inductor plan plain matmuls)."""
    b, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    # Head h reads KV head h // group (repeat_kv's order), so [b, heads, q] folds into [b, kv_heads, group*q].
    group = heads // kv_heads
    rows = query.reshape(b, kv_heads, group * q, dim)
    scores = matmul(rows, key.transpose(-1, -2)).float()
    scores *= dim**-0.5 if scale is None else scale
    if mask is not None:
        scores = scores.view(b, kv_heads, group, q, -1).masked_fill(~mask[:, :, None], float("-inf"))
        scores = scores.view(b, kv_heads, group * q, -1)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return matmul(probs, value).view(b, kv_heads, group, q, dim).reshape(b, heads, q, dim)


def _compact(m: torch.Tensor) -> torch.Tensor:
    """A cache slice [b, kv_heads, kv, dim] copied to contiguous memory, unless it is large.

    The cache hands attention the first kv positions of a buffer `capacity` long, so its heads are
    not kv rows apart, and PyTorch's CPU bf16 batched matmul is several times slower on such a slice
    than a copy followed by the product (the keys copied as [kv, dim] and then viewed transposed;
    copying the transposed view itself is slow too). One query group, 3 KV heads, 2 threads (AMD
    EPYC, AVX512-BF16), scores plus values:

        rows x keys    strided   copy first   per head
        1 x 1,000      0.24      0.10         0.18 ms
        8 x 1,000      1.35      0.38         0.92
        48 x 1,000     8.2       3.8          7.9
        8 x 4,800      6.1       3.2          4.3
        48 x 4,800     90        73           26

    Past PER_HEAD_MIN_ELEMENTS the copy itself costs more than one 2-D product per (row, KV head),
    which reads the slice in place (`_per_head_matmul`)."""
    if m.is_contiguous() or m.numel() >= PER_HEAD_MIN_ELEMENTS:
        return m
    return m.contiguous()


def _per_head_matmul(a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """a @ m over [batch, kv_heads]; a large strided cache slice m is read in place, one 2-D
    product per (row, KV head) (see `_compact`)."""
    strided = not (m.is_contiguous() or m.transpose(-1, -2).is_contiguous())
    if not strided:
        return torch.matmul(a, m)
    return torch.stack(
        [torch.stack([a[i, h] @ m[i, h] for h in range(m.shape[1])]) for i in range(m.shape[0])]
    )


PER_HEAD_MIN_ELEMENTS = 24 * 1024 * 1024


def _grouped_pays(query: torch.Tensor) -> bool:
    return (
        query.shape[2] == 1
        and query.device.type == "cpu"
        and query.dtype in (torch.bfloat16, torch.float16)
        and not torch.is_grad_enabled()  # inference only: training keeps SDPA's numerics and backward
        and os.environ.get("DRAFTSMITH_CPU_ATTN", "1") != "0"
    )


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [b, heads, T, dim]
    key: torch.Tensor,  # [b, kv_heads, T, dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # the block-diagonal [b, 1, T, T] mask; unused with runs
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    packed_runs: list[list[tuple[int, int]]] | None = None,  # per row, (start, end) of each example
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention inside each (start, end) run of each row; without runs, `gqa_sdpa`."""
    if packed_runs is None or kwargs.get("softcap") is not None:
        return gqa_sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    gqa = key.shape[1] != query.shape[1]
    out = torch.empty_like(query)
    for r, runs in enumerate(packed_runs):
        for a, e in runs:
            out[r : r + 1, :, a:e] = F.scaled_dot_product_attention(
                query[r : r + 1, :, a:e],
                key[r : r + 1, :, a:e],
                value[r : r + 1, :, a:e],
                scale=scaling,
                is_causal=True,
                enable_gqa=gqa,
            )
    return out.transpose(1, 2).contiguous(), None


PACKED_NAME = "draftsmith_packed_sdpa"

AttentionInterface.register(NAME, gqa_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)
AttentionInterface.register(PACKED_NAME, packed_sdpa)
AttentionMaskInterface.register(PACKED_NAME, sdpa_mask)
