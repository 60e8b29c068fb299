"""Where each drafter's accepted tokens come from: text that repeats earlier context, or new text.

At temperature 0 a small target repeats itself: on SmolLM2's chat answers about half the positions
continue a 3-gram seen earlier in the prompt or answer with the same token ("copyable"). Prompt
lookup drafts exactly those; a learned drafter must learn to. This script decodes a workload in
float32 (so every method produces the same tokens and positions line up), records each step's
draft and how much of it was accepted through a recording wrapper around the drafter, and reports
per method:

- accept(copyable), accept(other): the share of copyable / other output positions that arrived as
  accepted draft tokens;
- a1(copyable), a1(other): acceptance of the first draft token at steps that start on a copyable /
  other position (the engine verifies exactly that token after a committed prefix);
- tau (tokens per verify step).

    .venv/bin/python benchmarks/copy_acceptance.py --workload chat --num-prompts 20 \\
        --drafters ngram,eagle3:speculators/smollm2-135m-eagle3 --out benchmarks/results/copy-acceptance-chat

Writes OUT.json (per method and per prompt) and OUT.txt (the table).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from draftsmith.data.workloads import load_workload
from draftsmith.decoding.engine import generate
from draftsmith.decoding.sampling import SamplingParams
from draftsmith.drafters import registry
from draftsmith.drafters.base import Draft
from draftsmith.machine import machine_info
from draftsmith.target.chat import encode_messages
from draftsmith.target.model import load_target

NGRAM = 3  # context length that makes a position "copyable"


class _Recorder:
    """Wraps a drafter: logs (draft depth, accepted drafts, committed tokens) of each step."""

    def __init__(self, inner, log: list) -> None:
        self.inner, self.log = inner, log
        self.needs_features = inner.needs_features
        self.depth = 0

    def start(self, prompt_ids, features) -> None:
        self.inner.start(prompt_ids, features)

    def propose(self, k: int) -> Draft:
        d = self.inner.propose(k)
        self.depth = d.depth
        return d

    def commit(self, accepted_ids, features) -> None:
        # accepted_ids = the accepted drafts plus the target's own token (fewer if a stop cut them)
        n = len(accepted_ids)
        self.log.append((self.depth, min(self.depth, max(n - 1, 0)), n))
        self.depth = 0
        self.inner.commit(accepted_ids, features)


class _RecordingFactory:
    def __init__(self, inner, log: list) -> None:
        self.inner, self.log = inner, log
        self.name = inner.name
        self.needs_features = inner.needs_features

    def bind(self, target, sampling) -> None:
        if hasattr(self.inner, "bind"):
            self.inner.bind(target, sampling)
        self.needs_features = self.inner.needs_features

    def __call__(self, *args, **kwargs):
        return _Recorder(self.inner(*args, **kwargs), self.log)

    def finish(self, prompt_ids, output_ids) -> None:
        self.inner.finish(prompt_ids, output_ids)


def copyable(context: list[int], out: list[int], n: int = NGRAM) -> list[bool]:
    """Per output position: the n tokens before it occurred earlier, followed by the same token.

    >>> copyable([1, 2, 3, 4], [1, 2, 3, 5], n=2)
    [False, False, True, False]
    """
    seq = context + out
    seen: dict[tuple[int, ...], set[int]] = {}
    flags: list[bool] = []
    for j in range(n, len(seq)):
        key = tuple(seq[j - n : j])
        if j >= len(context):
            flags.append(seq[j] in seen.get(key, ()))
        seen.setdefault(key, set()).add(seq[j])
    return flags[-len(out) :] if out else []


def tally(context: list[int], out: list[int], steps: list[tuple[int, int, int]]) -> dict:
    """Counts for one prompt: positions and accepted ones by kind, first-token acceptance by kind."""
    cp = copyable(context, out)
    # Tokens the steps did not commit came before them: the first answer token, from prefill.
    accepted: list[bool] = [False] * (len(out) - sum(c for _, _, c in steps))
    c = {"pos": [0, 0], "acc": [0, 0], "first": [0, 0], "first_acc": [0, 0]}
    for depth, n, committed in steps:
        at = len(accepted)
        if at < len(cp) and depth > 0:
            kind = 0 if cp[at] else 1
            c["first"][kind] += 1
            c["first_acc"][kind] += int(n > 0)
        accepted += [True] * n + [False] * (committed - n)
    for flag, acc in zip(cp, accepted, strict=False):
        kind = 0 if flag else 1
        c["pos"][kind] += 1
        c["acc"][kind] += int(acc)
    c["steps"] = len(steps)
    c["tokens"] = len(out)
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="chat")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--drafters", required=True, help="comma-separated drafter specs (not ar)")
    ap.add_argument("--out", required=True, help="output path without extension")
    args = ap.parse_args()

    target = load_target(args.target, "float32")
    prompts = [
        encode_messages(target.tokenizer, p.messages) for p in load_workload(args.workload, args.num_prompts)
    ]
    greedy = SamplingParams(temperature=0.0)
    plain = [
        r.token_ids
        for r in generate(target, None, prompts, sampling=greedy, max_new_tokens=args.max_new_tokens)
    ]
    report: dict = {"target": target.name, "workload": args.workload, "num_prompts": len(prompts),
                    "max_new_tokens": args.max_new_tokens, "k": args.k, "dtype": "float32",
                    "ngram_context": NGRAM, "machine": machine_info(), "methods": {}}  # fmt: skip
    for spec in registry.split_specs(args.drafters):
        per_prompt = []
        for ids, ref in zip(prompts, plain, strict=True):
            log: list = []
            factory = _RecordingFactory(registry.build(spec), log)
            res = generate(
                target, factory, [ids], k=args.k, sampling=greedy, max_new_tokens=args.max_new_tokens
            )[0]
            if res.token_ids != ref:
                raise SystemExit(f"{spec}: output differs from plain decoding in float32 (a lossless bug)")
            per_prompt.append(tally(ids, res.token_ids, log))
        total = {
            key: [sum(p[key][i] for p in per_prompt) for i in (0, 1)]
            for key in ("pos", "acc", "first", "first_acc")
        }
        steps, tokens = sum(p["steps"] for p in per_prompt), sum(p["tokens"] for p in per_prompt)
        report["methods"][spec] = {
            "copyable_share": round(total["pos"][0] / max(1, sum(total["pos"])), 4),
            "accept_copyable": round(total["acc"][0] / max(1, total["pos"][0]), 4),
            "accept_other": round(total["acc"][1] / max(1, total["pos"][1]), 4),
            "a1_copyable": round(total["first_acc"][0] / max(1, total["first"][0]), 4),
            "a1_other": round(total["first_acc"][1] / max(1, total["first"][1]), 4),
            "tau": round(tokens / max(1, steps), 4),
            "per_prompt": per_prompt,
        }
        print(spec, {k: v for k, v in report["methods"][spec].items() if k != "per_prompt"}, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"{target.name} | {args.workload} | {len(prompts)} prompts x {args.max_new_tokens} tokens | T=0 | "
             f"k={args.k} | float32 | copyable = the {NGRAM} tokens before occurred earlier with the same next token",
             "", "| method | copyable share | accept copyable | accept other | a1 copyable | a1 other | tau |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for spec, m in report["methods"].items():
        lines.append(
            f"| {spec} | {m['copyable_share']:.2f} | {m['accept_copyable']:.2f} | {m['accept_other']:.2f} | "
            f"{m['a1_copyable']:.2f} | {m['a1_other']:.2f} | {m['tau']:.2f} |"
        )
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
