"""`draftsmith tune`: a speculator fitted to a user's own traffic, and a report of what it buys.

    split (held-out prompts never trained on) -> regenerate the training prompts' answers with the
    target -> continue training the speculator (or a new one) within the time budget -> measure every
    method on the held-out prompts in one bench run -> report.json, report.md, curve.png

OUT is the tuned speculator's own folder (`eagle3:OUT` or `dflash:OUT` loads it; `draftsmith
export` exports it) and also holds the run: `tune.json` (settings and which stages are done),
`train-prompts.jsonl`, `heldout-prompts.jsonl`, `data/train.jsonl` (the regenerated answers),
`checkpoint/`, `metrics.jsonl`, `bench.json` and the report. Every stage resumes: an interrupted
regeneration keeps its finished answers, training continues from its checkpoint under the same
schedule, and a stage marked done is not run again (`--resume`).

The time budget (`--budget-minutes`) covers regeneration and training; the training schedule
anneals to zero when the rest of it is spent (`train --time-budget`). The measurement afterwards
is not counted.

This module knows the order of the stages and what each needs from the last. Splitting is in
`split`, the report in `report`; regeneration, training, bench and the simulator are the
commands' own functions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_write_json

HELP = "fit a speculator to your own traffic (regenerate, train, measure, report)"
STATE = "tune.json"
RECIPES = {  # CPU-sized continued training: many cheap updates (see train/README.md)
    "eagle3": {"lr": 3e-4, "batch_tokens": 1024},
    "dflash": {"lr": 6e-4, "batch_tokens": 1024, "anchors": 64},
}


def add_tune_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("tune", help=HELP, description=HELP)
    p.add_argument("--target", default="smollm2-135m", help="smollm2-135m, HF folder, hub id or .gguf")
    p.add_argument(
        "--traffic", required=True, help='JSONL, one {"messages": [...]} or {"prompt": ...} per line'
    )
    p.add_argument("--from", dest="base", default=None, help="the EAGLE-3 or DFlash speculator to continue")
    p.add_argument(
        "--method", choices=("eagle3", "dflash"), default=None, help="without --from: train a new one"
    )
    p.add_argument("--out", required=True, help="the tuned speculator's folder (and the run's files)")
    p.add_argument("--holdout", default="0.2", help="held-out prompts: a count (20) or a fraction (0.2)")
    p.add_argument("--budget-minutes", type=float, default=30.0, help="regeneration plus training")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per answer, regenerated and measured")
    p.add_argument("--k", type=int, default=7, help="drafted tokens per step when measuring")
    p.add_argument(
        "--hardware", default="h100,b200", help="comma-separated simulator hardware for predictions"
    )
    p.add_argument(
        "--hybrid-min-score", type=float, default=2.0, help="S of the suffix:min_score=S+... hybrid"
    )
    p.add_argument("--endpoint", default=None, help="regenerate through an OpenAI-compatible server instead")
    p.add_argument("--batch-size", type=int, default=32, help="answers regenerated at once (local)")
    p.add_argument("--lr", type=float, default=None, help="default: 3e-4 (EAGLE-3), 6e-4 (DFlash)")
    p.add_argument("--batch-tokens", type=int, default=None, help="tokens per optimizer step (default 1024)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float32"],
        help="target, for answers and bench (auto: bfloat16 where native, else float32)",
    )
    p.add_argument("--seed", type=int, default=0, help="split and training seed")
    p.add_argument("--resume", action="store_true", help="continue an interrupted tune in OUT")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_tune)
    return p


def speculator_method(folder: str) -> str:
    """eagle3 or dflash, from a speculator folder's config.json (any layout draftsmith loads)."""
    from draftsmith.formats.kind import read_config, speculator_kind

    cfg = read_config(folder)
    kind = speculator_kind(folder, cfg)
    if kind not in ("eagle3", "dflash"):
        raise UserError(
            f"--from {folder}: not an EAGLE-3 or DFlash speculator (architectures "
            f"{sorted(cfg.get('architectures') or [])}); tune continues those two kinds"
        )
    return kind


