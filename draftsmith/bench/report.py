"""Human-readable tables for bench results (the JSON file is the machine-readable form)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def bench_table(result: dict) -> Table:
    title = (
        f"{result['target']} | {result['workload']} | {result['num_prompts']} prompts x "
        f"{result['max_new_tokens']} tokens | T={result['temperature']} | k={result['k']} | {result['dtype']}"
        + (f" | {result['engine_path']}" if result.get("engine_path") else "")
    )
    table = Table(title=title)
    for col in ("method", "tau", "a1..a4", "decode tok/s", "e2e tok/s", "speedup", "match"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for run in result["runs"]:
        if "skipped" in run:
            table.add_row(run["method"], "-", "-", "-", "-", "-", f"skipped: {run['skipped']}")
            continue
        acc = run.get("accept_per_pos") or []
        table.add_row(
            run["method"],
            _fmt(run["tau"], ".2f"),
            " ".join(f"{a:.2f}" for a in acc[:4]) or "-",
            _fmt(run["decode_tok_s"], ".1f"),
            _fmt(run["e2e_tok_s"], ".1f"),
            _fmt(run["speedup"], ".2f") + ("x" if run["speedup"] is not None else ""),
            _fmt(run["match_rate"], ".2f"),
        )
    return table


def print_bench(result: dict, console: Console | None = None) -> None:
    (console or Console()).print(bench_table(result))
