"""`RaggedCache`: per-row lengths (`advance`), tree branches moved next to the committed tokens
(`move`), rows that join into spare rows (`grow`) and leave by moving the last rows into the holes
(`keep_rows`), and the recurrent state of hybrid targets saved and put back (`snapshot_state`,
`restore_state`); the committed keys/values of every kept row survive all of it."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_target

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


def _hybrid_cache(batch: int, capacity: int) -> RaggedCache:
    """Layer 0 attention, layer 1 linear attention with conv/recurrent state already recorded."""
    cache = RaggedCache(
        batch=batch, capacity=capacity, attention_layers=[0], linear_layers=[1],
        kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip
    cache.conv[1] = torch.randn(batch, 3, 4)  # [batch, channels, kernel]
    cache.recurrent[1] = torch.randn(batch, 2, 4, 4)  # [batch, heads, dk, dv]
    return cache


def test_advance_moves_one_row_and_the_next_forward_writes_past_it() -> None:
    cache = _cache(2, 8)
    cache.advance(1, 3)
    cache.advance(1, 2)
    assert cache.lengths.tolist() == [0, 5] and cache.get_seq_length() == 5
    assert cache.begin(None, 2).tolist() == [[0, 1], [5, 6]]
    keys = torch.arange(2 * 2 * 2 * 4, dtype=torch.float32).reshape(2, 2, 2, 4) + 1  # [b, heads, q, dim]
    k, _ = cache.update(keys, keys, 0)
    cache.end()
    assert k.shape == (2, 2, 7, 4)  # up to the longest row's end
    torch.testing.assert_close(cache.keys[0][0, :, 0:2], keys[0])
    torch.testing.assert_close(cache.keys[0][1, :, 5:7], keys[1])
    assert cache.keys[0][1, :, :5].abs().sum() == 0  # row 1's committed positions are not overwritten
    assert cache.begin(torch.tensor([1]), 3).tolist() == [[5, 6, 7]]
    cache.end()
    with pytest.raises(RuntimeError, match="capacity"):
        cache.begin(torch.tensor([1]), 4)


def test_move_copies_a_branch_next_to_the_committed_tokens_of_one_row() -> None:
    torch.manual_seed(0)
    cache = _cache(2, 10)
    committed = _fill(cache, 0, 2)
    scratch = torch.randn(2, 5, 4)  # a forward's tree entries past row 0's length, offsets 0..4
    for store in (cache.keys, cache.values):
        for t in store.values():
            t[0, :, 2:7] = scratch
    other = cache.keys[0][1].clone()
    cache.move(0, src=[0, 3, 4], dst=[0, 1, 2])  # keep the branch at offsets 0, 3, 4
    for store in (cache.keys, cache.values):
        for t in store.values():
            torch.testing.assert_close(t[0, :, :2], committed)
            torch.testing.assert_close(t[0, :, 2:5], scratch[:, [0, 3, 4]])
    torch.testing.assert_close(cache.keys[0][1], other)


def test_move_onto_overlapping_offsets_reads_before_it_writes() -> None:
    cache = _cache(1, 8)
    cache.keys[0][0, :, :4] = torch.arange(4.0)[None, :, None]
    cache.move(0, src=[2, 3], dst=[1, 2])  # offset 2 is both read and written
    assert cache.keys[0][0, 0, :4, 0].tolist() == [0.0, 2.0, 3.0, 3.0]


def test_grow_gives_new_rows_no_length_and_no_recurrent_state() -> None:
    torch.manual_seed(0)
    cache = _hybrid_cache(3, 8)
    cache.advance(0, 4)
    row0 = (cache.conv[1][0].clone(), cache.recurrent[1][0].clone())
    cache.keep_rows([0])  # rows 1 and 2 leave; their state stays in the spare rows
    cache.grow(2, 8)  # and two rows join there: they must not inherit it
    assert cache.lengths.tolist() == [4, 0, 0] and cache.allocated_rows == 3
    assert cache.conv[1][1:3].abs().sum() == 0 and cache.recurrent[1][1:3].abs().sum() == 0
    cache.grow(1, 4)  # reallocated (more rows); a smaller capacity never shrinks the cache
    assert cache.capacity == 8 and cache.allocated_rows == 6 and cache.lengths.tolist() == [4, 0, 0, 0]
    torch.testing.assert_close(cache.conv[1][0], row0[0])
    torch.testing.assert_close(cache.recurrent[1][0], row0[1])
    assert cache.recurrent[1][3:].abs().sum() == 0


@pytest.mark.parametrize("order", [[2, 1], [1, 0]])  # in place (row 2 into hole 0), then a gather
def test_keep_rows_carries_conv_and_recurrent_state(order: list[int]) -> None:
    torch.manual_seed(0)
    cache = _hybrid_cache(3, 8)
    want = [(cache.conv[1][r].clone(), cache.recurrent[1][r].clone()) for r in order]
    cache.keep_rows(order)
    for dst, (conv, rec) in enumerate(want):
        torch.testing.assert_close(cache.conv[1][dst], conv)
        torch.testing.assert_close(cache.recurrent[1][dst], rec)


def test_restore_state_puts_back_only_the_rows_asked_for() -> None:
    torch.manual_seed(0)
    cache = _hybrid_cache(3, 8)
    before = cache.snapshot_state()
    assert cache.snapshot_state()["recurrent"][1] is not cache.recurrent[1]  # a copy, not a view
    cache.conv[1].add_(1.0)
    cache.recurrent[1].add_(1.0)
    cache.conv[2] = torch.ones(3, 3, 4)  # a layer whose state began after the snapshot
    cache.restore_state(before, [0, 2])
    for r in (0, 2):
        torch.testing.assert_close(cache.conv[1][r], before["conv"][1][r])
        torch.testing.assert_close(cache.recurrent[1][r], before["recurrent"][1][r])
        assert cache.conv[2][r].abs().sum() == 0
    torch.testing.assert_close(cache.recurrent[1][1], before["recurrent"][1][1] + 1.0)
    assert cache.conv[2][1].eq(1.0).all()


def test_snapshot_restore_and_replay_on_a_hybrid_target_equals_a_run_without_the_rejected_tokens() -> None:
    """The engine's rollback on Gated DeltaNet layers: verify 3 tokens, keep 1 on row 1 only."""
    target = tiny_target("qwen3_5")
    prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    draft = torch.tensor([[1, 2, 3], [4, 5, 6]])

    def after(*chunks: torch.Tensor) -> RaggedCache:
        cache = target.new_cache(2, 16)
        for ids in chunks:
            target.forward(cache, ids)
            for row in range(2):
                cache.advance(row, ids.shape[1])
        return cache

    cache = after(prompt)
    assert cache.has_recurrent_state and cache.recurrent
    snap = cache.snapshot_state()
    target.forward(cache, draft)
    verified = {i: t[1].clone() for i, t in cache.recurrent.items()}
    cache.restore_state(snap, [1])  # outside inference mode, though the forward made inference tensors
    target.forward(cache, draft[[1], :1], rows=torch.tensor([1]))  # replay the one kept token

    full, kept = after(prompt, draft), after(prompt, draft[:, :1])
    for i in cache.recurrent:
        torch.testing.assert_close(cache.recurrent[i][0], full.recurrent[i][0])
        torch.testing.assert_close(cache.conv[i][0], full.conv[i][0])
        torch.testing.assert_close(cache.recurrent[i][1], kept.recurrent[i][1])
        torch.testing.assert_close(cache.conv[i][1], kept.conv[i][1])
        assert not torch.allclose(verified[i], kept.recurrent[i][1])  # the rollback was needed
