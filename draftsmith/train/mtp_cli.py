"""`draftsmith train mtp`: flags -> `TrainConfig` -> `train_mtp`, and a short report.

`add_train_mtp_parser(subparsers)` adds the `mtp` subcommand to a `train` group; `cmd_train_mtp(args)`
runs it. `python -m draftsmith.train.mtp_cli ...` (and so `torchrun --nproc-per-node 2 -m
draftsmith.train.mtp_cli ...`) runs it standalone.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

HELP = "train or fine-tune an MTP (multi-token prediction) head for a target on regenerated conversations"


def add_train_mtp_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("mtp", help=HELP, description=HELP)
    p.add_argument("--target", default="smollm2-135m", help="smollm2-135m, HF folder, hub id or .gguf")
    p.add_argument("--data", required=True, help="conversations JSONL from `draftsmith data regenerate`")
    p.add_argument(
        "--out", required=True, help="output folder: the head (mtp.* tensors), metrics.jsonl, checkpoint/"
    )
    p.add_argument(
        "--init",
        default="random",
        help="random, last_layer (a copy of the target's last attention layer), native (fine-tune the "
        "head the target's checkpoint ships), or a folder with mtp.* tensors to fine-tune (a Qwen3.5/3.6 "
        "checkpoint or a head trained here)",
    )
    p.add_argument(
        "--ttt-steps", type=int, default=3, help="steps the head is unrolled on its own outputs in training"
    )
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per optimizer step (all ranks)")
    p.add_argument("--max-len", type=int, default=2048, help="longer conversations are split into windows")
    p.add_argument("--warmup-ratio", type=float, default=0.04)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument(
        "--eval-every", type=int, default=200, help="held-out tau every S steps (0: only at the end)"
    )
    p.add_argument("--eval-workload", default="chat", help="chat, code, long or a FILE.jsonl")
    p.add_argument("--eval-prompts", type=int, default=8, help="0 disables the held-out tau")
    p.add_argument("--eval-max-new-tokens", type=int, default=64)
    p.add_argument(
        "--eval-k", type=int, default=None, help="drafted tokens per step for tau (default: --ttt-steps)"
    )
    p.add_argument(
        "--save-every", type=int, default=None, help="checkpoint every S steps (default: --eval-every)"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from OUT/checkpoint exactly where it stopped"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument(
        "--max-steps", type=int, default=None, help="stop after step N (the schedule spans --epochs)"
    )
    p.add_argument(
        "--features",
        default=None,
        help="offline features from `draftsmith data features`, any --layers (default: online)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train_mtp)
    return p


def cmd_train_mtp(args: argparse.Namespace) -> int:
    from draftsmith.train.trainer import TrainConfig, train_mtp

    cfg = TrainConfig(
        target=args.target,
        data=args.data,
        out=args.out,
        method="mtp",
        init=args.init,
        ttt_steps=args.ttt_steps,
        epochs=args.epochs,
        lr=args.lr,
        batch_tokens=args.batch_tokens,
        max_len=args.max_len,
        warmup_ratio=args.warmup_ratio,
        grad_clip=args.grad_clip,
        eval_every=args.eval_every,
        eval_workload=args.eval_workload,
        eval_prompts=args.eval_prompts,
        eval_max_new_tokens=args.eval_max_new_tokens,
        eval_k=args.eval_k,
        save_every=args.save_every,
        resume=args.resume,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        max_steps=args.max_steps,
        progress=not args.no_progress,
        features=args.features,
        command=getattr(args, "command_line", None) or shlex.join(["draftsmith", *sys.argv[1:]]),
    )
    summary = train_mtp(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        tau = summary["tau"]
        print(
            f"trained {summary['step']}/{summary['total_steps']} steps, {summary['tokens_seen']} tokens, "
            f"{summary['wall_time_s']:.0f} s; held-out tau {'-' if tau is None else f'{tau:.2f}'}; "
            f"MTP head in {summary['out']} (load it with --drafter mtp:{summary['out']})"
        )
        print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsmith.train.mtp_cli ARGS` == `draftsmith train mtp ARGS` (for torchrun)."""
    from draftsmith.cli import main as cli_main

    return cli_main(["train", "mtp", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
