"""One-row linear layers through `torch.mv` on CPU bf16: the matrix-vector product of decoding.

A decode step multiplies every weight matrix by one token's activations. On this CPU PyTorch's bf16
`F.linear` with one input row ran at 5-9 GB/s, while `torch.mv` on the same weight read it at
8-17 GB/s (the LM head of SmolLM2, 49152 x 576: 3.7 ms against 10.5 ms on one thread). Plain
decoding and every autoregressive drafter step are such products, so the engine swaps the class of
its `nn.Linear` modules to `GemvLinear`, which takes the `mv` path for a single row and the stock
path otherwise (verification of k+1 tokens, prefill, training). Weights and state dicts are
untouched: only `forward` differs.

Only CPU bf16 inference is switched: on a GPU cuBLAS already picks a GEMV kernel, and float32 was
not faster this way. `DRAFTSMITH_GEMV=0` keeps the stock path everywhere (for A/B timing).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn


class GemvLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == self.in_features and not torch.is_grad_enabled():
            y = torch.mv(self.weight, x.reshape(-1))
            if self.bias is not None:
                y = y + self.bias
            return y.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


def wants_gemv(module: nn.Module) -> bool:
    """True when the module's weights are bf16 on a CPU, the case `GemvLinear` speeds up."""
    p = next(module.parameters(), None)
    return p is not None and p.device.type == "cpu" and p.dtype == torch.bfloat16


def use_gemv(module: nn.Module) -> int:
    """Switch every plain `nn.Linear` inside `module` to `GemvLinear` (bf16 CPU only); returns how many."""
    if os.environ.get("DRAFTSMITH_GEMV", "1") == "0" or not wants_gemv(module):
        return 0
    n = 0
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = GemvLinear
            n += 1
    return n
