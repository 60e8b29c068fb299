"""A KV cache whose rows hold different lengths, so a batch can accept different numbers of tokens.

Keys and values live in buffers preallocated to the longest sequence the batch can reach, written at
absolute positions (gpt-fast's layout). Each row keeps its own committed length; a forward writes its
q new tokens at `lengths[row] + 0..q-1`, and the engine then advances `lengths[row]` by however many
of them were accepted. Rolling back a rejected draft therefore copies nothing: the rejected positions
are simply overwritten by the next forward, and the attention mask never lets a query see them.

Rows join (`grow`) and leave (`keep_rows`) between forwards, which is what continuous batching
needs. The buffers hold spare rows (their row count grows geometrically, as their length does), so a
row that joins where one has left reuses its place, and a leaving row is replaced by moving the last
rows into the hole: a few rows' committed keys are copied, not the whole cache. With 48 rows of
SmolLM2 a whole-cache copy cost about 80 ms, as much as a decode step.

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
        self.allocated_rows = batch  # rows the buffers hold; rows past `batch` are spare
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

    @torch.inference_mode()
    def grow(self, rows: int, capacity: int) -> None:
        """Append `rows` empty rows and make every row hold at least `capacity` positions.

        New rows take spare rows of the buffers when there are enough and the length suffices;
        otherwise the buffers are reallocated, with one copy of what they hold, to at least twice
        their rows or length, so that later joins rarely reallocate."""
        capacity = max(capacity, self.capacity)
        old_b = self.batch
        need = old_b + rows
        self.lengths = torch.cat([self.lengths, torch.zeros(rows, dtype=torch.long)])
        if need <= self.allocated_rows and capacity == self.capacity:
            for store in (self.conv, self.recurrent):  # a new row starts with no recurrent state
                for t in store.values():
                    t[old_b:need] = 0
            return
        alloc = need if need <= self.allocated_rows else max(need, 2 * self.allocated_rows)
        old_cap = self.capacity

        def widen(t: torch.Tensor, seq_dim: int | None) -> torch.Tensor:
            shape = list(t.shape)
            shape[0] = alloc
            if seq_dim is not None:
                shape[seq_dim] = capacity
            out = t.new_zeros(shape)
            if seq_dim is None:
                out[:old_b] = t[:old_b]
            else:
                out[:old_b, :, :old_cap] = t[:old_b]
            return out

        self.keys = {i: widen(t, 2) for i, t in self.keys.items()}
        self.values = {i: widen(t, 2) for i, t in self.values.items()}
        self.conv = {i: widen(t, None) for i, t in self.conv.items()}
        self.recurrent = {i: widen(t, None) for i, t in self.recurrent.items()}
        self.capacity, self.allocated_rows = capacity, alloc

    @torch.inference_mode()
    def keep_rows(self, rows: list[int]) -> None:
        """Keep these rows, in this order, as rows 0..len(rows)-1; the others are dropped.

        An order that only moves rows from past the kept count into holes before it (what the
        engine asks for) is done in place, copying only the moved rows' committed positions; any
        other order gathers the kept rows (one copy of them)."""
        n = len(rows)
        in_place = all(src == dst or src >= n for dst, src in enumerate(rows))
        if in_place:
            for dst, src in enumerate(rows):
                if src != dst:
                    self._copy_row(src, dst)
            self.lengths = self.lengths[torch.tensor(rows, dtype=torch.long)]
            return
        idx = torch.tensor(rows, dtype=torch.long)
        self.lengths = self.lengths[idx]
        for store in (self.keys, self.values, self.conv, self.recurrent):
            for t in store.values():
                t[:n] = t[idx.to(t.device)]

    def _copy_row(self, src: int, dst: int) -> None:
        used = int(self.lengths[src])
        for store in (self.keys, self.values):
            for t in store.values():
                t[dst, :, :used] = t[src, :, :used]
        for store in (self.conv, self.recurrent):
            for t in store.values():
                t[dst] = t[src]

    def snapshot_state(self) -> dict[str, dict[int, torch.Tensor]]:
        """Copy of the recurrent/conv state of every row (hybrid targets only; cheap otherwise)."""
        b = self.batch
        return {
            "conv": {i: t[:b].clone() for i, t in self.conv.items()},
            "recurrent": {i: t[:b].clone() for i, t in self.recurrent.items()},
        }

    @torch.inference_mode()  # the state tensors are inference tensors: written in place like `grow`'s
    def restore_state(self, snap: dict[str, dict[int, torch.Tensor]], rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.long)
        for name, store in (("conv", self.conv), ("recurrent", self.recurrent)):
            for i, t in store.items():
                at = idx.to(t.device)
                if i in snap[name]:
                    t[at] = snap[name][i][at]
                else:  # the layer had no state yet at snapshot time
                    t[at] = 0

    # --- the transformers Cache surface --------------------------------------------------------------

    def __len__(self) -> int:
        return self._num_layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.lengths.max())

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # key_states: [b, kv_heads, q, head_dim]
        b = self.batch
        kbuf, vbuf = self.keys[layer_idx][:b], self.values[layer_idx][:b]
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
        return t[: self.batch] if self._rows is None else t[self._rows.to(t.device)]

    def _scatter(self, store: dict[int, torch.Tensor], layer_idx: int, value: torch.Tensor) -> None:
        if layer_idx not in store:
            shape = (self.allocated_rows, *value.shape[1:])
            store[layer_idx] = torch.zeros(shape, dtype=value.dtype, device=value.device)
        if self._rows is None:
            store[layer_idx][: self.batch].copy_(value)
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
