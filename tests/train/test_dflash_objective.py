"""DFlash objective: anchors, the block mask, loss weights, and the packed chunked loss equal to
running every block separately through the drafting forward."""

import math

import pytest
import torch
from tiny import VOCAB, tiny_target

from draftsmith.drafters.dflash import DFlashModel, make_config
from draftsmith.train import dflash_objective as obj
from draftsmith.train.dflash_objective import Blocks, block_mask, dflash_loss, loss_weights, sample_blocks

pytestmark = pytest.mark.usefixtures("one_thread")


def test_loss_weights():
    w = loss_weights(16, 7.0)
    assert w.shape == (15,) and w[0] == 1.0
    assert math.isclose(float(w[7]), math.exp(-1.0), rel_tol=1e-6)  # slot j = 8: exp(-(8-1)/7)
    assert bool((w[1:] < w[:-1]).all())


def test_anchors_among_assistant_tokens_with_a_next_assistant_token():
    ids = torch.arange(10)[None]
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1, 1, 1]])
    seg = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1, -1]])
    assert obj.anchor_candidates(mask, seg).nonzero()[:, 1].tolist() == [2, 3, 6, 7]
    blocks = sample_blocks(ids, mask, seg, block_size=3, n_anchors=10, seeds={0: 1, 1: 2})
    assert blocks.anchors.tolist() == [[2, 3, 6, 7]]
    # labels: x_{a+1}, x_{a+2} when in the same example and assistant
    assert blocks.counted.tolist() == [[[True, True], [True, False], [True, True], [True, False]]]
    assert blocks.labels[0, 0].tolist() == [3, 4] and blocks.labels[0, 3].tolist() == [8, 0]
    # at most n_anchors per example, the same ones for the same seed
    few = sample_blocks(ids, mask, seg, block_size=3, n_anchors=1, seeds={0: 1, 1: 2})
    assert few.anchors.shape == (1, 2) and few.anchors[0, 0] in (2, 3) and few.anchors[0, 1] in (6, 7)
    again = sample_blocks(ids, mask, seg, block_size=3, n_anchors=1, seeds={0: 1, 1: 2})
    assert torch.equal(few.anchors, again.anchors)


def test_block_mask_layout():
    seg = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    blocks = Blocks(
        anchors=torch.tensor([[2, 5]]),
        valid=torch.tensor([[True, True]]),
        labels=torch.zeros(1, 2, 1, dtype=torch.long),
        counted=torch.ones(1, 2, 1, dtype=torch.bool),
    )
    m = block_mask(blocks, seg)[0].int()  # [N*B = 4, T + 4 = 11]
    T = 7
    # block 0 (anchor 2, example 0): context positions 0, 1; itself (cols T, T+1), bidirectionally
    assert m[0].tolist() == [1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert m[1].tolist() == m[0].tolist()
    # block 1 (anchor 5, example 1): context position 4 only (not example 0, not the anchor itself)
    assert m[2].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1]
    assert m[3, T : T + 2].sum() == 0  # nothing across blocks


@pytest.mark.parametrize("chunk", [2, 512])
def test_packed_loss_equals_separate_block_forwards(monkeypatch, chunk):
    monkeypatch.setattr(obj, "ATTENTION_CHUNK", chunk)  # 2 query tokens: one block per chunk
    t = tiny_target("llama", scale=4.0)
    torch.manual_seed(0)
    B = 3
    cfg = make_config(
        t.model.config, layers=2, block_size=B, mask_token_id=VOCAB - 1, target_layer_ids=[0, 1]
    )
    m = DFlashModel(cfg, t.model.get_input_embeddings(), t.model.get_output_embeddings())
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.normal_(std=0.2)
    # two examples packed in one row: [0..5] and [6..10]
    ids = torch.randint(0, VOCAB - 1, (1, 11))
    seg = torch.tensor([[0] * 6 + [1] * 5])
    pos = torch.tensor([list(range(6)) + list(range(5))])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1]])
    feats = []
    for s in (slice(0, 6), slice(6, 11)):
        with torch.no_grad():
            hs = t.model(input_ids=ids[:, s], output_hidden_states=True).hidden_states
        feats.append(torch.stack([hs[1][0], hs[2][0]], dim=1))
    feats = torch.cat(feats)[None]  # [1, T, 2, H]
    blocks = sample_blocks(ids, mask, seg, block_size=B, n_anchors=8, seeds={0: 0, 1: 0})
    res = dflash_loss(m, ids, feats, blocks, segments=seg, positions=pos, gamma=2.0)
    res.loss.backward()
    grad = m.fc.weight.grad.clone()
    m.zero_grad()

    # Reference: each block alone through the drafting forward, context = its example before the anchor.
    w = loss_weights(B, 2.0)
    total, norm = 0.0, 0.0
    for i, a in enumerate(blocks.anchors[0].tolist()):
        start = 0 if a < 6 else 6
        kv = m.context_kv(m.fuse(feats[:, start:a]), pos[:, start:a])
        block = torch.tensor([[int(ids[0, a])] + [VOCAB - 1] * (B - 1)])
        p0 = int(pos[0, a])
        logits = m.logits(m(block, torch.arange(p0, p0 + B)[None], kv)[0, 1:])
        for j in range(B - 1):
            if blocks.counted[0, i, j]:
                ce = torch.nn.functional.cross_entropy(logits[j : j + 1], blocks.labels[0, i, j : j + 1])
                total = total + w[j] * ce
                norm += float(w[j])
    ref = total / norm
    assert torch.allclose(res.loss, ref, atol=1e-5)
    ref.backward()
    assert torch.allclose(grad, m.fc.weight.grad, atol=1e-5)
    assert res.counts.tolist() == blocks.counts().tolist()
