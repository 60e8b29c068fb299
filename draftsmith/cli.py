"""`draftsmith`: one command, subcommands that call the layers below.

Errors a user can cause end as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from draftsmith.command import Parser, add_dtype_device_args, run
from draftsmith.errors import UserError

DEFAULT_TARGET = "smollm2-135m"


def _add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", default=DEFAULT_TARGET, help="smollm2-135m, gemma3-270m, HF folder, hub id or .gguf"
    )
    add_dtype_device_args(p)
    p.add_argument(
        "--quantize",
        default="none",
        choices=["none", "int8"],
        help="int8: weight-only int8 target on a CPU (exact against the quantized target, not the original)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, default=8, help="drafted tokens per step")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="draftsmith", description="Lossless speculative decoding for any HF causal LM.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    g = sub.add_parser("generate", help="generate one answer, streaming, and print tau and tok/s")
    _add_target_args(g)
    _add_sampling_args(g)
    g.add_argument("--drafter", default="ngram", help="ar, ngram, suffix, ... (NAME or NAME:ARG)")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--system", default=None, help="optional system message")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    g.add_argument("prompt")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="compare methods and peers on one workload")
    _add_target_args(b)
    _add_sampling_args(b)
    b.add_argument(
        "--drafters",
        default="ar,ngram,suffix",
        help="comma list of drafter specs; SPEC@K runs that one with draft length K instead of --k",
    )
    b.add_argument("--workload", default="chat", help="chat, code, long or a FILE.jsonl")
    b.add_argument("--num-prompts", type=int, default=20)
    b.add_argument("--max-new-tokens", type=int, default=256)
    b.add_argument("--peers", default="", help="comma list of hf, hf-assisted, llamacpp, llamacpp-lookup")
    b.add_argument("--out", default="results.json")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=cmd_bench)

    d = sub.add_parser("data", help="training data: regenerate answers, precompute target features")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    from draftsmith.data.regenerate import add_regenerate_parser

    add_regenerate_parser(dsub)
    from draftsmith.data.features import add_features_parser

    add_features_parser(dsub)

    tr = sub.add_parser("train", help="train a speculator for a target")
    trsub = tr.add_subparsers(dest="train_command", required=True, parser_class=Parser)
    from draftsmith.train.eagle3_cli import add_train_eagle3_parser

    add_train_eagle3_parser(trsub)
    from draftsmith.train.dflash_cli import add_train_dflash_parser

    add_train_dflash_parser(trsub)
    from draftsmith.train.mtp_cli import add_train_mtp_parser

    add_train_mtp_parser(trsub)
    from draftsmith.train.draft_lm_cli import add_train_draft_lm_parser

    add_train_draft_lm_parser(trsub)

    e = sub.add_parser(
        "export",
        help="write a trained speculator (EAGLE-3, DFlash, draft LM) in the layout SGLang or vLLM loads",
    )
    e.add_argument("--format", required=True, choices=["sglang", "vllm"])
    e.add_argument(
        "--verifier",
        default=None,
        help="target name or hub id recorded in an EAGLE-3 vLLM config (default: from draftsmith.json)",
    )
    e.add_argument(
        "--k",
        type=int,
        default=None,
        help="speculative tokens: recorded in an EAGLE-3 vLLM config, used in the printed serving "
        "flags (default 3; DFlash: block size - 1)",
    )
    e.add_argument(
        "--target",
        default=None,
        help="the target a draft LM was trained for, whose embedding, head and tokenizer it gets "
        "(default: draftsmith.json's target_spec)",
    )
    e.add_argument("src")
    e.add_argument("dst")
    e.set_defaults(func=cmd_export)
    # Later subcommands live beside their code: each module's add_*_parser sets its own func.
    from draftsmith.serve.cli import add_serve_parser

    add_serve_parser(sub)
    from draftsmith.simulate.cli import add_calibrate_parser, add_simulate_parser

    add_simulate_parser(sub)
    add_calibrate_parser(sub)
    from draftsmith.tune.cli import add_tune_parser

    add_tune_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), list(sys.argv[1:] if argv is None else argv))


def _sampling(args):
    from draftsmith.decoding.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def _check_common(args) -> None:
    if args.k <= 0:
        raise UserError(f"--k {args.k} must be a positive number of drafted tokens")
    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens {args.max_new_tokens} must be positive")
    _sampling(args)  # validates temperature, top-p, top-k before any model loads


def cmd_generate(args) -> int:
    _check_common(args)
    from draftsmith.decoding.engine import generate
    from draftsmith.drafters import registry
    from draftsmith.target.chat import cut_at_stop, encode_messages, stop_checker
    from draftsmith.target.model import load_target

    if not args.prompt.strip():
        raise UserError("empty prompt: give the text to answer, e.g. draftsmith generate 'Write a haiku'")
    factory = registry.build(args.drafter)
    target = load_target(args.target, args.dtype, args.device, args.quantize)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    ids = encode_messages(target.tokenizer, messages)
    stream = _Streamer(target.tokenizer) if not args.json else None
    res = generate(
        target,
        factory,
        [ids],
        k=args.k,
        sampling=_sampling(args),
        max_new_tokens=args.max_new_tokens,
        stop=stop_checker(target.tokenizer, args.stop),
        on_tokens=stream,
    )[0]
    text = cut_at_stop(target.tokenizer.decode(res.token_ids, skip_special_tokens=True), args.stop)
    s = res.stats
    decode_tok_s = s.decode_tokens / s.decode_s if s.decode_s else 0.0
    if args.json:
        out = {
            "text": text,
            "token_ids": res.token_ids,
            "tau": round(s.tau, 4),
            "decode_tok_s": round(decode_tok_s, 2),
            "steps": s.steps,
            "finish_reason": res.finish_reason,
            "accept_per_pos": [round(a, 4) for a in s.accept_per_pos],
            "prefill_s": round(s.prefill_s, 4),
            "decode_s": round(s.decode_s, 4),
        }
        print(json.dumps(out))
    else:
        stream.close()
        sys.stderr.write(
            f"\n[{args.drafter}] tau {s.tau:.2f} | decode {decode_tok_s:.1f} tok/s | {len(res.token_ids)} tokens "
            f"in {s.steps} steps | prefill {s.prefill_s * 1000:.0f} ms\n"
        )
    return 0


class _Streamer:
    """Prints text as tokens are committed; decodes the whole output so multi-byte pieces join."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.printed = 0

    def __call__(self, row: int, new_ids: list[int]) -> None:
        self.ids.extend(new_ids)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return
        sys.stdout.write(text[self.printed :])
        sys.stdout.flush()
        self.printed = len(text)

    def close(self) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()


