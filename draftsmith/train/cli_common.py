"""The flags every `draftsmith train METHOD` shares, their TrainConfig fields, and the final report.

Each method's CLI module adds only its own flags (EAGLE-3: --ttt-steps, --draft-vocab; DFlash:
--block-size, --anchors, ...) and its recipe's defaults for the shared ones.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys


def add_common_args(
    p: argparse.ArgumentParser,
    *,
    out_help: str,
    epochs: int,
    lr: float,
    grad_clip: float,
    eval_k_default: str,
) -> None:
    """--target/--data/--out first, then the schedule, evaluation, checkpoint and device flags."""
    p.add_argument("--target", default="smollm2-135m", help="smollm2-135m, HF folder, hub id or .gguf")
    p.add_argument("--data", required=True, help="conversations JSONL from `draftsmith data regenerate`")
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per optimizer step (all ranks)")
    p.add_argument("--max-len", type=int, default=2048, help="longer conversations are split into windows")
    p.add_argument("--warmup-ratio", type=float, default=0.04)
    p.add_argument("--grad-clip", type=float, default=grad_clip)
    p.add_argument(
        "--eval-every", type=int, default=200, help="held-out tau every S steps (0: only at the end)"
    )
    p.add_argument("--eval-workload", default="chat", help="chat, code, long or a FILE.jsonl")
    p.add_argument("--eval-prompts", type=int, default=8, help="0 disables the held-out tau")
    p.add_argument("--eval-max-new-tokens", type=int, default=64)
    p.add_argument(
        "--eval-every-minutes",
        type=float,
        default=None,
        help="also evaluate each time the training wall time passes a multiple of this many minutes",
    )
    p.add_argument(
        "--eval-data",
        default=None,
        help="held-out conversations JSONL (the --data format): teacher-forced accuracy per position at "
        "every evaluation (metrics.jsonl: heldout_acc, heldout_loss)",
    )
    p.add_argument(
        "--eval-k",
        type=int,
        default=None,
        help=f"drafted tokens per step for tau (default: {eval_k_default})",
    )
    p.add_argument(
        "--save-every", type=int, default=None, help="checkpoint every S steps (default: --eval-every)"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from OUT/checkpoint exactly where it stopped"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float32"],
        help="bfloat16 autocast or float32; auto: bfloat16 where the device computes it natively "
        "(a GPU, a CPU with AMX or AVX512-BF16), else float32",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument(
        "--max-steps", type=int, default=None, help="stop after step N (the schedule spans --epochs)"
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds of training (evaluations and checkpoints included): the schedule anneals to 0 "
        "and the run ends when they are spent or the epochs are done, whichever comes first",
    )
    p.add_argument(
        "--features", default=None, help="offline features from `draftsmith data features` (default: online)"
    )
    p.add_argument("--no-progress", action="store_true")


def common_config(args: argparse.Namespace) -> dict:
    """TrainConfig keyword arguments from the shared flags."""
    names = ("target", "data", "out", "epochs", "lr", "batch_tokens", "max_len", "warmup_ratio",
             "grad_clip", "eval_every", "eval_workload", "eval_prompts", "eval_max_new_tokens", "eval_k", "eval_data", "eval_every_minutes",
             "save_every", "resume", "seed", "dtype", "device", "max_steps", "time_budget", "features")  # fmt: skip
    return {n: getattr(args, n) for n in names} | {
        "progress": not args.no_progress,
        "command": getattr(args, "command_line", None) or shlex.join(["draftsmith", *sys.argv[1:]]),
    }


def report(summary: dict, what: str) -> None:
    """One human line and one JSON line, on rank 0 only."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    tau = summary["tau"]
    print(
        f"trained {summary['step']}/{summary['total_steps']} steps, {summary['tokens_seen']} tokens, "
        f"{summary['wall_time_s']:.0f} s; held-out tau {'-' if tau is None else f'{tau:.2f}'}; {what}"
    )
    print(json.dumps(summary))


def standalone_main(add_parser, name: str, argv: list[str]) -> int:
    """`python -m draftsmith.train.<method>_cli ARGS` (what torchrun starts): the `train <name>`
    subcommand alone, parsed and run as `draftsmith train <name> ARGS` would be."""
    from draftsmith.command import Parser, run

    parser = Parser(prog="draftsmith train")
    add_parser(parser.add_subparsers(dest="train_command", required=True, parser_class=Parser))
    return run(parser, [name, *argv], prefix=("train",))
