"""Traffic -> training and held-out prompts, reproducibly, with nothing held out ever trained on.

The split depends only on each prompt's content and the seed (a hash ranks the prompts; the first
`holdout` of that order are held out), so the same traffic file splits the same way on every
machine and in any line order. Prompts whose messages equal a held-out prompt's are dropped from
training, so a repeated request cannot leak into the measurement.

This module knows the traffic format (the bench workload format) and the split. It does not know
regeneration, training or measuring.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

from draftsmith.data.workloads import Prompt, load_jsonl_prompts
from draftsmith.errors import UserError


def parse_holdout(text: str) -> float | int:
    """`--holdout N` (a count, N >= 1) or a fraction in (0, 1).

    >>> parse_holdout("20"), parse_holdout("0.2")
    (20, 0.2)
    """
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"--holdout {text!r}: give a number of prompts (20) or a fraction (0.2)") from None
    if value.is_integer() and value >= 1:
        return int(value)
    if 0 < value < 1:
        return value
    raise UserError(f"--holdout {text}: give a number of prompts of 1 or more, or a fraction between 0 and 1")


def load_traffic(path: str) -> list[Prompt]:
    """The prompts of a traffic file; one clear UserError for a missing, empty or malformed one."""
    if not Path(path).expanduser().is_file():
        raise UserError(f"--traffic {path} not found; pass a .jsonl file with one prompt per line")
    try:
        return load_jsonl_prompts(path)
    except UserError as e:
        raise UserError(f"--traffic: {e}") from None


def holdout_count(holdout: float | int, n: int) -> int:
    """How many of n prompts a --holdout value holds out (a fraction rounds, and keeps at least one).

    >>> holdout_count(0.2, 101), holdout_count(0.001, 50), holdout_count(5, 50)
    (20, 1, 5)
    """
    return holdout if isinstance(holdout, int) else max(1, round(holdout * n))


def split_traffic(
    prompts: list[Prompt], holdout: float | int, seed: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held_out), both in file order."""
    n_hold = holdout_count(holdout, len(prompts))
    if n_hold >= len(prompts):
        raise UserError(
            f"--holdout {holdout}: the traffic has {len(prompts)} prompts, and holding out {n_hold} leaves "
            "none to train on; pass a smaller --holdout or more traffic"
        )
    rank = sorted(range(len(prompts)), key=lambda i: (_key(prompts[i], seed), i))
    held_idx = set(rank[:n_hold])
    held = [p for i, p in enumerate(prompts) if i in held_idx]
    seen = {_content(p) for p in held}
    train = [p for i, p in enumerate(prompts) if i not in held_idx and _content(p) not in seen]
    if not train:
        raise UserError(
            "--traffic: every training prompt repeats a held-out one; pass a smaller --holdout or more "
            "distinct traffic"
        )
    return train, held


def write_prompts(path: Path, prompts: list[Prompt]) -> None:
    """A workload JSONL (`{"id", "messages"}` per line) that bench and regenerate read back."""
    from draftsmith.fileio import atomic_write_text

    atomic_write_text(path, "".join(json.dumps({"id": p.id, "messages": p.messages}) + "\n" for p in prompts))


def traffic_main(description: str, make: Callable[[random.Random], str], prefix: str) -> None:
    """The command line of a traffic generator (`examples/*/make_traffic.py`): `--num` distinct
    requests from `make(rng)` with a fixed `--seed`, written to `--out` as `{"id", "prompt"}` lines."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--num", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rng = random.Random(args.seed)
    seen: dict[str, None] = {}
    while len(seen) < args.num:
        seen.setdefault(make(rng))
    lines = [json.dumps({"id": f"{prefix}-{i}", "prompt": text}) + "\n" for i, text in enumerate(seen)]
    Path(args.out).write_text("".join(lines))
    print(f"{len(lines)} requests -> {args.out}")


def _content(p: Prompt) -> str:
    return json.dumps(p.messages, sort_keys=True)


def _key(p: Prompt, seed: int) -> str:
    return hashlib.sha256(f"{seed}\n{_content(p)}".encode()).hexdigest()


__all__ = ["holdout_count", "load_traffic", "parse_holdout", "split_traffic", "write_prompts"]
