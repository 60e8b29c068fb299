"""`PackedLinear`: oneDNN-packed products agree with `F.linear`, follow weight updates, and leave
training (autograd) on the stock path."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.target.packed import PackedLinear, can_pack, stock_linear, use_fast_linear


def _net(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_products_agree_with_linear(dtype):
    if not can_pack(dtype, torch.device("cpu")):
        pytest.skip(f"oneDNN does not run {dtype} here")
    net = _net(dtype)
    assert use_fast_linear(net) == 2 and all(type(m) is PackedLinear for m in (net[0], net[2]))
    with torch.inference_mode():
        for rows in (1, 3, 8, 40):
            x = torch.randn(2, rows, 16).to(dtype)
            expect = F.linear(x, net[0].weight, net[0].bias)
            if dtype == torch.bfloat16:
                assert torch.equal(net[0](x), expect)  # same bf16 kernel, packed or not
            else:
                torch.testing.assert_close(net[0](x), expect, rtol=1e-5, atol=1e-5)


def test_packed_weight_follows_updates_and_training_takes_the_stock_path():
    if not can_pack(torch.float32, torch.device("cpu")):
        pytest.skip("no oneDNN here")
    net = _net(torch.float32)
    use_fast_linear(net)
    lin, x = net[0], torch.randn(1, 16)
    with torch.inference_mode():
        before = lin(x)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    net(x).sum().backward()  # grad enabled: F.linear, gradients flow
    assert lin.weight.grad is not None
    opt.step()
    with torch.inference_mode():
        after = lin(x)
    assert not torch.allclose(before, after)  # repacked after the in-place update
    torch.testing.assert_close(after, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_switch_off_keeps_plain_linear(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_PACK", "0")
    net = _net(torch.float32)
    assert use_fast_linear(net) == 0 and all(type(m) is nn.Linear for m in (net[0], net[2]))


def test_stock_linear_restores_plain_layers_for_peers():
    net = _net(torch.float32)
    n = use_fast_linear(net)
    switched = type(net[0])
    with stock_linear(net):
        assert all(type(m) is nn.Linear for m in (net[0], net[2]))
    assert type(net[0]) is switched and (n == 0 or switched is not nn.Linear)
