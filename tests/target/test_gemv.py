"""`GemvLinear`: the one-row `torch.mv` path agrees with `F.linear`, and only CPU bf16 switches."""

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.target.gemv import GemvLinear, use_gemv


def _net(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False)).to(dtype)


def test_one_row_uses_mv_and_agrees_with_linear(monkeypatch):
    net = _net(torch.bfloat16)
    ref = [m.weight.clone() for m in net if isinstance(m, nn.Linear)]
    assert use_gemv(net) == 2
    assert all(type(m) is GemvLinear for m in net if isinstance(m, nn.Linear))
    calls = []
    real_mv = torch.mv
    monkeypatch.setattr(torch, "mv", lambda w, x: calls.append(1) or real_mv(w, x))
    x = torch.randn(1, 1, 16).bfloat16()
    with torch.inference_mode():
        y = net(x)
        lin = net[0]
        expect = F.linear(x, lin.weight, lin.bias)
        torch.testing.assert_close(lin(x), expect, rtol=2e-2, atol=2e-2)
    assert y.shape == (1, 1, 8) and len(calls) == 3  # two layers, plus the direct call
    assert all(torch.equal(a, m.weight) for a, m in zip(ref, [net[0], net[2]], strict=True))


def test_several_rows_and_training_take_the_stock_path(monkeypatch):
    net = _net(torch.bfloat16)
    use_gemv(net)
    monkeypatch.setattr(torch, "mv", lambda *a: (_ for _ in ()).throw(AssertionError("mv used")))
    lin = net[0]
    x = torch.randn(3, 16).bfloat16()
    with torch.inference_mode():
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
    one = torch.randn(1, 16).bfloat16()
    net(one).float().sum().backward()  # grad enabled: stock path, gradients flow
    assert net[0].weight.grad is not None


def test_float32_is_left_alone():
    net = _net(torch.float32)
    assert use_gemv(net) == 0
    assert all(type(m) is nn.Linear for m in net if isinstance(m, nn.Linear))
