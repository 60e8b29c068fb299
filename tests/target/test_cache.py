"""`RaggedCache`: rows join into spare rows, leave by moving the last rows into the holes, and the
committed keys/values of every kept row survive both, whatever order is asked for."""

from __future__ import annotations

import pytest
import torch

from draftsmith.decoding.engine import fill_holes
from draftsmith.target.cache import RaggedCache


def _cache(batch: int, capacity: int) -> RaggedCache:
    return RaggedCache(
        batch=batch, capacity=capacity, attention_layers=[0, 1], linear_layers=[],
        kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip


def _fill(cache: RaggedCache, row: int, n: int) -> torch.Tensor:
    """Write n committed positions of recognisable values into a row; returns them [2, n, 4]."""
    vals = torch.randn(2, n, 4)
    for store in (cache.keys, cache.values):
        for t in store.values():
            t[row, :, :n] = vals
    cache.lengths[row] = n
    return vals


def _committed(cache: RaggedCache, row: int) -> torch.Tensor:
    n = int(cache.lengths[row])
    return cache.keys[0][row, :, :n]


@pytest.mark.parametrize("order", [[0, 3, 2], [3, 1], [2, 0, 1], [1]])
def test_keep_rows_keeps_committed_entries_in_the_order_asked(order: list[int]) -> None:
    torch.manual_seed(0)
    cache = _cache(4, 8)
    want = {r: _fill(cache, r, 2 + r) for r in range(4)}
    cache.keep_rows(order)
    assert cache.batch == len(order) and cache.lengths.tolist() == [2 + r for r in order]
    for dst, src in enumerate(order):
        torch.testing.assert_close(_committed(cache, dst), want[src])
        torch.testing.assert_close(cache.values[1][dst, :, : 2 + src], want[src])


def test_joining_rows_reuse_spare_rows_and_growth_is_geometric() -> None:
    torch.manual_seed(0)
    cache = _cache(3, 8)
    kept = _fill(cache, 2, 5)
    buffer = cache.keys[0]
    cache.keep_rows(fill_holes([2]))  # rows 0 and 1 leave: row 2 moves to 0
    cache.grow(2, 8)  # two rows join into the spare rows: no new buffers
    assert cache.keys[0] is buffer and cache.batch == 3 and cache.lengths.tolist() == [5, 0, 0]
    torch.testing.assert_close(_committed(cache, 0), kept)
    cache.grow(1, 8)  # a fourth row: the buffers double their rows
    assert cache.allocated_rows == 6 and cache.batch == 4
    torch.testing.assert_close(_committed(cache, 0), kept)
    cache.grow(0, 20)  # longer rows: reallocated, contents kept
    assert cache.capacity == 20 and cache.keys[0].shape[2] == 20
    torch.testing.assert_close(_committed(cache, 0), kept)


def test_forward_writes_only_the_live_rows() -> None:
    cache = _cache(4, 8)
    cache.keep_rows([0, 1])
    cache.begin(None, 3)
    k, v = cache.update(torch.ones(2, 2, 3, 4), torch.ones(2, 2, 3, 4), 0)
    cache.end()
    assert k.shape == (2, 2, 3, 4)
    assert cache.keys[0][2:].abs().sum() == 0  # spare rows untouched


def test_fill_holes_moves_only_rows_past_the_new_size() -> None:
    assert fill_holes([0, 1, 2]) == [0, 1, 2]
    assert fill_holes([1, 2, 3]) == [3, 1, 2]
    assert fill_holes([4]) == [4]
