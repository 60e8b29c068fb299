"""The TTT objective against a brute-force reference that unrolls each anchor's chain separately
through `Eagle3Model.forward` (explicit keys/values, as chain drafting does at inference)."""

import pytest
import torch
from tiny import VOCAB, tiny_target

from draftsmith.drafters.eagle3 import Eagle3Model, make_config
from draftsmith.train.eagle3_objective import count_positions, ttt_loss

S = 3
DRAFT_VOCAB = 40


pytestmark = pytest.mark.usefixtures("one_thread")


def _setup(seed: int = 0, T: int = 12):
    target = tiny_target("llama")
    target.model.requires_grad_(False)  # as the trainer freezes the target (and so the embedding)
    torch.manual_seed(seed)
    cfg = make_config(target.model.config, DRAFT_VOCAB, feature_layers=[0, 0, 1])
    model = Eagle3Model(cfg, target.model.get_input_embeddings())
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.set_vocab_map(torch.randperm(VOCAB)[:DRAFT_VOCAB])
    ids = torch.randint(0, VOCAB, (1, T))
    loss_mask = (torch.rand(1, T) < 0.8).long()
    features = torch.randn(1, T, 3, 64)
    # Sharp logits whose argmax is in the draft vocab at most (not all) positions.
    logits = torch.randn(1, T, VOCAB)
    in_draft = model.draft_to_target()
    for t in range(T):
        if t % 4 != 3:
            logits[0, t, in_draft[t % DRAFT_VOCAB]] += 5.0
    return model, ids, loss_mask, features, logits


def _reference(model, ids, loss_mask, features, logits, steps):
    """Per (step, anchor): logits from a chain run anchor by anchor; loss summed then normalised."""
    T = ids.shape[1]
    g = model.fuse(features)
    lg0, h0, k0, v0 = model(ids[:, 1:], g[:, : T - 1], torch.arange(T - 1)[None])
    out = {(0, t): lg0[0, t] for t in range(T - 1)}
    for t in range(T - 1):
        h, keys, values = h0[:, t : t + 1], k0[:, :, : t + 1], v0[:, :, : t + 1]
        for s in range(1, steps):
            if t + 1 + s >= T:
                break
            lg, h, k, v = model(ids[:, t + 1 + s : t + 2 + s], h, torch.tensor([[t + s]]), keys, values)
            keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
            out[(s, t)] = lg[0, 0]
    draft_ids = model.draft_to_target()
    total, counts = 0.0, []
    for s in range(steps):
        acc, n = 0.0, 0
        for t in range(T - 2 - s):
            if not loss_mask[0, t + 2 + s] or not model.t2d[logits[0, t + 1 + s].argmax()]:
                continue
            p = torch.softmax(logits[0, t + 1 + s, draft_ids], -1)
            acc = acc - (p * torch.log_softmax(out[(s, t)], -1)).sum()
            n += 1
        counts.append(n)
        total = total + 0.8**s * acc / max(n, 1)
    return total, out, counts


def test_matches_brute_force_reference():
    model, ids, lm, feats, logits = _setup()
    ref_loss, ref_logits, ref_counts = _reference(model, ids, lm, feats, logits, S)
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    embed = model.embed_tokens.weight
    res = ttt_loss(model, ids, lm, feats, logits, ttt_steps=S, return_logits=True)
    res.loss.backward()
    assert embed.grad is None and all(p is not embed for p in model.parameters())
    assert res.counts.tolist() == ref_counts and min(ref_counts) > 0
    assert torch.allclose(res.loss, ref_loss, atol=1e-5, rtol=1e-5)
    for (s, t), lg in ref_logits.items():
        assert torch.allclose(res.logits[s][0, t], lg, atol=1e-5), (s, t)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, ref_grads[n], atol=1e-5, rtol=1e-4), n
    assert count_positions(model, lm, logits, S).tolist() == ref_counts


def test_packed_rows_equal_separate_examples():
    model, ids, lm, feats, logits = _setup(seed=1, T=16)
    cut = 9  # example A = [:9], example B = [9:14], then 2 padding tokens
    segments = torch.tensor([[0] * cut + [1] * 5 + [-1] * 2])
    positions = torch.tensor([list(range(cut)) + list(range(5)) + [0, 1]])
    lm = lm.clone()
    lm[0, 14:] = 0
    packed = ttt_loss(model, ids, lm, feats, logits, ttt_steps=S, segments=segments, positions=positions)
    parts = [slice(0, cut), slice(cut, 14)]
    sep = [ttt_loss(model, ids[:, p], lm[:, p], feats[:, p], logits[:, p], ttt_steps=S) for p in parts]
    counts = sep[0].counts + sep[1].counts
    assert packed.counts.tolist() == counts.tolist()
    sums = sep[0].step_loss * sep[0].counts + sep[1].step_loss * sep[1].counts
    assert torch.allclose(packed.step_loss * packed.counts, sums, atol=1e-4)
    assert packed.correct.tolist() == (sep[0].correct + sep[1].correct).tolist()


def test_rows_of_a_batch_equal_separate_rows():
    """Two packed rows in one batch give what each gives alone (rows must not mix)."""
    model, ids, lm, feats, logits = _setup(seed=4, T=16)
    other = _setup(seed=5, T=16)[1:]
    segments = torch.tensor([[0] * 10 + [1] * 6, [0] * 16])
    positions = torch.tensor([list(range(10)) + list(range(6)), list(range(16))])
    both = ttt_loss(
        model, torch.cat([ids, other[0]]), torch.cat([lm, other[1]]), torch.cat([feats, other[2]]),
        torch.cat([logits, other[3]]), ttt_steps=S, segments=segments, positions=positions,
    )  # fmt: skip
    rows = [(ids, lm, feats, logits), other]
    sep = [
        ttt_loss(model, *row, ttt_steps=S, segments=segments[i : i + 1], positions=positions[i : i + 1])
        for i, row in enumerate(rows)
    ]
    sums = sep[0].step_loss * sep[0].counts + sep[1].step_loss * sep[1].counts
    assert both.counts.tolist() == (sep[0].counts + sep[1].counts).tolist()
    assert torch.allclose(both.step_loss * both.counts, sums, atol=1e-4)


def test_global_counts_normalise_each_step():
    model, ids, lm, feats, logits = _setup(seed=2)
    local = ttt_loss(model, ids, lm, feats, logits, ttt_steps=S)
    doubled = ttt_loss(model, ids, lm, feats, logits, ttt_steps=S, counts=2 * local.counts)
    assert torch.allclose(doubled.loss, local.loss / 2, atol=1e-6)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("steps", [1, 7])
def test_bf16_autocast_runs_and_is_close(steps):
    model, ids, lm, feats, logits = _setup(seed=3, T=20)
    ref = ttt_loss(model, ids, lm, feats, logits, ttt_steps=steps)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        res = ttt_loss(model, ids, lm, feats.bfloat16(), logits.bfloat16(), ttt_steps=steps)
    res.loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert abs(res.loss.item() - ref.loss.item()) < 0.05 * ref.loss.item()
