import torch

from draftsmith.drafters.draft_kv import DraftKV, causal_mask


def _kv(n: int, fill: float) -> torch.Tensor:
    return torch.full((1, 2, n, 4), fill)


def test_writes_land_at_their_positions_and_survive_growth():
    kv = DraftKV()
    kv.write(0, _kv(200, 1.0), _kv(200, -1.0))
    kv.write(200, _kv(100, 2.0), _kv(100, -2.0))  # past the first capacity (256): the buffer grows
    k, v = kv.view(300)
    assert k.shape == (1, 2, 300, 4) and kv.k[0].shape[2] >= 300
    assert (k[:, :, :200] == 1).all() and (k[:, :, 200:] == 2).all() and (v[:, :, 200:] == -2).all()


def test_rolling_back_is_writing_over():
    kv = DraftKV()
    kv.write(0, _kv(5, 1.0), _kv(5, 1.0))
    kv.write(5, _kv(3, 9.0), _kv(3, 9.0))  # speculative positions 5..7
    kv.write(5, _kv(1, 3.0), _kv(1, 3.0))  # rejected: the next write lands on them
    k, _ = kv.view(6)
    assert k[0, 0, :, 0].tolist() == [1, 1, 1, 1, 1, 3]


def test_layers_are_separate_and_update_follows_start():
    kv = DraftKV(layers=2)
    kv.write(0, _kv(2, 1.0), _kv(2, 1.0), layer=0)
    kv.write(0, _kv(2, 5.0), _kv(2, 5.0), layer=1)
    kv.start = 2
    k, v = kv.update(_kv(1, 7.0), _kv(1, 7.0), layer_idx=1)
    assert k[0, 0, :, 0].tolist() == [5, 5, 7] and kv.view(2, 0)[0][0, 0, :, 0].tolist() == [1, 1]
    one = DraftKV()  # a one-layer cache takes any layer index (MTP's layer keeps the target's)
    one.update(_kv(1, 4.0), _kv(1, 4.0), layer_idx=29)
    assert one.view(1)[0][0, 0, 0, 0] == 4


def test_causal_mask():
    assert causal_mask(0, 3, "cpu") is None and causal_mask(4, 1, "cpu") is None
    m = causal_mask(2, 2, "cpu")
    assert m.shape == (1, 1, 2, 4)
    assert m[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
