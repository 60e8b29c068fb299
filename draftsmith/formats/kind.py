"""Which kind of speculator a folder holds, from its `config.json` alone (no weights read).

One reader for every place that must tell an EAGLE-3 folder (ours, SGLang's, vLLM speculators') from
a DFlash one (ours, z-lab's), a draft LM or an MTP head saved by draftsmith: the simulator's drafter cost and
`draftsmith tune`.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.errors import UserError


def read_config(folder: str | Path) -> dict:
    """The folder's config.json as a dict; one-line UserErrors for a missing or unreadable one."""
    path = Path(folder).expanduser() / "config.json"
    if not path.is_file():
        raise UserError(f"speculator folder {folder} has no config.json; pass a speculator folder")
    return read_json_object(path)


def read_json_object(path: Path, what: str = "") -> dict:
    """A JSON file that must hold an object; one-line UserErrors naming it (`what`: 'model config ')."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {what}{path}: {e}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{what}{path} is not a JSON object")
    return cfg


def speculator_kind(folder: str | Path, cfg: dict | None = None) -> str | None:
    """ "eagle3", "dflash", "draft-lm" (a small LM `draft:PATH` drafts with), "draftsmith" (another
    head draftsmith saved, e.g. MTP) or None."""
    cfg = read_config(folder) if cfg is None else cfg
    meta = Path(folder).expanduser() / "draftsmith.json"
    if meta.is_file() and read_json_object(meta).get("kind") == "draft-lm":
        return "draft-lm"
    arch = " ".join(cfg.get("architectures") or []).lower()
    if "dflash" in arch:
        return "dflash"
    if "eagle" in arch or cfg.get("speculators_model_type") == "eagle3":
        return "eagle3"
    if (Path(folder).expanduser() / "draftsmith.json").is_file():
        return "draftsmith"
    return None