def cmd_tune(args) -> int:
    from draftsmith.tune.split import load_traffic, parse_holdout, split_traffic, write_prompts

    _check_args(args)
    out = Path(args.out)
    method = speculator_method(args.base) if args.base else args.method
    settings = {
        "target": args.target,
        "traffic_sha256": _digest(args.traffic),
        "from": str(Path(args.base).resolve()) if args.base else None,
        "method": method,
        "holdout": args.holdout,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "budget_minutes": args.budget_minutes,
        "dtype": args.dtype,
    }
    state = _open_state(out, settings, args.resume)
    state["commands"] = [*state.get("commands", []), args.command_line]
    if args.base and "from_weights_sha256" not in state:  # which weights the "before" row measured
        weights = Path(args.base).expanduser() / "model.safetensors"
        state["from_weights_sha256"] = _digest(str(weights)) if weights.is_file() else None
    t_start = time.perf_counter()

    # ---- split -----------------------------------------------------------------------------------
    prompts = load_traffic(args.traffic)
    train, held = split_traffic(prompts, parse_holdout(args.holdout), seed=args.seed)
    out.mkdir(parents=True, exist_ok=True)
    train_file, held_file = out / "train-prompts.jsonl", out / "heldout-prompts.jsonl"
    write_prompts(train_file, train)
    write_prompts(held_file, held)
    state |= {"train_prompts": len(train), "holdout_prompts": len(held)}
    _save_state(out, state)
    print(f"tune: {len(train)} training prompts, {len(held)} held out -> {out}")

    # ---- regenerate the training answers -----------------------------------------------------------
    data = out / "data" / "train.jsonl"
    if not state["done"].get("regenerate"):
        t0 = time.perf_counter()
        data.parent.mkdir(parents=True, exist_ok=True)
        _regenerate(args, train_file, data, len(train))
        state["regenerate_s"] = state.get("regenerate_s", 0.0) + time.perf_counter() - t0
        state["done"]["regenerate"] = True
        _save_state(out, state)

    # ---- train within what is left of the budget ---------------------------------------------------
    if not state["done"].get("train"):
        left = 60.0 * args.budget_minutes - state.get("regenerate_s", 0.0)
        if "train_budget_s" not in state:  # fixed at the first try, so a resumed run keeps its schedule
            # Regeneration that ate the budget still leaves training a quarter of it.
            state["train_budget_s"] = max(15.0 * args.budget_minutes, left)
            _save_state(out, state)
        summary = _train(args, method, out, data, held_file, len(held), state["train_budget_s"])
        state["train"] = summary
        state["done"]["train"] = True
        _save_state(out, state)

    # ---- measure every method on the held-out prompts, in one run --------------------------------
    methods = _methods(method, args.base, out, args.hybrid_min_score)
    if not state["done"].get("measure"):
        bench = _measure(args, held_file, len(held), methods)
        atomic_write_json(out / "bench.json", bench)
        state["done"]["measure"] = True
        _save_state(out, state)
    bench = json.loads((out / "bench.json").read_text())

    # ---- report -------------------------------------------------------------------------------------
    report = _report(args, method, out, state, bench, methods, data)
    state["tune_s"] = state.get("tune_s", 0.0) + time.perf_counter() - t_start
    _save_state(out, state)
    _print_summary(report, out)
    return 0


# ---------------------------------------------------------------- stages


def _regenerate(args, train_file: Path, data: Path, n: int) -> None:
    from draftsmith.data.regenerate import add_regenerate_parser, cmd_regenerate

    parser = argparse.ArgumentParser()
    add_regenerate_parser(parser.add_subparsers())
    argv = ["regenerate", "--target", args.target, "--dtype", args.dtype, "--source", str(train_file),
            "--num", str(n), "--max-new-tokens", str(args.max_new_tokens), "--max-turns", "8",
            "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--out", str(data)]  # fmt: skip
    if args.endpoint:
        argv += ["--endpoint", args.endpoint]
    if args.no_progress:
        argv.append("--no-progress")
    cmd_regenerate(parser.parse_args(argv))


