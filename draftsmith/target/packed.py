"""Linear layers on prepacked oneDNN weights: the CPU matrix products of inference.

A decode step, a verification of k+1 tokens and a draft step each multiply every weight matrix by a
few rows of activations, so they are bound by how fast the weights stream from memory. PyTorch's
stock CPU `F.linear` reads a row-major weight at well under the machine's bandwidth; oneDNN reads a
weight reordered once into its blocked layout (`mkldnn._reorder_linear_weight`, what inductor's
freezing pass does) close to it. Measured on a 2-core AMD EPYC (AVX512-BF16), 200 MB of SmolLM2-
shaped weights per pass, 2 threads:

    dtype  rows   F.linear   torch.mv   packed
    bf16   1      15.4 ms    21.9 ms    10.8 ms
    bf16   8      18.6 ms       -       11.3 ms
    fp32   1      35.7 ms    37.5 ms    19.2 ms   (400 MB)
    fp32   8      40.4 ms       -       19.7 ms

and a 512-row prefill product was 10-25% faster too. In bf16 the results are bit-identical to
`F.linear`; in float32 the summation order differs (about 1e-4 relative), the same for every row
count, so plain and speculative decoding still agree token for token.

The packed copy is made on the first inference call and kept beside the weight (one more copy of
each matrix: memory is traded for speed, as on a CPU it is cheap); it is rebuilt when the weight
changes (a drafter evaluated during training). Training and autograd take the stock path.
`DRAFTSMITH_PACK=0` keeps the stock path everywhere (for A/B timing); where oneDNN lacks the dtype
(bf16 on a CPU without AVX512), bf16 falls back to `GemvLinear`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.target.gemv import GemvLinear, use_gemv

# The row count oneDNN is told to expect when reordering: verification's k+1. At 1 row the layout
# made no difference; float32 products of 3-8 rows ran up to 2x faster packed for 8 than for 1.
PACK_ROWS = 8


@torch.library.custom_op("draftsmith::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T (+ bias) with W reordered by `pack_weight`; an opaque op to torch.compile, which
    would otherwise insist on packing the weight itself as a graph constant."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A [out, in] weight in oneDNN's blocked layout, for `packed_linear` only."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """True where oneDNN runs this dtype's products on this device (and packing is not switched off)."""
    if os.environ.get("DRAFTSMITH_PACK", "1") == "0" or device.type != "cpu":
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Linear):
    """`nn.Linear` whose inference calls use a packed copy of the weight (see the module note)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        return packed_linear(x, self.packed(), self.bias)

    def packed(self) -> torch.Tensor:
        w = self.weight
        # Inference tensors (a drafter loaded under inference mode) keep no version counter; they are
        # not trained, so their storage alone identifies them.
        key = (w.data_ptr(), None if w.is_inference() else w._version)
        if getattr(self, "_packed_key", None) != key:
            self._packed_w, self._packed_key = pack_weight(w), key
        return self._packed_w


def use_fast_linear(module: nn.Module) -> int:
    """Switch every plain `nn.Linear` inside `module` to `PackedLinear` where oneDNN can run it, else
    (CPU bf16 without oneDNN bf16) to `GemvLinear`; returns how many were switched. Weights and state
    dicts are untouched: only `forward` differs."""
    p = next(module.parameters(), None)
    if p is None:
        return 0
    if not can_pack(p.dtype, p.device):
        return use_gemv(module)
    n = 0
    for m in module.modules():
        if type(m) in (nn.Linear, GemvLinear):
            m.__class__ = PackedLinear
            n += 1
    return n


@contextmanager
def stock_linear(module: nn.Module) -> Iterator[None]:
    """Within the block, every switched linear layer of `module` is a plain `nn.Linear` again: peers
    that measure stock transformers (`bench --peers hf`) run on its kernels, not ours."""
    switched = [(m, m.__class__) for m in module.modules() if type(m) in (PackedLinear, GemvLinear)]
    for m, _ in switched:
        m.__class__ = nn.Linear
    try:
        yield
    finally:
        for m, cls in switched:
            m.__class__ = cls
