"""Write the token ranking that `dflash:PATH:vocab=N` reads into a speculator folder trained before
training saved it: the target ids by frequency among the training data's assistant tokens, exactly
as `draftsmith train dflash` now computes it. The data and target default to the ones the folder's
draftsmith.json records.

    .venv/bin/python scripts/vocab_order.py speculators/smollm2-135m-dflash [--data D] [--target T]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.formats import vocab_order
from draftsmith.target.model import load_target
from draftsmith.train.data import load_conversations, token_ranking, tokenize_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--data", help="default: the data in the folder's draftsmith.json")
    p.add_argument("--target", help="default: the target_spec in the folder's draftsmith.json")
    p.add_argument("--max-len", type=int, default=2048)
    a = p.parse_args()
    if not (a.folder / "draftsmith.json").is_file():
        p.error(f"{a.folder} has no draftsmith.json: give a speculator folder draftsmith trained")  # exit 2
    meta = json.loads((a.folder / "draftsmith.json").read_text())
    target = load_target(a.target or meta["target_spec"], "float32")
    records = load_conversations(a.data or meta["data"])
    examples = tokenize_dataset(target.tokenizer, records, a.max_len)
    order = token_ranking(examples, target.vocab_size)
    vocab_order.save(a.folder, order, as_json=meta.get("kind") != "draft-lm")  # see vocab_order.py
    print(f"{a.folder}: ranked {len(order)} ids from {len(examples)} examples")


if __name__ == "__main__":
    main()
