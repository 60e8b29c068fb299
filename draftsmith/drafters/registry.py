"""Name -> drafter factory, so `--drafters ar,ngram,suffix,eagle3:PATH` parses without the engine
knowing any drafter by name.

A spec is `NAME` or `NAME:ARG`. What ARG means is the builder's business: a checkpoint path for
trained drafters, `key=value` options joined by `:` for training-free ones
(`ngram:max_n=4:min_n=2`). `ar` is plain decoding: no drafter at all. `A+B` joins two specs into a
hybrid (`drafters/hybrid.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from draftsmith.drafters.base import DrafterFactory
from draftsmith.errors import UserError

Builder = Callable[[str | None], DrafterFactory]

AR = "ar"
# name -> (module, builder function `(arg) -> DrafterFactory`); a module is imported only when a
# spec names it, so `ngram` never loads torch models and the drafters never import this table.
BUILDERS: dict[str, tuple[str, str]] = {
    "dflash": ("draftsmith.drafters.dflash_drafter", "build"),
    "dflash-tree": ("draftsmith.drafters.dflash_drafter", "build_tree"),
    "draft": ("draftsmith.drafters.draft_lm", "build"),
    "eagle3": ("draftsmith.drafters.eagle3_drafter", "build"),
    "eagle3-tree": ("draftsmith.drafters.eagle3_drafter", "build_tree"),
    "mtp": ("draftsmith.drafters.mtp_drafter", "build"),
    "ngram": ("draftsmith.drafters.ngram", "build"),
    "suffix": ("draftsmith.drafters.suffix", "build"),
}


def _builder(name: str) -> Builder:
    module, function = BUILDERS[name]
    return getattr(importlib.import_module(module), function)


def available() -> list[str]:
    return [AR, *sorted(BUILDERS)]


def split_specs(specs: str) -> list[str]:
    """'ar, ngram,suffix' -> ['ar', 'ngram', 'suffix']; refuses an empty list."""
    out = [s.strip() for s in specs.split(",") if s.strip()]
    if not out:
        raise UserError("--drafters is empty: give a comma-separated list such as ar,ngram,suffix")
    return out


def build(spec: str) -> DrafterFactory | None:
    """Build the factory for one spec; None means plain autoregressive decoding (`ar`).

    `A+B` (`suffix:min_score=1+eagle3:PATH`) is a hybrid: A's draft when it has one, else B's."""
    sides = hybrid_sides(spec)
    if len(sides) == 2:
        from draftsmith.drafters.hybrid import HybridFactory

        a, b = build(sides[0]), build(sides[1])
        if a is None or b is None:
            raise UserError(f"'{spec}': both sides of A+B must be drafters, not ar")
        return HybridFactory(a, b)
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    if name == AR:
        return None
    if name not in BUILDERS:
        raise UserError(f"unknown drafter '{name}': choose one of {', '.join(available())}")
    return _builder(name)(arg or None)


def hybrid_sides(spec: str) -> list[str]:
    """`A+B` -> [A, B] when both sides name drafters, else [spec] (a '+' inside a path stays put)."""
    first, plus, second = spec.partition("+")
    if plus and _names_drafter(first) and _names_drafter(second):
        return [first, second]
    return [spec]


def _names_drafter(spec: str) -> bool:
    """Whether a spec starts with a drafter's name (so a '+' inside a checkpoint path is left alone)."""
    name = spec.partition(":")[0].strip().lower()
    return name == AR or name in BUILDERS
