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
import os

from draftsmith.data.sources import iter_sharegpt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, required=True)
    p.add_argument("--skip", help="a conversations JSONL whose ids to leave out")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    skip = set()
    if args.skip:
        with open(args.skip, encoding="utf-8") as f:
            skip = {json.loads(line)["id"] for line in f if line.strip()}
    n, tmp = 0, args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in iter_sharegpt(split="train"):
            msgs = [m for m in rec["messages"] if m["role"] != "system"][:4]
            if rec["id"] in skip or len(msgs) < 2 or msgs[1]["role"] != "assistant":
                continue
            f.write(json.dumps({"id": rec["id"], "source": "sharegpt-raw", "messages": msgs}) + "\n")
            n += 1
            if n == args.num:
                break
    os.replace(tmp, args.out)
    print(f"{n} conversations -> {args.out}")


if __name__ == "__main__":
    main()
