"""`attend`: the grouped-matmul path for one CPU bf16 query equals SDPA's attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.target import attention
from draftsmith.target.attention import attend


def _inputs(q: int, kv: int, heads: int = 6, kv_heads: int = 2, dim: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(2, heads, q, dim, generator=g)
    key = torch.randn(2, kv_heads, kv, dim, generator=g)
    value = torch.randn(2, kv_heads, kv, dim, generator=g)
    mask = torch.rand(2, 1, q, kv, generator=g) > 0.3
    mask[..., 0] = True  # every query sees at least one key
    return query, key, value, mask


@pytest.mark.parametrize("kv", [1, 37])
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_path_matches_sdpa(kv: int, masked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    query, key, value, mask = _inputs(1, kv=kv)
    mask = mask if masked else None
    want = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True, scale=0.3)

    def no_sdpa(*args, **kwargs):
        raise AssertionError("the grouped path should not call SDPA")

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", no_sdpa)
    with torch.no_grad():
        got = attend(query.bfloat16(), key.bfloat16(), value.bfloat16(), mask, scale=0.3)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    # bf16 inputs and output: about 3 significant digits.
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


def test_float32_blocks_grad_and_opt_out_keep_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counting)
    query, key, value, mask = _inputs(1, kv=20)
    block = _inputs(4, kv=20)
    half = [t.bfloat16() for t in (query, key, value)]
    with torch.no_grad():
        attend(query, key, value, mask)  # float32
        attend(*[t.bfloat16() for t in block[:3]], block[3])  # a verification block of 4 queries
    attend(*half, mask)  # grad enabled: training
    monkeypatch.setenv("DRAFTSMITH_CPU_ATTN", "0")
    with torch.no_grad():
        attend(*half, mask)
    assert len(calls) == 4


@pytest.mark.parametrize("large", [False, True])
def test_cache_slice_gives_the_same_result_copied_or_per_head(
    large: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Keys and values as the cache hands them over: the first kv positions of a longer buffer.
    kv = 37
    query, _, _, mask = _inputs(1, kv=kv)
    g = torch.Generator().manual_seed(1)
    buffers = [torch.randn(2, 2, kv + 40, 16, generator=g).bfloat16() for _ in range(2)]
    key, value = (b[:, :, :kv] for b in buffers)
    assert not key.is_contiguous()
    # A small slice is copied before the batched products; past the limit it is read per head.
    monkeypatch.setattr(attention, "PER_HEAD_MIN_ELEMENTS", key.numel() if large else key.numel() + 1)
    with torch.no_grad():
        want = attend(query.bfloat16(), key.contiguous(), value.contiguous(), mask)
        real = torch.matmul
        strided = []

        def counting(a, b):
            contiguous = b.is_contiguous() or b.transpose(-1, -2).is_contiguous()
            strided.append(a.dim() > 2 and not contiguous)
            return real(a, b)

        monkeypatch.setattr(attention.torch, "matmul", counting)
        got = attend(query.bfloat16(), key, value, mask)
    assert not any(strided)  # batched matmul never saw a strided slice
    assert len(strided) == (0 if large else 2)  # per head: only 2-D products (`@`)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)