def _train(args, method: str, out: Path, data: Path, held_file: Path, n_held: int, budget_s: float) -> dict:
    from draftsmith.train import checkpoint
    from draftsmith.train.config import SETTINGS, TrainConfig
    from draftsmith.train.trainer import train

    recipe = RECIPES[method] | {k: v for k, v in (("lr", args.lr), ("batch_tokens", args.batch_tokens)) if v}
    base = _base_settings(args.base, method) if args.base else {}
    anchors = {"anchors": recipe["anchors"]} if method == "dflash" else {}
    cfg = TrainConfig(
        target=args.target,
        data=str(data),
        out=str(out),
        settings=SETTINGS[method](**base, **anchors),
        epochs=50,  # the time budget ends the run; epochs only bound a tiny traffic's repetitions
        time_budget=budget_s,
        lr=recipe["lr"],
        batch_tokens=recipe["batch_tokens"],
        init=str(Path(args.base).resolve()) if args.base else "random",
        eval_workload=str(held_file),
        eval_prompts=min(8, n_held),
        eval_max_new_tokens=min(64, args.max_new_tokens),
        eval_k=args.k,
        eval_every=0,
        eval_every_minutes=max(0.1, budget_s / 60.0 / 8),  # about 8 points on the curve
        eval_at_start=True,
        save_every=25,
        resume=checkpoint.read_state(out) is not None,
        seed=args.seed,
        progress=not args.no_progress,
        command=args.command_line,
    )
    return train(cfg)


def _base_settings(base: str, method: str) -> dict:
    """The shape flags a continued speculator must keep (its trainer refuses others)."""
    folder = Path(base).expanduser()
    cfg = json.loads((folder / "config.json").read_text())
    info_path = folder / "draftsmith.json"
    trained = json.loads(info_path.read_text()).get("train", {}) if info_path.is_file() else {}
    if method == "eagle3":
        return {
            "draft_vocab": int(cfg.get("draft_vocab_size") or trained.get("draft_vocab", 32000)),
            "ttt_steps": int(trained.get("ttt_steps", 7)),
        }
    d = cfg.get("dflash_config") or {}
    return {
        "layers": int(cfg["num_hidden_layers"]),
        "block_size": int(d.get("block_size") or cfg.get("block_size")),
        "target_layers": list(d["target_layer_ids"]),
        "mask_token_id": int(d["mask_token_id"]),
        "gamma": float(trained.get("gamma", 7.0)),
    }


def _methods(method: str, base: str | None, out: Path, min_score: float) -> dict[str, str | None]:
    tuned = f"{method}:{out}"
    return {
        "ar": "ar",
        "ngram": "ngram",
        "suffix": "suffix",
        "base": f"{method}:{base}" if base else None,
        "tuned": tuned,
        "hybrid": f"suffix:min_score={min_score:g}+{tuned}",
    }


def _measure(args, held_file: Path, n_held: int, methods: dict[str, str | None]) -> dict:
    from draftsmith.bench.runner import run_bench
    from draftsmith.data.workloads import load_workload
    from draftsmith.decoding.sampling import SamplingParams
    from draftsmith.target.chat import encode_messages
    from draftsmith.target.model import load_target

    target = load_target(args.target, args.dtype)
    prompts = [encode_messages(target.tokenizer, p.messages) for p in load_workload(str(held_file), n_held)]
    bench = run_bench(
        target,
        prompts,
        methods=[m for m in methods.values() if m is not None],
        peers=[],
        sampling=SamplingParams(seed=args.seed),
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        workload=held_file.name,
        progress=not args.no_progress,
    )
    bench["mean_prompt_tokens"] = round(sum(map(len, prompts)) / len(prompts), 1)
    return bench


