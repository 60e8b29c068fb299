"""Measure plain decoding and the cost of verifying q = 1..16 tokens on random-initialised models of
real shapes, and compare with `draftsmith simulate`'s roofline for the same GPU.

Neither depends on trained weights, so a model built from a catalog config with random bf16 weights
times the same as the real one. For each shape and batch B, the script prefills B rows to a context
of S tokens through draftsmith's own Target and ragged cache, then times one forward of q new tokens
per row (the cache is not advanced, so every repeat sees the same context). It prints a table and
writes `draftsmith/simulate/measured/<gpu>.json` beside the catalog, with the simulator's prediction
(default constants, and anchored on the measured B=1, q=1 step) next to every measurement.

    .venv/bin/python benchmarks/gpu_verify_cost.py --gpu h200 --shapes llama-3.1-8b,qwen3-8b
    .venv/bin/python benchmarks/gpu_verify_cost.py --device cpu --shapes tiny --batches 1,2 --qs 1,4   # smoke

Plain HF modules run eagerly here (no CUDA graphs), so the fixed overhead is larger than a serving
engine's; the anchored column is the one that checks how cost grows with q and B.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from draftsmith.simulate.catalog import CATALOG, load_model, shape_from_config  # noqa: E402
from draftsmith.simulate.hardware import load_hardware  # noqa: E402
from draftsmith.simulate.roofline import forward_cost  # noqa: E402
from draftsmith.target.model import Target  # noqa: E402

TINY = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def build(name: str, device: str) -> tuple[Target, dict]:
    cfg = TINY if name == "tiny" else CATALOG[name][1]
    hf_cfg = AutoConfig.for_model(**cfg)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16)
    return Target(model, None, name), cfg


def time_forward(target: Target, batch: int, q: int, context: int, repeats: int) -> float:
    cache = target.new_cache(batch, context + q + 2)
    ids = torch.randint(0, target.vocab_size, (batch, context))
    with torch.inference_mode():
        target.forward(cache, ids)
        for b in range(batch):
            cache.advance(b, context)
        new = torch.randint(0, target.vocab_size, (batch, q))
        target.forward(cache, new)  # warm-up
        target.sync()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            target.forward(cache, new)
            target.sync()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200", help="hardware name for the simulator's prediction")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="llama-3.1-8b,qwen3-8b")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--qs", default="1,2,4,8,16")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    hw = load_hardware(args.gpu)
    batches = [int(x) for x in args.batches.split(",")]
    qs = [int(x) for x in args.qs.split(",")]
    rows = []
    for name in args.shapes.split(","):
        target, cfg = build(name, args.device)
        shape = load_model(name) if name != "tiny" else shape_from_config(TINY, "tiny", "tiny")
        anchored = None
        for b in batches:
            for q in qs:
                t = time_forward(target, b, q, args.context, args.repeats)
                pred = forward_cost(shape, hw, batch=b, q=q, context=args.context).total
                if anchored is None:  # fixed overhead solved from the first (B=1, q=1) measurement
                    anchored = replace(hw, overhead_s=max(0.0, hw.overhead_s + t - pred))
                pred_a = forward_cost(shape, anchored, batch=b, q=q, context=args.context).total
                row = {
                    "shape": name,
                    "batch": b,
                    "q": q,
                    "context": args.context,
                    "measured_ms": round(t * 1e3, 3),
                    "predicted_ms": round(pred * 1e3, 3),
                    "predicted_anchored_ms": round(pred_a * 1e3, 3),
                    "error_anchored": round(pred_a / t - 1, 4),
                }
                rows.append(row)
                print(
                    f"{name:14s} B={b:3d} q={q:2d}  measured {row['measured_ms']:8.3f} ms  "
                    f"roofline {row['predicted_ms']:8.3f}  anchored {row['predicted_anchored_ms']:8.3f} "
                    f"({row['error_anchored']:+.1%})",
                    flush=True,
                )
        del target
        if args.device == "cuda":
            torch.cuda.empty_cache()
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    out = Path(args.out) if args.out else ROOT / "draftsmith" / "simulate" / "measured" / f"{args.gpu}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    errs = [abs(r["error_anchored"]) for r in rows]
    result = {
        "device": device_name,
        "hardware_profile": args.gpu,
        "dtype": "bf16",
        "median_abs_error_anchored": statistics.median(errs) if errs else None,
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}; median |error| anchored: {result['median_abs_error_anchored']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
