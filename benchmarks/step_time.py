"""Milliseconds per target forward, next to the memory roofline: what one engine step costs.

For each dtype and each engine path, a one-row forward of q new tokens (q = 1 is a decode step,
q = k+1 a verification) after `context` cached tokens, the median of `--repeats` timed calls after
warm-up calls (which also pay torch.compile's one-time cost). The roofline is the bytes a step must
read (every weight matrix once, the LM head included, plus the keys and values of the context) over
the bandwidth `draftsmith calibrate` measures (a large reduction, the best of five), so
`x roofline` = ms / roofline ms.

Paths (each a fresh load of the target with the switches set):
  before    transformers' modules, one-row products through torch.mv (the engine until issue 27)
  packed    transformers' modules on prepacked oneDNN weights (target/packed.py)
  lean      the lean decoder forward, uncompiled (target/lean_decoder.py)
  compiled  the lean decoder forward, its layer compiled by torch.compile (the default)
  int8      compiled, on a weight-only int8 copy of the target (`--quantize int8`; another model)

    .venv/bin/python benchmarks/step_time.py                             # float32 and bfloat16
    .venv/bin/python benchmarks/step_time.py --dtypes float32 --paths before,compiled --q 1,8

Writes benchmarks/results/step_time.{json,txt} (or --out). Run it on a quiet machine; it states
the machine and its features with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from draftsmith.machine import machine_info  # noqa: E402
from draftsmith.simulate.calibrate import measure_bandwidth  # noqa: E402

PATHS = {
    "before": {"DRAFTSMITH_FAST": "0", "DRAFTSMITH_PACK": "0", "DRAFTSMITH_COMPILE": "0"},
    "packed": {"DRAFTSMITH_FAST": "0", "DRAFTSMITH_PACK": "1", "DRAFTSMITH_COMPILE": "0"},
    "lean": {"DRAFTSMITH_FAST": "1", "DRAFTSMITH_PACK": "1", "DRAFTSMITH_COMPILE": "0"},
    "compiled": {"DRAFTSMITH_FAST": "1", "DRAFTSMITH_PACK": "1", "DRAFTSMITH_COMPILE": "1"},
    "int8": {"DRAFTSMITH_FAST": "1", "DRAFTSMITH_PACK": "1", "DRAFTSMITH_COMPILE": "1"},
}


def step_bytes(target, context: int) -> int:
    """Bytes one forward reads: the weight matrices (the embedding table only as the LM head, and
    only once when tied; one byte per weight for an int8 target) and the cached keys and values of
    `context` tokens."""
    seen, total = set(), 0
    for m in target.model.modules():
        w = getattr(m, "weight", None)
        if isinstance(m, torch.nn.Embedding) or w is None or w.data_ptr() in seen:
            continue
        seen.add(w.data_ptr())
        total += w.numel() * (1 if target.quantize == "int8" else w.element_size())
    cfg = target.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    elem = torch.finfo(target.dtype).bits // 8
    return total + 2 * len(target.attention_layers) * kv_heads * head_dim * context * elem


def time_forward(target, context: int, q: int, repeats: int, warmup: int) -> list[float]:
    cache = target.new_cache(1, context + q)
    ids = torch.randint(100, 1000, (1, q), generator=torch.Generator().manual_seed(q))

    def run() -> None:
        cache.lengths[:] = context
        target.forward(cache, ids)

    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--paths", default="before,packed,lean,compiled")
    p.add_argument("--q", default="1,2,4,8,16")
    p.add_argument("--contexts", default="256,4096")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "step_time"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from draftsmith.target.model import load_target

    qs = [int(x) for x in args.q.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    bandwidth = measure_bandwidth(torch.device("cpu"))
    rows = []
    for dtype in args.dtypes.split(","):
        for path in args.paths.split(","):
            os.environ.update(PATHS[path])
            target = load_target(args.target, dtype, quantize="int8" if path == "int8" else "none")
            for context in contexts:
                roof_ms = 1e3 * step_bytes(target, context) / bandwidth
                for q in qs:
                    t = time_forward(target, context, q, args.repeats, args.warmup)
                    ms = 1e3 * statistics.median(t)
                    rows.append(
                        {"dtype": dtype, "path": path, "engine_path": target.path, "context": context, "q": q}
                        | {
                            "ms": round(ms, 2),
                            "min_ms": round(1e3 * min(t), 2),
                            "roofline_ms": round(roof_ms, 2),
                        }
                        | {"x_roofline": round(ms / roof_ms, 2)}
                    )
                    print(json.dumps(rows[-1]), flush=True)
            del target
    for r in rows:  # a verification's cost against the same path's one-token step
        one = next(
            x
            for x in rows
            if (x["dtype"], x["path"], x["context"], x["q"]) == (r["dtype"], r["path"], r["context"], 1)
        )
        r["x_q1"] = round(r["ms"] / one["ms"], 2) if 1 in qs else None
    machine = machine_info()
    result = {
        "machine": machine,
        "bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "target": args.target,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# step time: {args.target}, one row, median of {args.repeats} after {args.warmup} warm-up calls",
        f"# {machine['cpu']}, {' '.join(machine['cpu_features'])}, {machine['torch_threads']} threads, "
        f"torch {machine['torch']}; bandwidth {bandwidth / 1e9:.1f} GB/s (calibrate's reduction)",
        "",
        "| dtype | path | context | roofline ms | "
        + " | ".join(f"q={q} ms" for q in qs)
        + " | q=1 x roofline | q=8 / q=1 |",
        "|---|---|---|---|" + "---|" * len(qs) + "---|---|",
    ]
    for dtype in args.dtypes.split(","):
        for path in args.paths.split(","):
            for context in contexts:
                sel = {
                    r["q"]: r for r in rows if (r["dtype"], r["path"], r["context"]) == (dtype, path, context)
                }
                cells = " | ".join(f"{sel[q]['ms']:.1f}" for q in qs)
                x1 = f"{sel[1]['x_roofline']:.2f}" if 1 in sel else "-"
                x8 = f"{sel[8]['x_q1']:.2f}" if 8 in sel and 1 in sel else "-"
                roof = next(iter(sel.values()))["roofline_ms"]
                lines.append(f"| {dtype} | {path} | {context} | {roof:.1f} | {cells} | {x1} | {x8} |")
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
