"""Training from offline features sees exactly what the online target pass gives."""

from __future__ import annotations

import torch
from tiny import tiny_target

from draftsmith.data.features import FeatureStore, write_features
from draftsmith.data.tokenize import Example
from draftsmith.train.data import pack
from draftsmith.train.target_pass import stored_pass, target_pass


def test_stored_pass_equals_online_pass(tmp_path):
    target = tiny_target("llama", vocab=64)
    g = torch.Generator().manual_seed(3)
    examples = [
        Example(input_ids=torch.randint(3, 60, (n,), generator=g).tolist(), loss_mask=[1] * n)
        for n in (7, 19, 4, 30, 11)
    ]
    layers = [0, 1]
    write_features(target, examples, layers, tmp_path / "f", dtype=torch.float32, progress=False)
    store = FeatureStore.open(tmp_path / "f", examples, layers)
    mine = [3, 0, 2]  # a rank's shard of the global batch, in store indices
    batch = pack([examples[i] for i in mine], max_len=40)
    want_f, want_l = target_pass(target, batch, layers)
    got_f, got_l = stored_pass(target, store, batch, mine, layers)
    real = batch.segments >= 0
    torch.testing.assert_close(got_f[real], want_f[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_l[real], want_l[real], atol=1e-4, rtol=1e-4)
