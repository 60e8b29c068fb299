"""Atomic writes: a reader (or a crash) never sees a half-written file or folder.

Each file or folder is written under a temporary name beside its destination and renamed into
place, with the mode a plain `open()` / `mkdir()` gives (0o666 / 0o777 less the umask: 0o644 /
0o755 under the usual umask 022), so a serving engine running as another user reads it like any
other checkpoint. tempfile gives owner-only modes (0o600 / 0o700), and so does safetensors'
`save_file` (0o600 with safetensors 0.8), which transformers' `save_pretrained` calls: modes are
set here, not left to them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from draftsmith.errors import UserError


def _temp_name(parent: Path, name: str) -> Path:
    return parent / f".{name}.{secrets.token_hex(6)}.tmp"


def _umask() -> int:
    try:  # Linux reports it without changing it
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_modes(root: str | os.PathLike) -> None:
    """Give `root` and everything under it the modes open() and mkdir() would have given."""
    mask = _umask()
    root = Path(root)
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path.parent, path.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def make_temp_dir(parent: str | os.PathLike, name: str) -> Path:
    """A new empty folder in `parent`, named after `name` (hidden), with plain mkdir's mode."""
    tmp = _temp_name(Path(parent), name)
    tmp.mkdir()
    return tmp


def require_empty_dir(dst: str | os.PathLike) -> None:
    """A one-line UserError unless `dst` is absent or an empty folder (nothing gets overwritten)."""
    dst = Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise UserError(f"{dst} exists and is not empty: choose a new destination or remove it")


@contextmanager
def atomic_dir(dst: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside `dst`; once the block has filled it, give what it holds plain
    modes and rename it to `dst` (which must be absent or empty). On an error the temporary folder
    is removed and `dst` is untouched."""
    dst = Path(dst)
    require_empty_dir(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(dst.parent, dst.name)
    try:
        yield tmp
        plain_modes(tmp)
        if dst.exists():
            dst.rmdir()
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_save_safetensors(tensors: dict, path: str | os.PathLike) -> None:
    """`save_file` under a temporary name, given a plain mode, then renamed to `path`."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = _temp_name(path.parent, path.name)
    try:
        save_file(
            {k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"}
        )
        tmp.chmod(0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_checkpoint_dir(
    path: str | os.PathLike, tensors: dict, config: dict, extra: dict | None = None
) -> Path:
    """A speculator folder: `model.safetensors`, `config.json` and, with `extra`, `draftsmith.json`.

    Each file is written under a temporary name and renamed, so a reader never sees half of one.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(tensors, path / "model.safetensors")
    atomic_write_json(path / "config.json", config)
    if extra is not None:
        atomic_write_json(path / "draftsmith.json", extra)
    return path
