"""What a tune bought: report.json (for scripts), report.md (a page to forward) and the curve plot.

Every number comes from the measurement run (`draftsmith bench` on the held-out prompts, every method
in one run, speedup = decode tok/s over `ar`'s in that run), from the training metrics (held-out tau
against training minutes) and from the simulator (speedup on other hardware from the tuned draft's
measured per-position acceptance). This module only arranges them; it measures nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.fileio import atomic_write_text

KEYS_BY_ROLE = ("ar", "ngram", "suffix", "base", "tuned", "hybrid")


def run_of(bench: dict, method: str | None) -> dict | None:
    if method is None:
        return None
    return next((r for r in bench["runs"] if r["method"] == method), None)


def curve_points(metrics: list[dict], tau_start: float | None) -> list[dict]:
    """[{minutes, tau}] from the training metrics (engine tau on held-out prompts), starting at 0."""
    points = [] if tau_start is None else [{"minutes": 0.0, "tau": round(float(tau_start), 4)}]
    for m in metrics:
        if m.get("tau") is not None:
            points.append({"minutes": round(m["wall_time_s"] / 60.0, 3), "tau": round(float(m["tau"]), 4)})
    return points


def predictions(target_config: dict, name: str, folder: Path, rates: list[float], tau: float, k: int,
                hardware: list[str], context: int) -> dict:  # fmt: skip
    """{hardware: {"1": speedup, "8": speedup}}: the simulator on the tuned draft's real size and its
    measured per-position acceptance (coverage matched to the measured tau), at concurrency 1 and 8."""
    from draftsmith.simulate.catalog import shape_from_config
    from draftsmith.simulate.drafter_cost import drafter_cost
    from draftsmith.simulate.hardware import load_hardware
    from draftsmith.simulate.predict import predict
    from draftsmith.simulate.speedup import Acceptance, tau_from_rates

    if not rates:
        return {}
    m = shape_from_config(target_config, name, "the target's config.json")
    d = drafter_cost(str(folder), m)
    full = tau_from_rates(list(rates), k) - 1.0
    coverage = min(1.0, max(0.0, (tau - 1.0) / full)) if full > 0 else 1.0
    a = Acceptance(rates=tuple(rates), coverage=coverage, source="tune held-out")
    out = {}
    for hw_name in hardware:
        hw = load_hardware(hw_name)
        out[hw_name] = {
            str(b): round(predict(m, hw, d, a, batch=b, k=k, context=context).speedup, 3) for b in (1, 8)
        }
    return out


def build_report(bench: dict, methods: dict[str, str | None], **facts) -> dict:
    """report.json: the keys the tune issue names, then the whole bench for anything else."""
    r = {role: run_of(bench, m) for role, m in methods.items()}

    def val(role: str, key: str):
        run = r.get(role)
        return None if run is None else run.get(key)

    return {
        "tau_before": val("base", "tau"),
        "tau_after": val("tuned", "tau"),
        "tau_after_hybrid": val("hybrid", "tau"),
        "baselines": {"ngram": val("ngram", "tau"), "suffix": val("suffix", "tau")},
        "speedup_before": val("base", "speedup"),
        "speedup_after": val("tuned", "speedup"),
        "speedup_after_hybrid": val("hybrid", "speedup"),
        "speedup_baselines": {"ngram": val("ngram", "speedup"), "suffix": val("suffix", "speedup")},
        "accept_per_pos_before": val("base", "accept_per_pos"),
        "accept_per_pos_after": val("tuned", "accept_per_pos"),
        **facts,
        "methods": methods,
        "machine": bench["machine"],
        "bench": bench,
    }


def plot_curve(
    points: list[dict], baselines: dict[str, float | None], before: float | None, path: Path
) -> None:
    """Held-out tau against training minutes, with the training-free drafters as flat lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    if points:
        ax.plot([p["minutes"] for p in points], [p["tau"] for p in points], "o-", label="tuned speculator")
    styles = {"ngram": ":", "suffix": "--"}
    for name, tau in baselines.items():
        if tau is not None:
            ax.axhline(tau, linestyle=styles.get(name, "-."), color="gray", label=f"{name} (bench)")
    if before is not None:
        ax.axhline(before, linestyle="-.", color="tab:red", label="base speculator (bench)")
    ax.set_xlabel("training minutes")
    ax.set_ylabel("held-out tau (tokens per step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def write_markdown(report: dict, path: Path, plot_name: str) -> None:
    bench, methods = report["bench"], report["methods"]
    label = {m: role for role, m in methods.items() if m is not None}
    lines = [
        f"# Tuned speculator for {bench['target']}",
        "",
        f"Traffic: `{report['traffic']}`: {report['train_prompts']} prompts trained on, "
        f"{report['holdout_prompts']} held out (never trained on) and measured here. "
        f"{report['method']} speculator, "
        + (f"continued from `{report['from']}`" if report.get("from") else "trained from scratch")
        + f"; {report['train_tokens']:,} regenerated answer tokens, {report['train_minutes']:.1f} min of "
        f"training ({report['tune_minutes']:.1f} min with regeneration).",
        "",
        _summary(report),
        "",
        f"## Held-out measurement ({bench['num_prompts']} prompts x {bench['max_new_tokens']} new tokens, "
        f"T={bench['temperature']}, k={bench['k']}, {bench['dtype']}, one run)",
        "",
        "| method | role | tau | decode tok/s | speedup | match |",
        "|---|---|---|---|---|---|",
    ]
    for run in bench["runs"]:
        if run.get("skipped"):
            continue
        tau = "-" if run.get("tau") is None else f"{run['tau']:.2f}"
        match = "-" if run.get("match_rate") is None else f"{run['match_rate']:.2f}"
        lines.append(
            f"| `{run['method']}` | {label.get(run['method'], '')} | {tau} | {run['decode_tok_s']:.1f} | "
            f"{run['speedup']:.2f}x | {match} |"
        )
    before, after = report.get("accept_per_pos_before"), report.get("accept_per_pos_after")
    if after:
        lines += ["", "## Acceptance per draft position (a_i)", "", "| position | " + " | ".join(
            str(i + 1) for i in range(len(after))) + " |", "|---|" + "---|" * len(after)]  # fmt: skip
        if before:
            lines.append("| before | " + " | ".join(f"{a:.2f}" for a in before[: len(after)]) + " |")
        lines.append("| after | " + " | ".join(f"{a:.2f}" for a in after) + " |")
    if report.get("predictions"):
        lines += ["", "## Predicted speedup on other hardware (simulator, measured acceptance)", "",
                  "| hardware | concurrency 1 | concurrency 8 |", "|---|---|---|"]  # fmt: skip
        for hw, by_batch in report["predictions"].items():
            lines.append(f"| {hw} | {by_batch['1']:.2f}x | {by_batch['8']:.2f}x |")
    lines += [
        "",
        "## Learning curve",
        "",
        f"![held-out tau against training minutes]({plot_name})",
        "",
        "Held-out tau during training comes from the trainer's own evaluation (a subset of the held-out "
        "prompts, shorter answers), so it differs a little from the table above.",
        "",
        "## Reproduce",
        "",
        "```",
        report["command"],
        "```",
        "",
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, torch "
        f"{report['machine']['torch']} (native bf16: {report['machine']['native_bf16']}).",
        "",
    ]
    atomic_write_text(path, "\n".join(lines))


def _summary(report: dict) -> str:
    after, hyb = report["tau_after"], report["tau_after_hybrid"]
    base = report["baselines"]
    parts = []
    if report["tau_before"] is not None and after is not None:
        parts.append(
            f"Held-out tau {report['tau_before']:.2f} -> **{after:.2f}** "
            f"({after / report['tau_before']:.2f}x), decode speedup {report['speedup_before']:.2f}x -> "
            f"**{report['speedup_after']:.2f}x**"
        )
    elif after is not None:
        parts.append(f"Held-out tau **{after:.2f}**, decode speedup **{report['speedup_after']:.2f}x**")
    if hyb is not None:
        parts.append(
            f"with suffix decoding (hybrid) tau {hyb:.2f}, **{report['speedup_after_hybrid']:.2f}x**"
        )
    parts.append("training-free: " + ", ".join(f"{k} tau {v:.2f}" for k, v in base.items() if v is not None))
    return "; ".join(parts) + "."


def write_json(report: dict, path: Path) -> None:
    atomic_write_text(path, json.dumps(report, indent=2) + "\n")
