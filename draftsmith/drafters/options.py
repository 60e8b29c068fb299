"""Drafter options in a spec: `ngram:max_n=4:min_n=2`, `eagle3:PATH:min_prob=0.2`.

Each builder parses its own ARG with these, against typed defaults; a bad option is one user error.
"""

from __future__ import annotations

from draftsmith.errors import UserError


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
