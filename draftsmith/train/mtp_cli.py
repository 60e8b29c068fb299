"""`draftsmith train mtp`: flags -> `TrainConfig` -> `trainer.train`, and a short report.

`add_train_mtp_parser(subparsers)` adds the `mtp` subcommand to a `train` group; `cmd_train_mtp(args)`
runs it. `python -m draftsmith.train.mtp_cli ...` (and so `torchrun --nproc-per-node 2 -m
draftsmith.train.mtp_cli ...`) runs it standalone.
"""

from __future__ import annotations

import argparse
import sys

from draftsmith.train.cli_common import add_common_args, common_config, report, standalone_main

HELP = "train or fine-tune an MTP (multi-token prediction) head for a target on regenerated conversations"


def add_train_mtp_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("mtp", help=HELP, description=HELP)
    add_common_args(
        p,
        out_help="output folder: the head (mtp.* tensors), metrics.jsonl, checkpoint/",
        epochs=4,
        lr=3e-4,
        grad_clip=1.0,
        eval_k_default="--ttt-steps",
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
    p.set_defaults(func=cmd_train_mtp)
    return p


def cmd_train_mtp(args: argparse.Namespace) -> int:
    from draftsmith.train.config import MTPSettings, TrainConfig
    from draftsmith.train.trainer import train

    settings = MTPSettings(ttt_steps=args.ttt_steps)
    summary = train(TrainConfig(**common_config(args), settings=settings, init=args.init))
    report(summary, f"MTP head in {summary['out']} (load it with --drafter mtp:{summary['out']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsmith.train.mtp_cli ARGS` == `draftsmith train mtp ARGS` (for torchrun)."""
    return standalone_main(add_train_mtp_parser, "mtp", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