def cmd_bench(args) -> int:
    _check_common(args)
    from draftsmith.bench.peers import expand_peers
    from draftsmith.bench.report import print_bench
    from draftsmith.bench.runner import method_k, run_bench
    from draftsmith.data.workloads import load_workload
    from draftsmith.drafters import registry
    from draftsmith.fileio import atomic_write_json
    from draftsmith.target.chat import encode_messages
    from draftsmith.target.model import load_target

    if args.num_prompts <= 0:
        raise UserError(f"--num-prompts {args.num_prompts} must be positive")
    methods = registry.split_specs(args.drafters)
    for m in methods:
        registry.build(method_k(m, args.k)[0])  # fail on a bad drafter spec before loading anything
    peers = expand_peers(args.peers) if args.peers.strip() else []
    prompts = load_workload(args.workload, args.num_prompts)
    if not prompts:
        raise UserError(f"workload '{args.workload}' has no prompts")
    t0 = time.perf_counter()
    target = load_target(args.target, args.dtype, args.device, args.quantize)
    ids = [encode_messages(target.tokenizer, p.messages) for p in prompts]
    too_long = [
        p.id for p, x in zip(prompts, ids, strict=True) if len(x) + args.max_new_tokens > target.max_context
    ]
    if too_long:
        raise UserError(
            f"{len(too_long)} prompts (first: {too_long[0]}) do not fit the target's context of "
            f"{target.max_context} with --max-new-tokens {args.max_new_tokens}: shorten them or lower it"
        )
    workload_name = os.path.basename(args.workload)
    result = run_bench(
        target,
        ids,
        methods=methods,
        peers=peers,
        sampling=_sampling(args),
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        workload=workload_name,
        progress=not args.no_progress,
        log=lambda m: sys.stderr.write(m + "\n"),
    )
    result["prompt_tokens_mean"] = round(sum(len(x) for x in ids) / len(ids), 1)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    atomic_write_json(args.out, result)
    print_bench(result)
    print(json.dumps({"out": args.out, "speedup": {r["method"]: r.get("speedup") for r in result["runs"]}}))
    return 0


def cmd_export(args) -> int:
    from draftsmith.formats.export import export

    what, serve = export(
        args.src, args.dst, args.format, verifier=args.verifier, k=args.k, target=args.target
    )
    print(f"wrote {args.format} {what} checkpoint to {args.dst}")
    for line in serve:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
