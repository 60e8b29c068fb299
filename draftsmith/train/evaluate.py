"""Held-out tau of a draft being trained, measured by the real engine exactly as a user would get it:
the draft is saved like a finished speculator, loaded through `eagle3:PATH` (or `dflash:PATH`,
`mtp:PATH`), and drafts for greedy decoding of the eval workload's prompts (the target's chat
template applied).

Knows the engine, the registry and the workloads; knows nothing of the training loop.
"""

from __future__ import annotations

import tempfile
from typing import Protocol

from draftsmith.data.workloads import load_workload
from draftsmith.decoding.engine import DecodeStats, generate
from draftsmith.drafters import registry
from draftsmith.target.chat import encode_messages
from draftsmith.target.model import Target


def eval_prompts(target: Target, workload: str, n: int, max_new_tokens: int, k: int) -> list[list[int]]:
    """Up to n prompt token lists; prompts too long for the target's context are left out."""
    prompts = [encode_messages(target.tokenizer, p.messages) for p in load_workload(workload, n)]
    room = target.max_context - max_new_tokens - k - 2
    return [p for p in prompts if 0 < len(p) <= room]


class Savable(Protocol):
    """A draft as a method exports it: `save(dir)` writes the folder its drafter loads."""

    def save(self, path, extra: dict | None = None) -> None: ...


def measure_tau(
    target: Target,
    draft: Savable,
    prompts: list[list[int]],
    k: int,
    max_new_tokens: int,
    drafter: str = "eagle3",
) -> float:
    """Mean tokens per verify step over the prompts (one batch), at temperature 0; `drafter` names
    the registry entry that loads `draft` back."""
    if not prompts:
        return float("nan")
    with tempfile.TemporaryDirectory(prefix="draftsmith-eval-") as d:
        draft.save(d)
        results = generate(
            target, registry.build(f"{drafter}:{d}"), prompts, k=k, max_new_tokens=max_new_tokens
        )
    return DecodeStats.combined(r.stats for r in results).tau  # the rows' counts add up to the batch's
