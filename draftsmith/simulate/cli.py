"""`draftsmith simulate` and `draftsmith calibrate`: argument parsing, tables and JSON.

The arithmetic lives in roofline.py, speedup.py and predict.py; this module turns flags into their
inputs and their outputs into a table, one JSON object, or the token timing page.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_write_text
from draftsmith.simulate import speedup as acc
from draftsmith.simulate.catalog import ModelShape, load_model
from draftsmith.simulate.drafter_cost import (
    AUTOREGRESSIVE,
    DEFAULT_ALPHA,
    DEFAULT_K,
    MAX_K,
    NONE,
    drafter_cost,
)
from draftsmith.simulate.hardware import Hardware, hardware_names, load_hardware
from draftsmith.simulate.predict import BREAKDOWN, Prediction, best_k, predict

SWEEP_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def add_simulate_parser(sub) -> None:
    p = sub.add_parser(
        "simulate", help="predict decode speed with and without speculation on any model and GPU"
    )
    p.add_argument("--model", required=True, help="catalog name (e.g. qwen3-8b) or a HF config.json path")
    p.add_argument("--hardware", required=True, help=", ".join(hardware_names()))
    p.add_argument("--gpus", type=int, default=1, help="tensor-parallel degree")
    p.add_argument(
        "--expert-parallel",
        action="store_true",
        help="with --gpus N: data-parallel attention and experts spread over the GPUs (all-to-all "
        "dispatch/combine per MoE layer) instead of tensor parallelism; --batch is then the total",
    )
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp8", "fp4", "fp32"], help="weight dtype")
    p.add_argument(
        "--expert-dtype",
        default=None,
        choices=["bf16", "fp8", "fp4"],
        help="routed experts' dtype when it differs from --dtype (NVFP4/MXFP4 checkpoints quantise only them)",
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1], help="concurrent requests (several allowed)")
    p.add_argument("--context", type=int, default=1024, help="tokens in context per request")
    p.add_argument(
        "--drafter", default="none", help="none, ngram, suffix, eagle3, dflash, mtp or a speculator folder"
    )
    p.add_argument("--k", default=None, help="drafted tokens per step, or 'auto' for the best k")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tau", type=float, help="acceptance length (bonus token included) measured at --k")
    g.add_argument("--alpha", type=float, help="constant per-token acceptance rate")
    g.add_argument("--acceptance", help="draftsmith bench JSON: per-position rates of the --drafter run")
    p.add_argument(
        "--baseline-tok-s",
        type=float,
        default=None,
        help="anchor: set the fixed per-forward overhead so plain decoding at the first batch runs this fast",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--html", default=None, help="write the token timing page here")
    p.set_defaults(func=cmd_simulate)


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine and write the `local` hardware profile")
    p.add_argument(
        "--target", default="smollm2-135m", help="target whose fixed per-forward overhead is measured"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=None, help="profile path (default: the draftsmith cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)


# --- resolving flags ------------------------------------------------------------------------------


def _drafter_key(spec: str, kind: str) -> str:
    key = spec.strip().lower()
    if key in DEFAULT_K:
        return key
    return "eagle3" if kind == AUTOREGRESSIVE else "dflash"  # a speculator folder


def _resolve_k(arg: str | None, key: str) -> tuple[int | None, bool]:
    """(k or None for auto, auto?)."""
    if arg is None:
        return DEFAULT_K.get(key, 8), False
    if str(arg).lower() == "auto":
        return None, True
    try:
        k = int(arg)
    except ValueError:
        raise UserError(f"--k {arg} must be a positive integer or 'auto'") from None
    if k <= 0:
        raise UserError(f"--k {k} must be a positive number of drafted tokens")
    return k, False


def _acceptance(args, key: str, k: int | None) -> tuple[acc.Acceptance, str]:
    k_ref = k or DEFAULT_K.get(key, 8)
    if args.acceptance:
        a, _ = acc.from_bench(args.acceptance, args.drafter)
        return a, a.source
    if args.tau is not None:
        a = acc.from_tau(args.tau, k_ref)
        return a, f"tau {args.tau:g} at k={k_ref} (alpha {a.alpha:.3f})"
    if args.alpha is not None:
        return acc.from_alpha(args.alpha), f"alpha {args.alpha:g}"
    alpha = DEFAULT_ALPHA[key]
    return acc.from_alpha(alpha), f"assumed alpha {alpha:g} for {key} (pass --tau, --alpha or --acceptance)"


def _anchor(hw: Hardware, m: ModelShape, tok_s: float, *, batch: int, **layout) -> Hardware:
    """The hardware with its fixed costs set so that plain decoding runs at `tok_s`: the per-forward
    overhead moves first; when the target is faster than that allows, every fixed latency (per
    forward, layer, MoE layer, token and row) shrinks by one factor instead."""
    from draftsmith.simulate.predict import baseline_step

    if tok_s <= 0:
        raise UserError(f"--baseline-tok-s {tok_s} must be positive")
    t, parts = baseline_step(m, hw, batch=batch, **layout)
    extra = 1.0 / tok_s - t
    if hw.overhead_s + extra >= 0:
        return replace(hw, overhead_s=hw.overhead_s + extra)
    fixed = parts["overhead"]
    if fixed <= 0 or fixed + extra < 0:
        raise UserError(
            f"--baseline-tok-s {tok_s} is faster than the roofline allows ({1 / (t - fixed):.1f} tok/s "
            "with no fixed overhead): check the model, hardware and dtype"
        )
    f = (fixed + extra) / fixed
    return replace(
        hw,
        overhead_s=hw.overhead_s * f,
        overhead_per_layer_s=hw.overhead_per_layer_s * f,
        moe_overhead_per_layer_s=hw.moe_overhead_per_layer_s * f,
        overhead_per_token_s=hw.overhead_per_token_s * f,
        overhead_per_row_s=hw.overhead_per_row_s * f,
    )


# --- simulate -------------------------------------------------------------------------------------


def simulate(args) -> dict:
    """Everything `simulate` prints, as one dict (the --json object)."""
    if args.gpus <= 0:
        raise UserError(f"--gpus {args.gpus} must be positive")
    if any(b <= 0 for b in args.batch):
        raise UserError("--batch values must be positive")
    if args.context < 0:
        raise UserError(f"--context {args.context} must be >= 0")
    m = load_model(args.model)
    hw = load_hardware(args.hardware)
    hw.peak_flops(args.dtype)
    expert_dtype = getattr(args, "expert_dtype", None)
    if expert_dtype:
        hw.peak_flops(expert_dtype)
    d = drafter_cost(args.drafter, m)
    common = _layout(args)
    if args.baseline_tok_s is not None:
        hw = _anchor(hw, m, args.baseline_tok_s, batch=args.batch[0], **common)
    out: dict = {
        "model": m.name,
        "model_source": m.source,
        "hardware": hw.name,
        "gpus": args.gpus,
        "expert_parallel": common["ep"],
        "dtype": args.dtype,
        "expert_dtype": expert_dtype or args.dtype,
        "context": args.context,
        "drafter": d.name,
        "drafter_kind": d.kind,
        "units": "tok/s per request unless named aggregate; step times and breakdown in seconds",
        "params_total": m.total_params,
        "params_active": m.active_params,
    }
    if d.real_params is not None:
        out["drafter_params"] = d.real_params
    rows: list[dict] = []
    preds: list[Prediction] = []
    if d.kind == NONE:
        if args.tau is not None or args.alpha is not None or args.acceptance:
            raise UserError("--tau, --alpha and --acceptance describe a drafter: add --drafter NAME")
        out["acceptance"] = None
        for b in args.batch:
            p = predict(m, hw, d, None, batch=b, k=0, **common)
            preds.append(p)
            rows.append(_row(p, best=0))
    else:
        key = _drafter_key(args.drafter, d.kind)
        k, auto = _resolve_k(args.k, key)
        a, src = _acceptance(args, key, k)
        out["acceptance"] = src
        max_k = MAX_K.get(key, 16) if auto else max(MAX_K.get(key, 16), k)
        for b in args.batch:
            bk, sweep = best_k(m, hw, d, a, batch=b, max_k=max_k, **common)
            p = sweep[(bk if auto else k) - 1]
            preds.append(p)
            rows.append(_row(p, best=bk))
        out["_acceptance_obj"] = a
        out["_max_k"] = max_k
    out.update({key: rows[0][key] for key in rows[0]})
    out["per_batch"] = rows
    out["_preds"] = preds
    out["_parts"] = (m, hw, d)
    return out


def _layout(args) -> dict:
    """The keyword arguments every cost function takes from the flags."""
    return dict(
        context=args.context,
        dtype=args.dtype,
        tp=args.gpus,
        ep=bool(getattr(args, "expert_parallel", False)),
        expert_dtype=getattr(args, "expert_dtype", None),
    )


def _row(p: Prediction, best: int) -> dict:
    return {
        "batch": p.batch,
        "k": p.k,
        "tau": round(p.tau, 4),
        "baseline_tok_s": round(p.baseline_tok_s, 2),
        "spec_tok_s": round(p.spec_tok_s, 2),
        "baseline_aggregate_tok_s": round(p.baseline_tok_s * p.batch, 2),
        "spec_aggregate_tok_s": round(p.spec_tok_s * p.batch, 2),
        "speedup": round(p.speedup, 4),
        "naive_speedup": round(p.tau, 4),
        "best_k": best,
        "step_time": {"baseline": p.baseline_step_s, "spec": p.spec_step_s},
        "breakdown": {"baseline": dict(p.baseline), "spec": dict(p.spec)},
        "verify_bound": dict(p.bound),
    }


def _public(out: dict) -> dict:
    return {k: v for k, v in out.items() if not k.startswith("_")}


def _print_table(out: dict) -> None:
    w = sys.stdout.write
    par = " (expert parallel)" if out.get("expert_parallel") else ""
    dt = (
        out["dtype"]
        if out.get("expert_dtype", out["dtype"]) == out["dtype"]
        else f"{out['dtype']}/experts {out['expert_dtype']}"
    )
    w(
        f"{out['model']} on {out['hardware']} x{out['gpus']}{par}, {dt}, context {out['context']}, "
        f"drafter {out['drafter']} ({out['drafter_kind']})\n"
    )
    w(f"  {out['params_total'] / 1e9:.2f}B parameters, {out['params_active'] / 1e9:.2f}B active per token\n")
    if out["acceptance"]:
        w(f"  acceptance: {out['acceptance']}\n")
    w("\n batch   k    tau | plain tok/s  spec tok/s | plain agg   spec agg | speedup  naive(=tau)  best k\n")
    for r in out["per_batch"]:
        w(
            f"{r['batch']:6d} {r['k']:3d} {r['tau']:6.2f} | {r['baseline_tok_s']:11.1f} {r['spec_tok_s']:11.1f} | "
            f"{r['baseline_aggregate_tok_s']:9.1f} {r['spec_aggregate_tok_s']:10.1f} | {r['speedup']:6.2f}x "
            f"{r['naive_speedup']:9.2f}x {r['best_k']:7d}\n"
        )
    r = out["per_batch"][0]
    w(f"\nstep time at batch {r['batch']} (ms)\n")
    labels = {"attention_compute": "attn_compute"}
    w("              " + "".join(f"{labels.get(n, n):>13s}" for n in (*BREAKDOWN, "total")) + "\n")
    for label, key in (("plain", "baseline"), ("speculative", "spec")):
        parts = r["breakdown"][key]
        w(f"{label:14s}" + "".join(f"{parts[n] * 1e3:13.3f}" for n in BREAKDOWN))
        w(f"{r['step_time'][key] * 1e3:13.3f}\n")


def _html(out: dict, path: str, args) -> None:
    from draftsmith.simulate.html import render_page

    m, hw, d = out["_parts"]
    p0: Prediction = out["_preds"][0]
    a = out.get("_acceptance_obj")
    common = _layout(args)
    k = max(p0.k, 1)
    batches = sorted({*SWEEP_BATCHES, *args.batch})
    if a is None:
        sweeps = {"batch": [(b, 1.0) for b in batches], "k": [], "tau": [], "naive": []}
    else:
        sweeps = {
            "batch": [(b, predict(m, hw, d, a, batch=b, k=k, **common).speedup) for b in batches],
            "k": [
                (p.k, p.speedup)
                for p in best_k(m, hw, d, a, batch=p0.batch, max_k=out["_max_k"], **common)[1]
            ],
        }
        base = p0.baseline_step_s / p0.spec_step_s
        taus = [1 + i * k / 20 for i in range(21)]
        sweeps["tau"] = [(round(t, 3), t * base) for t in taus]
        sweeps["naive"] = [(round(t, 3), t) for t in taus]
    summary = {
        "model": m.name,
        "hardware": f"{hw.name} x{args.gpus}",
        "drafter": d.name,
        "batch": p0.batch,
        "k": p0.k,
        "tau": p0.tau,
        "baseline_tok_s": p0.baseline_tok_s,
        "spec_tok_s": p0.spec_tok_s,
        "speedup": p0.speedup,
        "baseline_step_s": p0.baseline_step_s,
        "spec_step_s": p0.spec_step_s,
        "accept_probs": a.accept_probs(p0.k) if a is not None else [],
    }
    atomic_write_text(path, render_page(summary, sweeps))


def cmd_simulate(args) -> int:
    out = simulate(args)
    if args.html:
        _html(out, args.html, args)
    if args.json:
        print(json.dumps(_public(out)))
    else:
        _print_table(out)
        if args.html:
            print(f"\nwrote token timing page {args.html}")
    return 0


# --- calibrate ------------------------------------------------------------------------------------


def cmd_calibrate(args) -> int:
    from draftsmith.simulate.calibrate import calibrate

    profile, path = calibrate(args.target, args.device, args.out, log=lambda s: sys.stderr.write(s + "\n"))
    if args.json:
        print(json.dumps(profile))
    else:
        meas = profile["measured"]
        print(f"local profile written to {path}")
        for key, val in meas.items():
            print(f"  {key:28s} {val}")
    return 0
