"""A JSONL output that survives being killed and continues where it stopped.

Records (JSON objects with an `"id"`) are appended to `OUT.partial`, one whole line per record,
flushed and fsynced by `sync()` (the caller does so once per batch). `finish()` renames the partial
file to `OUT`, after folding in the records of an earlier complete `OUT` (a run with a smaller
`--num`) that the partial file does not already hold. Ids found in either file count as done, so
rerunning the same command skips them.

A process killed mid-write leaves a last line without its newline; opening the file again cuts it
off. A bad line anywhere else is not something a kill produces, so it is refused. Records whose
`keys` fields (target, source) differ from this run's are refused too: mixing two targets' outputs
in one file would silently poison training data.

Knows files and ids; does not know what a record holds beyond `id` and the `keys` fields.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from draftsmith.errors import UserError
from draftsmith.fileio import atomic_write_text


class ResumableJsonl:
    def __init__(self, out: str | os.PathLike, keys: dict[str, str]) -> None:
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.keys = keys
        if self.out.is_dir():
            raise UserError(f"--out {self.out} is a folder; pass a file path such as data.jsonl")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        _cut_truncated_tail(self.partial)
        self.done: set[str] = set()
        for path in (self.out, self.partial):
            for record in self._records(path):
                self.done.add(record["id"])
        self._file = None

    def write(self, record: dict) -> None:
        if self._file is None:
            self._file = open(self.partial, "a", encoding="utf-8")  # noqa: SIM115 (closed in sync/finish)
        # One write call per line: a kill can only cut the last line, which reopening repairs.
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.done.add(record["id"])

    def sync(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None

    def finish(self) -> None:
        """Make `OUT` the complete file: fold the old `OUT` into the partial one and rename it."""
        self.close()
        if not self.partial.exists():
            if not self.out.exists():  # a finished run always leaves OUT, even with nothing in it
                atomic_write_text(self.out, "")
            return  # nothing new this run; OUT is already complete
        if self.out.exists():
            in_partial = {r["id"] for r in self._records(self.partial)}
            with open(self.partial, "a", encoding="utf-8") as f:
                for record in self._records(self.out):  # streamed: OUT may hold gigabytes
                    if record["id"] not in in_partial:
                        f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        os.replace(self.partial, self.out)
        _fsync_dir(self.out.parent)

    def records(self) -> Iterator[dict]:
        """Every record now held, in `OUT` and the partial file (ids unique)."""
        self.sync()
        seen: set[str] = set()
        for path in (self.partial, self.out):
            for record in self._records(path):
                if record["id"] not in seen:
                    seen.add(record["id"])
                    yield record

    def _records(self, path: Path) -> Iterator[dict]:
        if not path.exists():
            return
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                if not isinstance(record, dict) or not isinstance(record.get("id"), str):
                    raise UserError(
                        f"{path} line {lineno} is not a record of this tool; delete the file or pass another --out"
                    )
                for key, value in self.keys.items():
                    if record.get(key) != value:
                        raise UserError(
                            f"{path} holds data with {key} {record.get(key)!r}, not {value!r}; "
                            "pass another --out (or delete the file) to start a new data set"
                        )
                yield record


def _cut_truncated_tail(path: Path) -> None:
    """Drop a last line that a killed process left without its newline (or half-written)."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        # Scan back from the end for the last newline, a chunk at a time (the file may be large).
        pos, keep = end, 0
        while pos > 0:
            step = min(pos, 1 << 16)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = pos + nl + 1
                break
        if keep < end:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
