"""`draftsmith train dflash`: flags -> `TrainConfig` -> `trainer.train`, and a short report.

`add_train_dflash_parser(subparsers)` adds the `dflash` subcommand to a `train` group;
`cmd_train_dflash(args)` runs it. `python -m draftsmith.train.dflash_cli ...` (and so
`torchrun --nproc-per-node 2 -m draftsmith.train.dflash_cli ...`) runs it standalone.
"""

from __future__ import annotations

import argparse
import sys

from draftsmith.errors import UserError
from draftsmith.train.cli_common import add_common_args, common_config, report, standalone_main

HELP = "train a DFlash (block diffusion) speculator for a target on regenerated conversations"


def add_train_dflash_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("dflash", help=HELP, description=HELP)
    add_common_args(
        p,
        out_help="output folder: the speculator, metrics.jsonl, checkpoint/",
        epochs=6,
        lr=6e-4,
        grad_clip=1.0,
        eval_k_default="block size - 1",
    )
    p.add_argument(
        "--block-size", type=int, default=16, help="tokens per block: the last one plus B-1 drafts"
    )
    p.add_argument("--layers", type=int, default=5, help="draft decoder layers")
    p.add_argument("--anchors", type=int, default=512, help="random blocks per conversation and step")
    p.add_argument("--gamma", type=float, default=7.0, help="loss weight exp(-(j-1)/gamma) of block slot j")
    p.add_argument(
        "--target-layers",
        default=None,
        help="comma-separated target layer ids to condition on (default: 5 spread from 1 to L-3)",
    )
    p.add_argument(
        "--mask-token-id",
        type=int,
        default=None,
        help="token id of the mask slots (default: the tokenizer's mask or a spare special token)",
    )
    p.add_argument(
        "--norm-init",
        choices=("scaled", "ones"),
        default="scaled",
        help="a new draft's final norm starts at 1 / the target head's median row norm, so its first logits "
        "are not one-hot (scaled, default), or at 1 (ones)",
    )
    p.add_argument(
        "--init",
        default="random",
        help="random (default) or the folder of a trained DFlash speculator to continue from, with a new "
        "schedule (train longer than the first run planned, or on new traffic)",
    )
    p.set_defaults(func=cmd_train_dflash)
    return p


def _layer_ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(
            f"--target-layers {text!r}: give comma-separated layer ids such as 1,8,14,20,27"
        ) from None
    if not ids:
        raise UserError("--target-layers is empty: give comma-separated layer ids such as 1,8,14,20,27")
    return ids


def cmd_train_dflash(args: argparse.Namespace) -> int:
    from draftsmith.train.config import DFlashSettings, TrainConfig
    from draftsmith.train.trainer import train

    settings = DFlashSettings(
        block_size=args.block_size,
        layers=args.layers,
        anchors=args.anchors,
        gamma=args.gamma,
        target_layers=_layer_ids(args.target_layers),
        mask_token_id=args.mask_token_id,
        norm_init=args.norm_init,
    )
    summary = train(TrainConfig(**common_config(args), settings=settings, init=args.init))
    report(summary, f"speculator in {summary['out']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsmith.train.dflash_cli ARGS` == `draftsmith train dflash ARGS` (for torchrun)."""
    return standalone_main(add_train_dflash_parser, "dflash", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
