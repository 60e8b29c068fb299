"""A KV cache whose rows hold different lengths, so a batch can accept different numbers of tokens.

Keys and values live in buffers preallocated to the longest sequence the batch can reach, written at
absolute positions (gpt-fast's layout). Each row keeps its own committed length; a forward writes its
q new tokens at `lengths[row] + 0..q-1`, and the engine then advances `lengths[row]` by however many
of them were accepted. Rolling back a rejected draft therefore copies nothing: the rejected positions
are simply overwritten by the next forward, and the attention mask never lets a query see them.

Rows join (`grow`, which also widens the buffers) and leave (`keep_rows`) between forwards, which is
what continuous batching needs: each costs one copy of the buffers, never a recomputation.

Hybrid targets (transformers `qwen3_5`: Gated DeltaNet layers) also carry a convolution window and a
recurrent state per linear-attention layer. Those cannot be rolled back by moving a length, so the
cache can snapshot and restore them; the engine replays the accepted tokens from the snapshot.

What this class deliberately does not do: build masks or positions (the target wrapper does), or know
anything about drafts (the engine does). It subclasses transformers' `Cache` only to be accepted by
the models' forward; it implements the handful of methods those forwards call.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class RaggedCache(Cache):
    def __init__(
        self,
        *,
        batch: int,
        capacity: int,
        attention_layers: list[int],
        linear_layers: list[int],
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(layers=[])
        self.capacity = capacity
        self.lengths = torch.zeros(batch, dtype=torch.long)  # committed tokens per row (CPU)
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = {i: torch.zeros(shape, dtype=dtype, device=device) for i in attention_layers}
        self.values = {i: torch.zeros(shape, dtype=dtype, device=device) for i in attention_layers}
        self.linear_layers = set(linear_layers)
        self.conv: dict[int, torch.Tensor] = {}  # [batch, channels, kernel]
        self.recurrent: dict[int, torch.Tensor] = {}  # [batch, heads, dk, dv]
        self._num_layers = len(attention_layers) + len(linear_layers)
        # Set by `begin` for the duration of one forward.
        self._rows: torch.Tensor | None = None  # active row indices, or None for all rows
        self._positions: torch.Tensor | None = None  # [b, q] absolute write positions
        self._start: int | None = None  # common start when every active row has the same length
        self._kv_len = 0

    # --- bookkeeping used by the target wrapper and the engine -------------------------------------

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def has_recurrent_state(self) -> bool:
        return bool(self.linear_layers)

    def begin(self, rows: torch.Tensor | None, q: int) -> torch.Tensor:
        """Prepare a forward of q tokens for `rows`; returns the positions [b, q] it will write."""
        lengths = self.lengths if rows is None else self.lengths[rows]
        if int(lengths.max()) + q > self.capacity:
            raise RuntimeError(f"cache capacity {self.capacity} exceeded")
        self._rows = rows
        self._positions = lengths[:, None] + torch.arange(q)
        lo, hi = int(lengths.min()), int(lengths.max())
        self._start = lo if lo == hi and rows is None else None
        self._kv_len = hi + q
        return self._positions

    def end(self) -> None:
        self._rows = self._positions = self._start = None

    def advance(self, row: int, n: int) -> None:
        self.lengths[row] += n

    def move(self, row: int, src: list[int], dst: list[int]) -> None:
        """Copy keys/values of a row from offsets `src` to `dst` past its committed length (an
        accepted tree branch is moved next to the committed tokens: a few entries, not the cache)."""
        base = int(self.lengths[row])
        for store in (self.keys, self.values):
            for buf in store.values():
                s = torch.tensor([base + i for i in src], device=buf.device)
                d = torch.tensor([base + i for i in dst], device=buf.device)
                buf[row, :, d] = buf[row, :, s].clone()

    def grow(self, rows: int, capacity: int) -> None:
        """Append `rows` empty rows and make every row hold at least `capacity` positions.

        Buffers are reallocated only when their shape changes, with one copy of what they hold:
        a request joining a running batch costs about what a finished one leaving it costs
        (`keep_rows`). Callers grow capacity geometrically so joins rarely widen the buffers."""
        capacity = max(capacity, self.capacity)
        if rows == 0 and capacity == self.capacity:
            return
        old_b, old_cap = self.batch, self.capacity

        def widen(t: torch.Tensor, seq_dim: int | None) -> torch.Tensor:
            shape = list(t.shape)
            shape[0] += rows
            if seq_dim is not None:
                shape[seq_dim] = capacity
            out = t.new_zeros(shape)
            if seq_dim is None:
                out[:old_b] = t
            else:
                out[:old_b, :, :old_cap] = t
            return out

        self.lengths = torch.cat([self.lengths, torch.zeros(rows, dtype=torch.long)])
        self.keys = {i: widen(t, 2) for i, t in self.keys.items()}
        self.values = {i: widen(t, 2) for i, t in self.values.items()}
        self.conv = {i: widen(t, None) for i, t in self.conv.items()}
        self.recurrent = {i: widen(t, None) for i, t in self.recurrent.items()}
        self.capacity = capacity

    def keep_rows(self, rows: list[int]) -> None:
        """Drop finished rows for good (one copy), so later forwards index the buffers as views."""
        idx = torch.tensor(rows, dtype=torch.long)
        dev_idx = idx.to(next(iter(self.keys.values())).device) if self.keys else idx
        self.lengths = self.lengths[idx]
        self.keys = {i: t[dev_idx] for i, t in self.keys.items()}
        self.values = {i: t[dev_idx] for i, t in self.values.items()}
        self.conv = {i: t[dev_idx] for i, t in self.conv.items()}
        self.recurrent = {i: t[dev_idx] for i, t in self.recurrent.items()}

    def snapshot_state(self) -> dict[str, dict[int, torch.Tensor]]:
        """Copy of the recurrent/conv state of every row (hybrid targets only; cheap otherwise)."""
        return {
            "conv": {i: t.clone() for i, t in self.conv.items()},
            "recurrent": {i: t.clone() for i, t in self.recurrent.items()},
        }

    def restore_state(self, snap: dict[str, dict[int, torch.Tensor]], rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.long)
        for name, store in (("conv", self.conv), ("recurrent", self.recurrent)):
            for i, saved in snap[name].items():
                if i in store:
                    store[i][idx.to(saved.device)] = saved[idx.to(saved.device)]
                else:  # the layer had no state yet at snapshot time
                    store[i][idx.to(store[i].device)] = 0

    # --- the transformers Cache surface --------------------------------------------------------------

    def __len__(self) -> int:
        return self._num_layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.lengths.max())

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # key_states: [b, kv_heads, q, head_dim]
        kbuf, vbuf = self.keys[layer_idx], self.values[layer_idx]
        q = key_states.shape[2]
        if self._start is not None:
            s = self._start
            kbuf[:, :, s : s + q] = key_states
            vbuf[:, :, s : s + q] = value_states
            return kbuf[:, :, : self._kv_len], vbuf[:, :, : self._kv_len]
        rows = self._all_rows(kbuf) if self._rows is None else self._rows.to(kbuf.device)
        pos = self._positions.to(kbuf.device)
        # Advanced indices on dims 0 and 2 broadcast to [b, q] and move to the front: [b, q, heads, dim].
        kbuf[rows[:, None], :, pos] = key_states.transpose(1, 2)
        vbuf[rows[:, None], :, pos] = value_states.transpose(1, 2)
        if self._rows is None:
            return kbuf[:, :, : self._kv_len], vbuf[:, :, : self._kv_len]
        return kbuf[rows, :, : self._kv_len], vbuf[rows, :, : self._kv_len]

    @staticmethod
    def _all_rows(buf: torch.Tensor) -> torch.Tensor:
        return torch.arange(buf.shape[0], device=buf.device)

    # Linear-attention (Gated DeltaNet) state. Returning True here makes the model take its general
    # path, which hands us the new conv inputs instead of updating a tensor in place: with a subset
    # of rows the tensor we return is a gathered copy, so in-place updates would be lost.
    def is_recording_past(self, layer_idx: int) -> bool:
        return layer_idx in self.linear_layers

    # transformers >= 5.25 can record intermediate recurrent states for its own speculative decoding;
    # we keep none (the engine snapshots and replays instead), so its chunked path runs unchanged.
    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        return 0

    def _select(self, t: torch.Tensor) -> torch.Tensor:
        return t if self._rows is None else t[self._rows.to(t.device)]

    def _scatter(self, store: dict[int, torch.Tensor], layer_idx: int, value: torch.Tensor) -> None:
        if layer_idx not in store:
            full = torch.zeros((self.batch, *value.shape[1:]), dtype=value.dtype, device=value.device)
            store[layer_idx] = full
        if self._rows is None:
            store[layer_idx].copy_(value)
        else:
            store[layer_idx][self._rows.to(value.device)] = value

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._select(self.conv[layer_idx]) if layer_idx in self.conv else None

    def update_conv_state(self, conv_states, layer_idx, state_idx=0, conv_kernel_size=None, **kwargs):
        # conv_states: [b, channels, q] new inputs; returns [b, channels, kernel + q] with left context.
        kernel = conv_kernel_size or conv_states.shape[-1]
        if layer_idx in self.conv:
            prev = self._select(self.conv[layer_idx])
        else:
            prev = conv_states.new_zeros((*conv_states.shape[:-1], kernel))
        full = torch.cat([prev, conv_states], dim=-1)
        self._scatter(self.conv, layer_idx, full[..., -kernel:].contiguous())
        return full

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._select(self.recurrent[layer_idx]) if layer_idx in self.recurrent else None

    def update_recurrent_state(self, recurrent_states, layer_idx, state_idx=0, **kwargs):
        self._scatter(self.recurrent, layer_idx, recurrent_states)
        return recurrent_states

    @property
    def is_compileable(self) -> bool:
        return False
