"""The full training state in `OUT/checkpoint/`, written atomically, so `--resume` continues exactly.

Layout of the folder:

    model.safetensors   draft weights and buffers (fp32 master weights, d2t/t2d)
    optimizer.pt        optimizer.state_dict() via torch.save; loaded with weights_only=True
                        (AdamW's state is tensors, numbers, bools and lists, all allowed)
    rng.pt              python, numpy and torch RNG states (numpy's array stored as a tensor)
    state.json          step, data position (epoch, index), tokens seen, wall time, the schedule,
                        the run's fingerprint (what must match to resume) and the commands run
    metrics.jsonl       every metrics line so far (OUT/metrics.jsonl is rewritten from it on resume,
                        dropping lines a crash left past the checkpoint)

Atomicity: everything is written into a fresh temporary folder and fsynced; then the old folder is
renamed aside, the new one renamed into place and the old one deleted. A crash at any point leaves
either the previous or the new checkpoint complete: `load` falls back to the renamed-aside one if
the crash fell between the two renames. The scheduler is a pure function of the step (`schedule`),
so its state is the step.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftsmith.fileio import make_temp_dir, plain_modes

NAME = "checkpoint"
_ASIDE = ".checkpoint.old"


@dataclass
class Checkpoint:
    model: dict[str, torch.Tensor]
    optimizer: dict
    rng: dict
    state: dict
    metrics: list[dict]


def exists(out: str | Path) -> bool:
    out = Path(out)
    return (out / NAME / "state.json").is_file() or (out / _ASIDE / "state.json").is_file()


def read_state(out: str | Path) -> dict | None:
    """Only state.json (cheap: enough to check a fingerprint before loading the target)."""
    folder = _folder(Path(out))
    return None if folder is None else json.loads((folder / "state.json").read_text())


def save(out: str | Path, ckpt: Checkpoint) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out, "checkpoint")
    try:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in ckpt.model.items()}, str(tmp / "model.safetensors")
        )
        torch.save(ckpt.optimizer, tmp / "optimizer.pt")
        torch.save(ckpt.rng, tmp / "rng.pt")
        (tmp / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in ckpt.metrics))
        (tmp / "state.json").write_text(json.dumps(ckpt.state, indent=2) + "\n")
        plain_modes(tmp)  # safetensors writes 0o600; a checkpoint is a normal folder
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final, aside = out / NAME, out / _ASIDE
    if aside.exists() and final.exists():
        shutil.rmtree(aside)  # a leftover from an earlier crash; `final` is complete
    if final.exists():
        final.rename(aside)
    tmp.rename(final)
    _fsync(out)
    shutil.rmtree(aside, ignore_errors=True)


def load(out: str | Path, device: torch.device | str = "cpu") -> Checkpoint | None:
    folder = _folder(Path(out))
    if folder is None:
        return None
    metrics_file = folder / "metrics.jsonl"
    return Checkpoint(
        model=load_file(str(folder / "model.safetensors"), device=str(device)),
        optimizer=torch.load(folder / "optimizer.pt", map_location=device, weights_only=True),
        rng=torch.load(folder / "rng.pt", weights_only=True),
        state=json.loads((folder / "state.json").read_text()),
        metrics=[json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()],
    )


def _folder(out: Path) -> Path | None:
    for name in (NAME, _ASIDE):
        if (out / name / "state.json").is_file():
            return out / name
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- RNG


def capture_rng() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(rng: dict) -> None:
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    kind, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
