"""A token ranking saved beside a speculator's weights: every target id, the most frequent among its
training data's assistant tokens first. A drafter's `vocab=N` option keeps its LM head's rows for the
first N ids: a smaller head, read at every draft step, for the few tokens it then cannot propose.

Two files hold it. A draft-LM folder keeps `vocab_order.safetensors`; a DFlash folder keeps
`vocab_order.json`, because the engines that load DFlash folders (vLLM, z-lab's `dflash`) read every
`*.safetensors` file in it as weights, and a stray tensor there would fail their load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_save_safetensors, atomic_write_text

SAFETENSORS = "vocab_order.safetensors"
JSON = "vocab_order.json"


def save(path: str | Path, order: torch.Tensor, as_json: bool = False) -> None:
    """Write the ranking (a permutation of the vocabulary) into the folder at `path`."""
    if as_json:
        atomic_write_text(Path(path) / JSON, json.dumps({"ids": order.tolist()}, separators=(",", ":")))
    else:
        atomic_save_safetensors({"ids": order.to(torch.int32).contiguous()}, Path(path) / SAFETENSORS)


def load(path: str | Path) -> torch.Tensor | None:
    """The folder's ranking (int64 [V]) from either file, or None where it has none."""
    from safetensors.torch import load_file

    folder = Path(path).expanduser()
    if (folder / SAFETENSORS).is_file():
        return load_file(str(folder / SAFETENSORS))["ids"].long()
    if (folder / JSON).is_file():
        return torch.tensor(json.loads((folder / JSON).read_text())["ids"], dtype=torch.long)
    return None


def head_rows(spec: str, path: str | Path, n: int, vocab_size: int) -> torch.Tensor:
    """The target ids of the `n` most frequent tokens below `vocab_size`, for the drafter `spec`."""
    order = load(path)
    if order is None:
        raise UserError(
            f"{spec}:{path}:vocab={n}: the folder has no {SAFETENSORS} or {JSON} (the token ranking "
            "draftsmith's training saves): drop vocab= to draft over the whole vocabulary"
        )
    order = order[order < vocab_size]
    return order[:n].clone()
