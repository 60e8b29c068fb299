"""`draftsmith serve`: the target and its drafter behind an OpenAI-compatible API (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import socket
import sys

from draftsmith.command import add_dtype_device_args
from draftsmith.errors import UserError


def add_serve_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve", help="serve the target with speculative decoding behind an OpenAI-compatible API"
    )
    p.add_argument(
        "--target", default="smollm2-135m", help="smollm2-135m, gemma3-270m, HF folder, hub id or .gguf"
    )
    add_dtype_device_args(p)
    p.add_argument(
        "--quantize", default="none", choices=["none", "int8"], help="int8: weight-only int8 target (CPU)"
    )
    p.add_argument(
        "--drafter", default="ngram", help="ar, ngram, suffix, eagle3:PATH, ... (NAME or NAME:ARG)"
    )
    p.add_argument("--k", type=int, default=8, help="drafted tokens per step")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=16, help="requests decoded together at most")
    p.add_argument(
        "--max-model-len", type=int, default=None, help="prompt + answer tokens (default: the target's)"
    )
    p.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting for a busy batch; more get 429"
    )
    p.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: the target's)"
    )
    p.set_defaults(func=cmd_serve)
    return p


def _check(args) -> None:
    if args.k <= 0:
        raise UserError(f"--k {args.k} must be a positive number of drafted tokens")
    if args.max_batch <= 0:
        raise UserError(f"--max-batch {args.max_batch} must be positive")
    if args.max_queue < 0:
        raise UserError(f"--max-queue {args.max_queue} must be 0 or more")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise UserError(f"--max-model-len {args.max_model_len} must be at least 2 (a prompt and an answer)")
    if not 0 <= args.port < 65536:
        raise UserError(f"--port {args.port} is not a TCP port: use 1..65535 (0 picks a free one)")
    try:  # fail before loading the model, in one line, rather than in uvicorn's log
        with socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((args.host, args.port))
    except OSError as e:
        raise UserError(
            f"cannot listen on {args.host}:{args.port} ({e.strerror}): pick another --port or --host"
        ) from None


def cmd_serve(args) -> int:
    _check(args)
    import uvicorn

    from draftsmith.drafters import registry
    from draftsmith.serve.app import create_app
    from draftsmith.target.model import load_target

    factory = registry.build(args.drafter)
    target = load_target(args.target, args.dtype, args.device, args.quantize)
    if target.tokenizer is None:
        raise UserError(f"target '{args.target}' has no tokenizer: serve needs one to read text")
    max_len = args.max_model_len or target.max_context
    if max_len > target.max_context:
        raise UserError(
            f"--max-model-len {max_len} exceeds the target's context of {target.max_context}: lower it"
        )
    _warm_up(target, factory, args.k)
    app = create_app(
        target,
        factory,
        k=args.k,
        model_name=args.served_model_name,
        max_model_len=max_len,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
    )
    name = args.served_model_name or target.name
    sys.stderr.write(
        f"serving {name} with drafter {args.drafter} (k={args.k}) on http://{args.host}:{args.port}/v1 "
        f"(max batch {args.max_batch}, queue {args.max_queue}, context {max_len})\n"
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _warm_up(target, factory, k: int) -> None:
    """One request alone and two side by side, a few tokens each, before the port opens: the engine's
    compiled forward builds its graphs (one row or several, one query or several) on first use, which
    would otherwise fall on the first clients' latency."""
    from draftsmith.decoding.engine import generate

    sys.stderr.write(f"warming up the engine ({target.path}) ...\n")
    ids = target.tokenizer.encode("Hello, how are you today?")
    generate(target, factory, [ids], k=k, max_new_tokens=4)
    generate(target, factory, [ids, ids[:3]], k=k, max_new_tokens=4)
