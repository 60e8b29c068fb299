"""The fused, chunked LM head + soft cross-entropy equals the plain autograd form."""

import pytest
import torch

from draftsmith.train import soft_ce
from draftsmith.train.soft_ce import soft_cross_entropy


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("as_logits", [False, True])
def test_matches_plain_form_in_loss_argmax_and_gradients(monkeypatch, frozen, as_logits):
    monkeypatch.setattr(soft_ce, "CHUNK", 3)  # several chunks and a ragged last one
    g = torch.Generator().manual_seed(0)
    n, h, v = 7, 5, 11
    x = torch.randn(n, h, generator=g, dtype=torch.float32, requires_grad=True)
    w = torch.randn(v, h, generator=g, dtype=torch.float32, requires_grad=not frozen)
    t_logits = torch.randn(n, v, generator=g, dtype=torch.float32)
    p = torch.softmax(t_logits, -1)

    kw = {"p_logits": t_logits} if as_logits else {"p": p}
    loss, top = soft_cross_entropy(x, w, **kw)
    loss.backward()

    x2 = x.detach().clone().requires_grad_(True)
    w2 = w.detach().clone().requires_grad_(not frozen)
    z = x2 @ w2.t()
    ref = -(p * torch.log_softmax(z, -1)).sum()
    ref.backward()

    torch.testing.assert_close(loss, ref)
    assert torch.equal(top, z.argmax(-1))
    torch.testing.assert_close(x.grad, x2.grad)
    if frozen:
        assert w.grad is None
    else:
        torch.testing.assert_close(w.grad, w2.grad)


def test_needs_exactly_one_target():
    x, w = torch.zeros(2, 3), torch.zeros(4, 3)
    with pytest.raises(ValueError):
        soft_cross_entropy(x, w)
    with pytest.raises(ValueError):
        soft_cross_entropy(x, w, torch.zeros(2, 4), p_logits=torch.zeros(2, 4))
