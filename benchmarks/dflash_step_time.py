"""Milliseconds per DFlash draft forward in the engine: the module forward against the packed,
compiled one (`draftsmith/drafters/dflash_fast.py`), in one process on the same drafter state.

    python benchmarks/dflash_step_time.py [--speculator DIR] [--context 256,1024] [--repeats 40]

For each context length it times `propose(7)` (one block forward and the LM head over its slots)
and a commit of 3 accepted tokens (their context keys/values), alternating the two paths twice so
that drift on a shared machine shows. Writes a table to stdout and JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from draftsmith.decoding.sampling import SamplingParams  # noqa: E402
from draftsmith.drafters import registry  # noqa: E402
from draftsmith.machine import machine_info  # noqa: E402
from draftsmith.target.model import load_target  # noqa: E402


def _time(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--speculator", default="speculators/smollm2-135m-dflash")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--context", default="256,1024")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--out", default="benchmarks/results/dflash_step_time.json")
    args = ap.parse_args()

    target = load_target(args.target, args.dtype)
    factory = registry.build(f"dflash:{args.speculator}")
    factory.bind(target, SamplingParams())
    text = (
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    )
    rows = []
    for n in (int(c) for c in args.context.split(",")):
        ids = (target.tokenizer.encode(text) * (n // 20 + 1))[:n]
        with torch.inference_mode():
            hs = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        feats = torch.stack([hs[i + 1][0] for i in factory.needs_features], dim=1)
        drafter = factory()
        drafter.start(ids, feats[:-1])

        def commit3(d=drafter, last=ids[-1], new=feats[:3]) -> None:
            length = d.length
            d.commit([last], new)
            d.length = length  # roll back, so every repeat sees the same context

        for path in ("module", "fast", "module", "fast"):
            drafter.fast = factory.fast if path == "fast" else None
            rows.append(
                {
                    "context": n,
                    "path": path,
                    "propose_ms": round(_time(lambda d=drafter: d.propose(7), args.repeats), 2),
                    "commit3_ms": round(_time(commit3, args.repeats), 2),
                }
            )
            print(
                f"context {n:5d}  {path:6s}  propose(7) {rows[-1]['propose_ms']:7.2f} ms  "
                f"commit 3 {rows[-1]['commit3_ms']:6.2f} ms",
                flush=True,
            )
    report = {
        "target": target.name,
        "speculator": args.speculator,
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "machine": machine_info(),
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
