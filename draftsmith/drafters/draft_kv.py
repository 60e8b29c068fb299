"""The keys/values a trained drafter keeps for one request: EAGLE-3's and MTP's one layer, DFlash's
context for each of its layers.

Keys and values live at absolute draft positions in a buffer that doubles when it fills. Writing at
a position below what was written before overwrites it, so rolling back speculative positions costs
nothing: the next write simply lands on them (the target's own cache works the same way). Memory
is allocated at the first write, from the shape of what is written, so a drafter needs no config to
make one.

`update` lets a layer that talks to a transformers-style cache (MTP's copy of a target decoder
layer) write through the same object: set `start` first, as the position of its first new key.
"""

from __future__ import annotations

import torch

_FIRST_CAPACITY = 256


class DraftKV:
    def __init__(self, layers: int = 1) -> None:
        self.k: list[torch.Tensor | None] = [None] * layers  # each [1, kv_heads, capacity, head_dim]
        self.v: list[torch.Tensor | None] = [None] * layers
        self.start = 0  # where `update` writes

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor, layer: int = 0) -> None:
        """Store k, v [1, kv_heads, n, head_dim] at positions start..start+n-1 of `layer`."""
        end = start + k.shape[2]
        old = self.k[layer]
        if old is None or end > old.shape[2]:
            size = max(end, _FIRST_CAPACITY if old is None else 2 * old.shape[2])
            self.k[layer] = _grown(old, k, size)
            self.v[layer] = _grown(self.v[layer], v, size)
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v

    def view(self, end: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions 0..end-1 of `layer` (views, not copies)."""
        k, v = self.k[layer], self.v[layer]
        if k is None:
            raise RuntimeError("DraftKV.view before any write")
        return k[:, :, :end], v[:, :, :end]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int = 0, *args, **kwargs):
        """transformers' cache call: write at `start`, return every key/value up to the new ones.

        A one-layer cache answers whatever layer index the calling layer carries (MTP's layer keeps
        the index it had in the target)."""
        layer = 0 if len(self.k) == 1 else layer_idx
        self.write(self.start, key, value, layer)
        return self.view(self.start + key.shape[2], layer)


def _grown(old: torch.Tensor | None, like: torch.Tensor, size: int) -> torch.Tensor:
    new = like.new_zeros(*like.shape[:2], size, like.shape[3])
    if old is not None:
        new[:, :, : old.shape[2]] = old
    return new


def causal_mask(past: int, q: int, device: torch.device | str) -> torch.Tensor | None:
    """[1, 1, q, past + q] bool (True = may attend) for q new positions after `past` cached ones;
    None where every attention kernel here already does the right thing without one: one query
    sees every key, and with nothing cached the models run plain causal attention."""
    if past == 0 or q == 1:
        return None
    keys = torch.arange(past + q, device=device)
    rows = past + torch.arange(q, device=device)
    return (keys[None, :] <= rows[:, None])[None, None]
