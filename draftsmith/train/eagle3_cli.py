"""`draftsmith train eagle3`: flags -> `TrainConfig` -> `trainer.train`, and a short report.

`add_train_eagle3_parser(subparsers)` adds the `eagle3` subcommand to a `train` group;
`cmd_train_eagle3(args)` runs it. `python -m draftsmith.train.eagle3_cli ...` (and so
`torchrun --nproc-per-node 2 -m draftsmith.train.eagle3_cli ...`) runs it standalone.
"""

from __future__ import annotations

import argparse
import sys

from draftsmith.train.cli_common import add_common_args, common_config, report, standalone_main

HELP = "train an EAGLE-3 speculator for a target on regenerated conversations"


def add_train_eagle3_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("eagle3", help=HELP, description=HELP)
    add_common_args(
        p,
        out_help="output folder: the speculator, metrics.jsonl, checkpoint/",
        epochs=1,
        lr=1e-4,
        grad_clip=0.5,
        eval_k_default="--ttt-steps",
    )
    p.add_argument("--ttt-steps", type=int, default=7, help="training-time-test unroll depth")
    p.add_argument(
        "--draft-vocab", type=int, default=32000, help="draft vocabulary size (capped at the target's)"
    )
    p.add_argument(
        "--head-init",
        choices=("target", "random"),
        default="random",
        help="start the draft LM head at random (default) or at the target's rows for the draft vocab "
        "(on SmolLM2 it began with larger losses and trailed random for the first 60k tokens)",
    )
    p.add_argument(
        "--attn-init",
        choices=("token", "random"),
        default="token",
        help="a new draft's attention starts reading each position's own token and copying its embedding "
        "(token, default; on SmolLM2 held-out accuracy rose faster at every unrolled step) or at random",
    )
    p.add_argument(
        "--init",
        default="random",
        help="random (default) or the folder of a trained EAGLE-3 speculator to continue from, with a new "
        "schedule and its own draft vocabulary (train longer than the first run planned, or on new traffic)",
    )
    p.set_defaults(func=cmd_train_eagle3)
    return p


def cmd_train_eagle3(args: argparse.Namespace) -> int:
    from draftsmith.train.config import EAGLE3Settings, TrainConfig
    from draftsmith.train.trainer import train

    settings = EAGLE3Settings(
        ttt_steps=args.ttt_steps,
        draft_vocab=args.draft_vocab,
        head_init=args.head_init,
        attn_init=args.attn_init,
    )
    summary = train(TrainConfig(**common_config(args), settings=settings, init=args.init))
    report(summary, f"speculator in {summary['out']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsmith.train.eagle3_cli ARGS` == `draftsmith train eagle3 ARGS` (for torchrun)."""
    return standalone_main(add_train_eagle3_parser, "eagle3", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