def _report(args, method, out: Path, state: dict, bench: dict, methods, data: Path) -> dict:
    from draftsmith.tune.report import (
        build_report,
        curve_points,
        plot_curve,
        predictions,
        write_json,
        write_markdown,
    )

    info = json.loads((out / "draftsmith.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    tuned = next(r for r in bench["runs"] if r["method"] == methods["tuned"])
    context = int(bench["mean_prompt_tokens"] + bench["max_new_tokens"] / 2)
    preds = predictions(
        _target_config(args.target), args.target, out, tuned["accept_per_pos"], tuned["tau"],
        int(tuned.get("k") or args.k), [h.strip() for h in args.hardware.split(",") if h.strip()], context,
    )  # fmt: skip
    points = curve_points(metrics, info.get("tau_start"))
    report = build_report(
        bench,
        methods,
        holdout_prompts=state["holdout_prompts"],
        train_prompts=state["train_prompts"],
        train_tokens=_answer_tokens(data),
        train_tokens_seen=info.get("tokens_seen"),
        train_steps=info.get("steps"),
        train_minutes=round(info.get("wall_time_s", 0.0) / 60.0, 2),
        regenerate_minutes=round(state.get("regenerate_s", 0.0) / 60.0, 2),
        tune_minutes=round((state.get("regenerate_s", 0.0) + info.get("wall_time_s", 0.0)) / 60.0, 2),
        budget_minutes=args.budget_minutes,
        predictions=preds,
        prediction_context=context,
        curve=points,
        method=method,
        traffic=args.traffic,
        **{"from": state["settings"]["from"], "from_weights_sha256": state.get("from_weights_sha256")},
        out=str(out),
        command=state["commands"][0],
        commands=state["commands"],
    )
    plot_curve(points, report["baselines"], report["tau_before"], out / "curve.png")
    write_json(report, out / "report.json")
    write_markdown(report, out / "report.md", "curve.png")
    return report


def _target_config(target: str) -> dict:
    """The target's config as a dict (for the simulator's model shape), without loading weights."""
    from transformers import AutoConfig

    from draftsmith.target.resolve import resolve_target

    return AutoConfig.from_pretrained(resolve_target(target).model_path).to_dict()


def _answer_tokens(data: Path) -> int:
    return sum(json.loads(line)["num_new_tokens"] for line in data.read_text().splitlines() if line.strip())


def _print_summary(report: dict, out: Path) -> None:
    from draftsmith.tune.report import _summary

    print(_summary(report))
    print(f"report: {out / 'report.md'} ({out / 'report.json'}, {out / 'curve.png'})")
    keys = (
        "tau_before",
        "tau_after",
        "tau_after_hybrid",
        "speedup_before",
        "speedup_after",
        "speedup_after_hybrid",
    )
    print(json.dumps({k: report[k] for k in keys} | {"baselines": report["baselines"], "out": str(out)}))


# ---------------------------------------------------------------- state and checks


def _open_state(out: Path, settings: dict, resume: bool) -> dict:
    path = out / STATE
    if not path.is_file():
        if resume:
            raise UserError(f"--resume but {out} holds no tune run; drop --resume to start one")
        if out.exists() and any(out.iterdir()):
            raise UserError(f"{out} exists and is not empty; choose a new --out for the tuned speculator")
        return {"settings": settings, "done": {}, "commands": []}
    state = json.loads(path.read_text())
    if not resume:
        raise UserError(
            f"{out} already holds a tune run; pass --resume to continue it or choose another --out"
        )
    diff = [
        f"{k} {state['settings'].get(k)!r} -> {v!r}"
        for k, v in settings.items()
        if state["settings"].get(k) != v
    ]
    if diff:
        raise UserError(
            f"--resume: the tune run in {out} was started with other settings ({'; '.join(diff)}); "
            "pass the same ones or choose another --out"
        )
    return state


def _save_state(out: Path, state: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / STATE, state)


def _check_args(args) -> None:
    if args.base is None and args.method is None:
        raise UserError(
            "give --from SPECULATOR_DIR to continue a speculator, or --method eagle3|dflash for a new one"
        )
    if args.base is not None and args.method is not None and speculator_method(args.base) != args.method:
        raise UserError(
            f"--method {args.method} but --from {args.base} is a {speculator_method(args.base)} speculator"
        )
    for flag, v in (("--budget-minutes", args.budget_minutes), ("--max-new-tokens", args.max_new_tokens),
                    ("--k", args.k), ("--batch-size", args.batch_size)):  # fmt: skip
        if not v > 0:
            raise UserError(f"{flag} {v} must be positive")
    for flag, v in (("--lr", args.lr), ("--batch-tokens", args.batch_tokens)):
        if v is not None and not v > 0:
            raise UserError(f"{flag} {v} must be positive")
    from draftsmith.simulate.hardware import hardware_names

    known = set(hardware_names())
    for h in (h.strip() for h in args.hardware.split(",")):
        if h and h not in known:
            raise UserError(f"--hardware {h}: choose from {', '.join(sorted(known))}")
    from draftsmith.tune.split import parse_holdout

    parse_holdout(args.holdout)


def _digest(path: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"--traffic {path} not found; pass a .jsonl file with one prompt per line")
    return hashlib.sha256(p.read_bytes()).hexdigest()
