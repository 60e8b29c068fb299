"""Write ShareGPT train-split conversations as they are (no regeneration) for speculator training.

The responses are ChatGPT's, not the target's, but the EAGLE-3 loss scores the draft against the
target's own next-token distribution at every position, so these still teach the target's behaviour
(in contexts it would not have written itself). They cost no generation time, which on a CPU is what
regenerated data is short of. Conversations already in `--skip` (the regenerated set) are left out;
each keeps its first two user/assistant exchanges. `--code-fraction` asks for a share of
conversations whose answers hold a fenced code block (the code workload is where the draft was
weakest).

    .venv/bin/python data/make_sharegpt_raw.py --num 1100 --skip data/smollm2-train.jsonl \
        --out data/sharegpt-raw-train-1100.jsonl
"""

from __future__ import annotations

import argparse
import json

from draftsmith.data.sources import iter_sharegpt
from draftsmith.fileio import atomic_write_text
from draftsmith.train.data import load_conversations


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, required=True)
    p.add_argument("--skip", help="a conversations JSONL whose ids to leave out")
    p.add_argument(
        "--code-fraction",
        type=float,
        default=0.0,
        help="at least this share of the conversations has a fenced code block in an answer",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()
    skip = {r.get("id") for r in load_conversations(args.skip)} if args.skip else set()
    code_wanted = round(args.code_fraction * args.num)
    code, other = [], []
    for rec in iter_sharegpt(split="train"):
        msgs = [m for m in rec["messages"] if m["role"] != "system"][:4]
        if rec["id"] in skip or len(msgs) < 2 or msgs[1]["role"] != "assistant":
            continue
        line = json.dumps({"id": rec["id"], "source": "sharegpt-raw", "messages": msgs}) + "\n"
        has_code = any(m["role"] == "assistant" and "```" in m["content"] for m in msgs)
        if has_code and len(code) < code_wanted:
            code.append(line)
        elif len(other) < args.num - code_wanted:
            other.append(line)
        if len(code) + len(other) == args.num:
            break
    lines = code + other  # the trainer shuffles; kept in two runs so the file says what it holds
    atomic_write_text(args.out, "".join(lines))
    print(f"{len(lines)} conversations ({len(code)} with code) -> {args.out}")


if __name__ == "__main__":
    main()
