"""Build the training and held-out conversation sets from everything SmolLM2 has regenerated.

    .venv/bin/python data/build_trainset.py --out data/smollm2-v2      # -> .train.jsonl, .heldout.jsonl

Inputs: the stage-4 files (the 1,468 stdlib code answers, the 124 HumanEval-train answers and the
479 two-turn ShareGPT conversations; every shipped speculator has trained on them, so none of them
is held out) and the flywheel's outputs, `data/flywheel/*.jsonl` (finished or `.partial`).

Held out: flywheel conversations whose id hashes into `--heldout-per-mille` of 1,000 buckets
(sha256 of the id, so the split never changes as the flywheel grows and is the same on every
machine). Training never reads them; `train ... --eval-data` scores teacher-forced accuracy on them.
The training set is shuffled with a fixed seed, so the file (and its digest, which training
checkpoints record) is the same for the same inputs.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import random

from draftsmith.fileio import atomic_write_text

STAGE4 = [
    "data/stdlib-code-smollm2-t0.jsonl",
    "data/humaneval-train-smollm2-t0.0.jsonl",
    "data/humaneval-train-smollm2-t0.1.jsonl",
    "data/sharegpt-smollm2-t0.0.jsonl.partial",
    "data/sharegpt-smollm2-t0.1.jsonl.partial",
]


def held_out(cid: str, per_mille: int) -> bool:
    """The id's bucket among 1,000 (stable across machines and runs) is below per_mille."""
    return int.from_bytes(hashlib.sha256(cid.encode()).digest()[:4], "big") % 1000 < per_mille


def read(path: str) -> list[str]:
    """Whole lines only: a `.partial` being written may end in a torn one."""
    out = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):
                json.loads(line)
                out.append(line)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="prefix: writes PREFIX.train.jsonl and PREFIX.heldout.jsonl")
    p.add_argument("--heldout-per-mille", type=int, default=50)
    p.add_argument("--flywheel", default="data/flywheel/sharegpt.*.jsonl*")
    p.add_argument(
        "--flywheel-first", type=int, default=None,
        help="use only the first N flywheel conversations (its files only grow, so this rebuilds an older set)",
    )  # fmt: skip
    args = p.parse_args()
    train = [line for path in STAGE4 for line in read(path)]
    heldout: list[str] = []
    seen: set[str] = set()
    for path in sorted(glob.glob(args.flywheel)):
        for line in read(path):
            cid = json.loads(line)["id"]
            if cid in seen:  # a shard's finished file and an older partial copy
                continue
            if args.flywheel_first is not None and len(seen) >= args.flywheel_first:
                break
            seen.add(cid)
            (heldout if held_out(cid, args.heldout_per_mille) else train).append(line)
    random.Random(0).shuffle(train)
    atomic_write_text(f"{args.out}.train.jsonl", "".join(train))
    atomic_write_text(f"{args.out}.heldout.jsonl", "".join(heldout))
    print(f"{len(train)} training conversations -> {args.out}.train.jsonl")
    print(f"{len(heldout)} held-out conversations -> {args.out}.heldout.jsonl")


if __name__ == "__main__":
    main()
