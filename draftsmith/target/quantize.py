"""Weight-only int8 targets: each weight matrix stored as int8 with one scale per output row.

A CPU decode step is bound by reading the weights; int8 halves bf16's bytes and quarters float32's.
PyTorch's CPU kernel `_weight_int8pack_mm` multiplies activations (float32 or bf16) by such a
matrix, dequantizing as it reads. The quantized target is a different model from the original, so
its outputs differ from the bf16/float32 ones; speculative decoding stays exact *against the
quantized target*: the drafters propose, the int8 target verifies, and plain decoding of the same
int8 target is what every speculative run must equal (tests/target/test_lean_decoder.py).

Symmetric per-row absmax quantization, as gpt-fast's and torchao's int8 weight-only schemes: the
scale is max|w_row| / 127, so the largest weight of each row is exact and the rest round to the
nearest of 255 levels.
"""

from __future__ import annotations

import torch

QUANTIZE = ("none", "int8")


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (int8 [out, in], float32 scale [out]) with weight ~= q * scale[:, None]."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


@torch.library.custom_op("draftsmith::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x @ (q * scale).T for x [..., in], q int8 [out, in], scale [out] in x's dtype."""
    out = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), q, scale)
    return out.view(*x.shape[:-1], q.shape[0])


@int8_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))
