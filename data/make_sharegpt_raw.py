"""Write ShareGPT train-split conversations as they are (no regeneration) for speculator training.

The responses are ChatGPT's, not the target's, but the EAGLE-3 loss scores the draft against the
target's own next-token distribution at every position, so these still teach the target's behaviour
(in contexts it would not have written itself). They cost no generation time, which on a CPU is what
regenerated data is short of. Conversations already in `--skip` (the regenerated set) are left out;
each keeps its first two user/assistant exchanges.

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
    p.add_argument("--out", required=True)
    args = p.parse_args()
    skip = {r.get("id") for r in load_conversations(args.skip)} if args.skip else set()
    lines = []
    for rec in iter_sharegpt(split="train"):
        msgs = [m for m in rec["messages"] if m["role"] != "system"][:4]
        if rec["id"] in skip or len(msgs) < 2 or msgs[1]["role"] != "assistant":
            continue
        lines.append(json.dumps({"id": rec["id"], "source": "sharegpt-raw", "messages": msgs}) + "\n")
        if len(lines) == args.num:
            break
    atomic_write_text(args.out, "".join(lines))
    print(f"{len(lines)} conversations -> {args.out}")


if __name__ == "__main__":
    main()
