"""Write a speculator folder's model card (README.md) from what its training and benchmarks recorded.

    python benchmarks/model_card.py speculators/smollm2-135m-eagle3 \
        --bench benchmarks/results/speculators-*-t*.json --data-note "how the data was made"

Everything in the card is read from files: the training record (`draftsmith.json`: data, steps,
tokens, wall time, the exact commands), the architecture (`config.json`), the training curve
(`metrics.jsonl`, when it was copied beside the speculator) and the `draftsmith bench` rows whose
method names this folder. Nothing is typed in by hand except the free-text data note.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from training_curve import heldout_table, read_metrics, table

from draftsmith.bench.runner import method_k
from draftsmith.drafters.registry import hybrid_sides


def _files(folder: Path) -> list[Path]:
    """What an engine or draftsmith loads: weights, configs, records, a token ranking."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".safetensors", ".json"))


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in _files(folder)) / 1e6


def bench_rows(folder: Path, benches: list[Path]) -> list[tuple[dict, dict, dict]]:
    """(bench run, this speculator's row, the `ar` row of the same run) for every row naming it."""
    name = os.path.normpath(str(folder))
    out = []
    for path in benches:
        run = json.loads(path.read_text())
        rows = run["runs"]
        ar = next((r for r in rows if r["method"] == "ar"), None)
        for r in rows:
            parts = hybrid_sides(method_k(r["method"], 0)[0])  # a hybrid A+B names it on either side
            paths = [os.path.normpath(p.partition(":")[2].split(":")[0]) for p in parts if ":" in p]
            if name in paths and ar is not None:
                out.append((run, r, ar))
    return out


def _match(row: dict) -> str:
    """match_rate is only defined at temperature 0 (None in sampled runs)."""
    return "-" if row.get("match_rate") is None else f"{row['match_rate']:.2f}"


def _label(method: str) -> str:
    """'eagle3-tree:speculators/x:topk=8:size=32@4' -> 'eagle3-tree topk=8 size=32': the drafter and
    its options, without the path (the card is about that folder); a hybrid's sides joined by ' + '."""
    labels = []
    for spec in hybrid_sides(method_k(method, 0)[0]):
        name, _, rest = spec.partition(":")
        labels.append(" ".join([name, *(part for part in rest.split(":") if "=" in part)]))
    return " + ".join(labels)


def _article(word: str) -> str:
    return "An" if word[0] in "AEIOUM" else "A"


def card(folder: Path, benches: list[Path], data_note: str) -> str:
    rec = json.loads((folder / "draftsmith.json").read_text())
    cfg = json.loads((folder / "config.json").read_text())
    train = rec.get("train", {})
    method = {"eagle3": "EAGLE-3", "dflash": "DFlash", "mtp": "MTP", "draft-lm": "draft LM"}.get(
        train.get("method"), "draft"
    )
    spec = {"draft-lm": "draft"}.get(train.get("method"), train.get("method"))  # the drafter's registry name
    if train.get("method") == "mtp":
        arch = "one MTP layer (`mtp.*` tensors, Qwen3.5 layout) beside the target's config"
    else:
        arch = (
            f"`{(cfg.get('architectures') or ['?'])[0]}`, hidden {cfg.get('hidden_size')}, "
            f"{cfg.get('num_hidden_layers')} layer(s)"
        )
    budget = (
        f" (its warmup and cosine followed the {train['time_budget'] / 60:.0f}-minute `--time-budget`, which ended it)"
        if train.get("time_budget")
        else ""
    )
    lines = [
        f"# {folder.name}",
        "",
        f"{_article(method)} {method} speculator for "
        f"`{rec.get('target')}`, trained by draftsmith. Use it with "
        f"`draftsmith bench --drafters {spec}:{folder}` or `draftsmith serve --drafter {spec}:{folder}`.",
        "",
        "## Model",
        f"- files: {_size_mb(folder):.1f} MB ({', '.join(p.name for p in _files(folder))})",
        f"- architecture: {arch}",
    ]
    for key in ("draft_vocab_size", "feature_layers", "block_size", "init", "ttt_steps", "init_layers"):
        if rec.get(key) is not None and not (key == "feature_layers" and spec == "draft"):
            value = rec[key]
            if key == "init" and os.path.isabs(str(value)):
                value = os.path.relpath(value)
            lines.append(f"- {key}: {value}")
    lines += [
        "",
        "## Data",
        f"- file: `{os.path.relpath(rec['data'])}` (sha256 {rec.get('data_sha256', '?')[:16]}...)",
        f"- {data_note}" if data_note else "",
        "",
        "## Training",
        f"- steps: {rec.get('steps')} of a {rec.get('total_steps')}-step schedule{budget}; "
        f"{rec.get('tokens_seen', 0):,} tokens seen; wall time {rec.get('wall_time_s', 0) / 60:.0f} min "
        "on the 2-core CPU",
        f"- settings: lr {train.get('lr')}, {train.get('batch_tokens')} tokens per step, "
        f"max_len {train.get('max_len')}, epochs {train.get('epochs')}, dtype {train.get('dtype')}",
        "- the commands that produced it, in order (a stopped run continues with `--resume`):",
        "",
        "```",
        *rec.get("commands", [rec.get("command", "")]),
        "```",
        "",
    ]
    if (folder / "metrics.jsonl").is_file():
        metrics = read_metrics(folder)
        held = heldout_table(metrics, rec.get("heldout_start"))
        if held:
            lines += [
                "## Held-out curve",
                "",
                "Teacher-forced accuracy of each drafted position on the held-out conversations "
                "(`--eval-data`) and the engine's tau on held-out prompts, against training minutes:",
                "",
                held,
                "",
            ]
        lines += ["## Held-out tau against training step", "", table(metrics, 0), ""]
    rows = bench_rows(folder, benches)
    if rows:
        lines += [
            "## Measured with `draftsmith bench`",
            "",
            "20 prompts unless stated, 256 new tokens, speedup over plain decoding (`ar`) in the same run.",
            "",
            "| workload | temperature | dtype | method | tau | decode tok/s | ar tok/s | speedup | match |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for run, r, ar in rows:
            lines.append(
                f"| {run['workload']} ({run['num_prompts']}) | {run['temperature']} | {run['dtype']} "
                f"| {_label(r['method'])} (k={r.get('k', run['k'])}) | {r['tau']:.2f} | {r['decode_tok_s']:.1f} "
                f"| {ar['decode_tok_s']:.1f} | {r['speedup']:.2f}x | {_match(r)} |"
            )
        lines.append("")
    return "\n".join(line for line in lines if line is not None) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--bench", type=Path, nargs="*", default=[])
    p.add_argument("--data-note", default="")
    args = p.parse_args()
    text = card(args.folder, args.bench, args.data_note)
    tmp = args.folder / "README.md.tmp"
    tmp.write_text(text)
    tmp.replace(args.folder / "README.md")
    print(text)


if __name__ == "__main__":
    main()
