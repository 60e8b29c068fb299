"""Atomic writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def save_checkpoint_dir(
    path: str | os.PathLike, tensors: dict, config: dict, extra: dict | None = None
) -> Path:
    """A speculator folder: `model.safetensors`, `config.json` and, with `extra`, `draftsmith.json`.

    Each file is written under a temporary name and renamed, so a reader never sees half of one.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / ".model.safetensors.tmp"
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    tmp.replace(path / "model.safetensors")
    atomic_write_json(path / "config.json", config)
    if extra is not None:
        atomic_write_json(path / "draftsmith.json", extra)
    return path
