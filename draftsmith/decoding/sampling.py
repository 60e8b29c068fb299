"""Sampling settings and the processed target distribution p they define.

Lossless means equal to what plain decoding with the same settings would sample from, so the same
function turns logits into p for plain decoding and for verification. Temperature 0 is greedy.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from draftsmith.errors import UserError

GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UserError(
                f"--temperature {self.temperature} is negative: use 0 (greedy) or a positive value"
            )
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p {self.top_p} is out of range: use a value in (0, 1]")
        if self.top_k < 0:
            raise UserError(f"--top-k {self.top_k} is negative: use 0 (off) or a positive count")

    @property
    def greedy(self) -> bool:
        # Below this, 1/temperature overflows the logits to inf (NaN probabilities); such a
        # temperature is greedy in all but name (vLLM draws the same line).
        return self.temperature < GREEDY_BELOW


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature, top-k and top-p.

    >>> p = target_probs(torch.tensor([2.0, 1.0, 0.0]), SamplingParams(temperature=1.0, top_k=2))
    >>> [round(x, 3) for x in p.tolist()]
    [0.731, 0.269, 0.0]
    """
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token that crosses it stays in).
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        drop[..., 0] = False  # the most likely token always stays (a top_p below float32's range)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def fresh_seed() -> int:
    """A random 63-bit seed for a request without one. It never touches torch's global generator
    (`torch.seed()` would reseed it): that one belongs to the user's program, not to a library."""
    return secrets.randbits(63)


def make_generator(seed: int | None, row: int = 0) -> torch.Generator:
    """The engine's acceptance stream for row `row` of a request seeded with `seed` (None: fresh)."""
    g = torch.Generator()
    g.manual_seed(((seed if seed is not None else fresh_seed()) * 1_000_003 + row) % 2**63)
    return g


def draft_generator(seed: int | None, index: int = 0) -> torch.Generator:
    """A drafter's stream for its index-th request, independent of the engine's acceptance stream.

    Exact speculative sampling needs the draft sample independent of the acceptance test, and the
    engine verifies request `index` with make_generator(seed, index); an LCG step scrambles that
    seed so the two streams never coincide (with seed 0 and index 0 they otherwise would).
    """
    base = (seed if seed is not None else fresh_seed()) * 1_000_003 + index
    return torch.Generator().manual_seed(_scramble(base))


def draft_stream(acceptance: torch.Generator) -> torch.Generator:
    """The drafter's stream for the row verified with `acceptance`, seeded from that generator's
    seed by the same LCG step: draft_stream(make_generator(s, i)) equals draft_generator(s, i), and
    a row that brings its own generator (a server request) drafts reproducibly from it. The
    acceptance stream itself is not drawn from."""
    return torch.Generator().manual_seed(_scramble(acceptance.initial_seed()))


def _scramble(seed: int) -> int:
    return (seed * 6364136223846793005 + 1442695040888963407) % 2**63
