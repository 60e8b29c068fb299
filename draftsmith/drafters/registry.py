"""Name -> drafter factory, so `--drafters ar,ngram,suffix,eagle3:PATH` parses without the engine
knowing any drafter by name.

A spec is `NAME` or `NAME:ARG`. What ARG means is the builder's business: a checkpoint path for
trained drafters, `key=value` options joined by `:` for training-free ones
(`ngram:max_n=4:min_n=2`). `ar` is plain decoding: no drafter at all. `A+B` joins two specs into a
hybrid (`drafters/hybrid.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from draftsmith.drafters.base import DrafterFactory
from draftsmith.errors import UserError

Builder = Callable[[str | None], DrafterFactory]
_BUILDERS: dict[str, Builder] = {}

AR = "ar"


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator: `@register("ngram")` on a function `(arg) -> DrafterFactory`."""

    def wrap(builder: Builder) -> Builder:
        _BUILDERS[name] = builder
        return builder

    return wrap


def _load_builtin() -> None:
    # Importing the modules runs their @register decorators.
    from draftsmith.drafters import (  # noqa: F401
        dflash_drafter,
        draft_lm,
        eagle3_drafter,
        mtp_drafter,
        ngram,
        suffix,
    )


def available() -> list[str]:
    _load_builtin()
    return [AR, *sorted(_BUILDERS)]


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
    _load_builtin()
    if name not in _BUILDERS:
        raise UserError(f"unknown drafter '{name}': choose one of {', '.join(available())}")
    return _BUILDERS[name](arg or None)


def hybrid_sides(spec: str) -> list[str]:
    """`A+B` -> [A, B] when both sides name drafters, else [spec] (a '+' inside a path stays put)."""
    first, plus, second = spec.partition("+")
    if plus and _names_drafter(first) and _names_drafter(second):
        return [first, second]
    return [spec]


def _names_drafter(spec: str) -> bool:
    """Whether a spec starts with a drafter's name (so a '+' inside a checkpoint path is left alone)."""
    _load_builtin()
    name = spec.partition(":")[0].strip().lower()
    return name == AR or name in _BUILDERS


def parse_options(arg: str | None, defaults: dict[str, int | float]) -> dict[str, int | float]:
    """Parse 'max_n=4:min_n=2' against typed defaults; unknown keys and bad values are user errors."""
    opts = dict(defaults)
    if not arg:
        return opts
    for part in arg.split(":"):
        key, eq, value = part.partition("=")
        if not eq or key not in defaults:
            raise UserError(
                f"bad drafter option '{part}': expected key=value with key in {', '.join(defaults)}"
            )
        kind = type(defaults[key])
        try:
            opts[key] = kind(value)
        except ValueError:
            raise UserError(f"bad drafter option '{part}': {key} must be a {kind.__name__}") from None
    return opts


def split_path_options(arg: str, defaults: dict[str, int | float]) -> tuple[str, dict[str, int | float]]:
    """'out/d:topk=4:size=20' -> ('out/d', {...}): trailing `key=value` parts are options, the rest
    is the checkpoint path (which may itself hold ':')."""
    parts = arg.split(":")
    opts: list[str] = []
    while len(parts) > 1 and "=" in parts[-1]:
        opts.insert(0, parts.pop())
    return ":".join(parts), parse_options(":".join(opts) or None, defaults)


def check_probability(name: str, value: float) -> float:
    """A drafter option that must lie in [0, 1]; anything else is a user error."""
    if not 0.0 <= value <= 1.0:
        raise UserError(f"drafter option {name}={value} must be a probability between 0 and 1")
    return float(value)
