"""The target pass over packed rows equals running each example on its own."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_target

from draftsmith.data.tokenize import Example
from draftsmith.target import attention
from draftsmith.train.data import pack
from draftsmith.train.target_pass import target_pass


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
def test_packed_rows_equal_examples_alone(kind, monkeypatch):
    target = tiny_target(kind, vocab=64)
    g = torch.Generator().manual_seed(5)
    examples = [
        Example(input_ids=torch.randint(3, 60, (n,), generator=g).tolist(), loss_mask=[1] * n)
        for n in (9, 23, 4, 14, 6)
    ]
    calls = []
    kernel = attention.packed_sdpa
    monkeypatch.setattr(
        attention, "packed_sdpa", lambda *a, **kw: calls.append(kw.get("packed_runs")) or kernel(*a, **kw)
    )
    attention.AttentionInterface.register(attention.PACKED_NAME, attention.packed_sdpa)
    batch = pack(examples, max_len=30)  # several examples per row, one row padded
    assert batch.input_ids.shape[0] > 1 and (batch.segments[:, 1:] != batch.segments[:, :-1]).any()
    feats, logits = target_pass(target, batch, [0, 1])
    assert calls and all(runs is not None for runs in calls)  # the per-example kernel ran
    for j, ex in enumerate(examples):
        alone = pack([ex], max_len=30)
        f1, l1 = target_pass(target, alone, [0, 1])
        rows, cols = (batch.segments == j).nonzero(as_tuple=True)
        torch.testing.assert_close(feats[rows, cols], f1[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(logits[rows, cols], l1[0], atol=1e-5, rtol=1e-4)
