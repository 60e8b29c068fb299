"""What every draftsmith command shares: a parser whose errors are one line with exit code 2, and
the runner that turns a `UserError` into that line.

`draftsmith.cli` builds the whole command tree on these; the training entry points that torchrun
starts (`python -m draftsmith.train.eagle3_cli ...`) build their one subcommand on them, so neither
imports the other.
"""

from __future__ import annotations

import argparse
import sys

from draftsmith.errors import UserError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other user error
        sys.stderr.write(f"draftsmith: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def add_dtype_device_args(p: argparse.ArgumentParser) -> None:
    """--dtype and --device of every command that runs the target."""
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float32"],
        help="auto: bfloat16 where the device computes it natively, else float32",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])


def run(parser: argparse.ArgumentParser, argv: list[str], prefix: tuple[str, ...] = ()) -> int:
    """Parse `argv` and run the chosen command; `command_line` records it as the user would type it
    (`draftsmith` and `prefix`, the words a standalone entry point stands for, then `argv`)."""
    args = parser.parse_args(argv)
    args.command_line = " ".join(["draftsmith", *prefix, *argv])
    try:
        return args.func(args)
    except UserError as e:
        sys.stderr.write(f"draftsmith: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("draftsmith: interrupted\n")
        return 130
