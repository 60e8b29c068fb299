"""MTP objective: step 0 is the plain causal head scored by soft cross-entropy, the unrolled steps
see exactly what chain drafting sees, packing and loss masks decide what is counted, and training a
head for a target without one (Llama) lowers the loss."""

import torch
from tiny import tiny_target

from draftsmith.drafters.draft_kv import DraftKV
from draftsmith.drafters.mtp import build_head
from draftsmith.train.mtp_objective import count_positions, mtp_loss


def _setup(seed: int = 0, T: int = 14):
    t = tiny_target("llama", seed=seed, scale=3.0)
    t.model.requires_grad_(False)
    head = build_head(t, init="last_layer", seed=seed)
    ids = torch.randint(0, 96, (2, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = t.model(input_ids=ids, output_hidden_states=True)
    return t, head, ids, out.hidden_states[-1], out.logits  # hidden_states[-1] is the final-normed state


def test_step0_is_causal_head_with_soft_cross_entropy():
    _, head, ids, hidden, logits = _setup()
    mask = torch.ones_like(ids)
    res = mtp_loss(head, ids, mask, hidden, logits, steps=1)
    T = ids.shape[1]
    with torch.no_grad():
        own, _ = head(ids[:, 1:], hidden[:, :-1], torch.arange(T - 1).expand(2, -1))
    # Anchor t predicts x_{t+2}: scored against the target's row t+1, anchors 0..T-3.
    p = torch.softmax(logits[:, 1 : T - 1], -1)
    want = -(p * torch.log_softmax(own[:, : T - 2], -1)).sum(-1).sum() / (2 * (T - 2))
    assert torch.allclose(res.loss, want, atol=1e-5)
    assert res.counts.tolist() == [2 * (T - 2)]


def test_unrolled_step_matches_chain_drafting():
    """Step 1 at anchor t equals the drafter: paired positions 0..t in the head's cache, then one step
    fed the head's own h' and the true token x_{t+2} at position t+1."""
    _, head, ids, hidden, logits = _setup(seed=1)
    res = mtp_loss(head, ids, torch.ones_like(ids), hidden, logits, steps=3, return_logits=True)
    row, t = 1, 6
    with torch.no_grad():
        cache = DraftKV()
        _, h = head(
            ids[row : row + 1, 1 : t + 2], hidden[row : row + 1, : t + 1], torch.arange(t + 1)[None], cache
        )
        for s in (1, 2):
            cache.start = t + s
            lg, h = head(ids[row : row + 1, t + 1 + s][:, None], h[:, -1:], torch.tensor([[t + s]]), cache)
            assert torch.allclose(res.logits[s][row, t], lg[0, 0], atol=1e-4)


def test_counts_follow_loss_mask_and_packing():
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1]])
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    # step 0 scores anchors t with x_{t+2} assistant and in t's example: t=0,1 (targets 2,3), t=4 (x6 is
    # masked out), t=5 (x7); t=2,3 cross into example 1.
    assert count_positions(mask, segments, 2).tolist() == [3, 2]


def test_training_a_head_for_llama_lowers_the_loss():
    """Against a peaked target (the true next tokens) the loss starts high and must fall."""
    t, head, ids, hidden, _ = _setup(seed=2)
    peaked = torch.nn.functional.one_hot(torch.roll(ids, -1, 1), 96).float() * 20.0  # row t -> x_{t+1}
    mask = torch.ones_like(ids)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        res = mtp_loss(head, ids, mask, hidden, peaked, steps=2)
        opt.zero_grad()
        res.loss.backward()
        opt.step()
        losses.append(float(res.loss.detach()))
    assert losses[-1] < 0.3 * losses[0]
    assert all(p.grad is None for p in t.model.parameters())
