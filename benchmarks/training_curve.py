"""Held-out tau and per-step accuracy against training step, from a training run's metrics.jsonl.

    python benchmarks/training_curve.py speculators/smollm2-135m-eagle3 [--png curve.png]

Prints a markdown table (step, tokens seen, wall time, loss, accuracy of TTT steps 0 and last,
held-out tau where it was measured) and, with --png, plots tau and loss against step. The training
loop writes one line per optimizer step and `tau` on the lines where it ran the held-out eval.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"no metrics.jsonl in {folder}: give the --out folder of a training run")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    # A resumed run may rewrite a step; the last record of each step wins.
    by_step = {r["step"]: r for r in rows if "loss" in r or r.get("tau") is not None}
    return [by_step[s] for s in sorted(by_step)]


def table(rows: list[dict], every: int) -> str:
    lines = [
        "| step | tokens seen | wall (min) | loss | acc step 0 | acc last step | held-out tau |",
        "|---|---|---|---|---|---|---|",
    ]
    seen = 0
    for i, r in enumerate(rows):
        seen += r.get("tokens", 0)
        keep = r.get("tau") is not None or i == len(rows) - 1 or (every and r["step"] % every == 0)
        if not keep:
            continue
        acc = r.get("acc") or [float("nan")]
        tau = r.get("tau")
        lines.append(
            f"| {r['step']} | {seen:,} | {r.get('wall_time_s', 0) / 60:.1f} | {r.get('loss', float('nan')):.3f} "
            f"| {acc[0]:.3f} | {acc[-1]:.3f} | {'-' if tau is None else f'{tau:.2f}'} |"
        )
    return "\n".join(lines)


def heldout_table(rows: list[dict], start: dict | None = None) -> str:
    """Teacher-forced accuracy per position on the held-out conversations (`--eval-data`) and the
    engine tau, against wall minutes: one row per evaluation, the untrained start first."""
    evals = [r for r in rows if r.get("heldout_acc")]
    if not evals:
        return ""
    width = max(len(r["heldout_acc"]) for r in evals)
    head = " | ".join(f"acc {i + 1}" for i in range(width))
    lines = [f"| wall (min) | step | held-out loss | {head} | engine tau |", "|---" * (width + 4) + "|"]

    def row(minutes: str, step: str, rec: dict, tau: float | None) -> str:
        accs = " | ".join(f"{a:.3f}" for a in rec["heldout_acc"])
        return f"| {minutes} | {step} | {rec['heldout_loss']:.3f} | {accs} | {'-' if tau is None else f'{tau:.2f}'} |"

    if start and start.get("heldout_acc"):
        lines.append(row("0", "0", start, None))
    for r in evals:
        lines.append(row(f"{r.get('wall_time_s', 0) / 60:.0f}", str(r["step"]), r, r.get("tau")))
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in rows if "loss" in r]
    ax.plot(steps, [r["loss"] for r in rows if "loss" in r], color="tab:gray", lw=0.8, label="loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax2 = ax.twinx()
    taus = [(r["step"], r["tau"]) for r in rows if r.get("tau") is not None]
    if taus:
        ax2.plot(*zip(*taus, strict=True), "o-", color="tab:blue", label="held-out tau")
    ax2.set_ylabel("held-out tau (tokens per verify step)")
    fig.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--every", type=int, default=0, help="also list every N-th step")
    p.add_argument("--png", type=Path)
    args = p.parse_args()
    rows = read_metrics(args.folder)
    print(table(rows, args.every))
    if args.png:
        plot(rows, args.png)


if __name__ == "__main__":
    main()
