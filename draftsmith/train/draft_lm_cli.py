"""`draftsmith train draft-lm`: flags -> `TrainConfig` -> `trainer.train`, and a short report.

`add_train_draft_lm_parser(subparsers)` adds the `draft-lm` subcommand to a `train` group;
`cmd_train_draft_lm(args)` runs it. `python -m draftsmith.train.draft_lm_cli ...` (and so `torchrun
--nproc-per-node 2 -m draftsmith.train.draft_lm_cli ...`) runs it standalone.
"""

from __future__ import annotations

import argparse
import sys

from draftsmith.errors import UserError
from draftsmith.train.cli_common import add_common_args, common_config, report, standalone_main

HELP = "distil a small draft language model from a target on regenerated conversations (draft:PATH)"


def add_train_draft_lm_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("draft-lm", help=HELP, description=HELP)
    add_common_args(
        p,
        out_help="output folder: the draft LM (layers and norm; the embedding is the target's), "
        "metrics.jsonl, checkpoint/",
        epochs=2,
        lr=5e-4,
        grad_clip=1.0,
        eval_k_default="4",
    )
    p.add_argument("--layers", type=int, default=4, help="decoder layers of a fresh draft")
    p.add_argument(
        "--hidden",
        type=int,
        default=None,
        help="width of a fresh draft (default: the target's, sharing its frozen embedding and head; "
        "another width trains its own tied embedding)",
    )
    p.add_argument(
        "--init-from-target-layers",
        default=None,
        metavar="I,J,...",
        help="start from copies of these target layers (and its final norm) instead of fresh ones",
    )
    p.add_argument(
        "--init",
        default="random",
        help="random (default: fresh or copied layers, see above) or the folder of a trained draft LM to "
        "continue from, with a new schedule (train longer than the first run planned, or on new traffic)",
    )
    p.set_defaults(func=cmd_train_draft_lm)
    return p


def cmd_train_draft_lm(args: argparse.Namespace) -> int:
    from draftsmith.train.config import DraftLMSettings, TrainConfig
    from draftsmith.train.trainer import train

    settings = DraftLMSettings(
        layers=args.layers, hidden=args.hidden, init_layers=_layer_ids(args.init_from_target_layers)
    )
    cfg = TrainConfig(**common_config(args), settings=settings, init=args.init)
    if cfg.eval_k is None:
        cfg.eval_k = 4
    summary = train(cfg)
    report(summary, f"draft LM in {summary['out']} (load it with --drafters draft:{summary['out']})")
    return 0


def _layer_ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(
            f"--init-from-target-layers {text!r}: give target layer ids separated by commas, e.g. 0,1,2,3"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsmith.train.draft_lm_cli ARGS` == `draftsmith train draft-lm ARGS` (for torchrun)."""
    return standalone_main(add_train_draft_lm_parser, "draft-lm", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
