"""Load benchmark of `draftsmith serve` on loopback: throughput and latency at several concurrencies,
with and without a drafter, through the real `openai` client.

For each drafter it starts the server in this process (uvicorn on 127.0.0.1, a free port, one target
load shared by all drafters), warms it up, then for each concurrency C sends a fixed number of
streaming chat requests from C client tasks (a closed loop: each task sends its next request when
the previous one ends) and measures, per level:

- output tok/s: completion tokens of all requests / wall time of the level;
- req/s, and latency p50/p99: one request from send to its last chunk;
- TTFT p50: send to first content chunk; tau: the server's mean acceptance length (usage.spec_decode).

It sends a bounded number of requests (`--rounds` R per client, so C x R per level) and has a hard
deadline (`--timeout`), so it always stops by itself. Greedy decoding; every request of a level
asks the same `--max-tokens`. Prints a table, writes JSON and the table (`--out`, `.json`/`.txt`).

    .venv/bin/python benchmarks/load_bench.py --levels 1,4,16 --drafters ar,ngram --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import sys
import threading
import time
from pathlib import Path

import openai
import uvicorn

from draftsmith.data.workloads import load_workload
from draftsmith.drafters import registry
from draftsmith.serve.app import create_app
from draftsmith.target.model import load_target

MODEL = "bench"


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(-(-q * len(s) // 100)) - 1))]


class Server:
    def __init__(self, app, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


async def one(client, messages, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    ttft = None
    usage = None
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - t0
        if chunk.usage is not None:
            usage = chunk.usage
    latency = time.perf_counter() - t0
    spec = (usage.model_extra or {}).get("spec_decode", {}) if usage is not None else {}
    return {
        "latency": latency,
        "ttft": ttft if ttft is not None else latency,
        "tokens": usage.completion_tokens if usage is not None else 0,
        "steps": spec.get("steps", 0),
        "decode_tokens": max((usage.completion_tokens if usage is not None else 0) - 1, 0),
    }


async def level(
    url: str, prompts: list[list[dict]], concurrency: int, n_requests: int, max_tokens: int
) -> dict:
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=600)
    todo = list(range(n_requests))
    results: list[dict] = []

    async def worker() -> None:
        while todo:
            i = todo.pop(0)
            results.append(await one(client, prompts[i % len(prompts)], max_tokens))

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    wall = time.perf_counter() - t0
    lat = [r["latency"] for r in results]
    tokens = sum(r["tokens"] for r in results)
    steps = sum(r["steps"] for r in results)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "wall_s": round(wall, 3),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / wall, 2),
        "req_s": round(len(results) / wall, 3),
        "latency_p50_s": round(percentile(lat, 50), 3),
        "latency_p99_s": round(percentile(lat, 99), 3),
        "ttft_p50_s": round(percentile([r["ttft"] for r in results], 50), 3),
        "tau": round(sum(r["decode_tokens"] for r in results) / steps, 3) if steps else None,
    }


def table(runs: list[dict]) -> str:
    head = f"{'drafter':<10}{'conc':>5}{'reqs':>6}{'out tok/s':>11}{'req/s':>8}{'p50 s':>8}{'p99 s':>8}"
    head += f"{'TTFT p50':>10}{'tau':>7}"
    lines = [head, "-" * len(head)]
    for r in runs:
        tau = f"{r['tau']:.2f}" if r["tau"] is not None else "-"
        lines.append(
            f"{r['drafter']:<10}{r['concurrency']:>5}{r['requests']:>6}{r['output_tok_s']:>11.1f}{r['req_s']:>8.2f}"
            f"{r['latency_p50_s']:>8.2f}{r['latency_p99_s']:>8.2f}{r['ttft_p50_s']:>10.2f}{tau:>7}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--drafters", default="ar,ngram")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--levels", default="1,4,16", help="comma-separated concurrencies")
    p.add_argument("--rounds", type=int, default=2, help="requests each client sends per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--workload", default="chat")
    p.add_argument("--timeout", type=float, default=1800, help="hard stop for the whole run, seconds")
    p.add_argument("--out", default="benchmarks/results/serve_load")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    drafters = registry.split_specs(args.drafters)

    def stop_anyway() -> None:
        sys.stderr.write(f"load_bench: --timeout {args.timeout:.0f} s reached, stopping\n")
        os._exit(3)

    guard = threading.Timer(args.timeout, stop_anyway)
    guard.daemon = True
    guard.start()

    target = load_target(args.target, args.dtype, "cpu")
    n_prompts = max(max(levels) * 2, 16)
    prompts = [w.messages for w in load_workload(args.workload, n_prompts)]
    runs = []
    for spec in drafters:
        app = create_app(
            target,
            registry.build(spec),
            k=args.k,
            model_name=MODEL,
            max_batch=max(levels),
            max_queue=4 * max(levels),
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1"
        with Server(app, port):
            w = min(4, max(levels))  # warm-up: first forwards, batched paths, the allocator
            asyncio.run(level(url, prompts, w, w, 8))
            for c in levels:
                n = c * args.rounds
                r = asyncio.run(level(url, prompts, c, n, args.max_tokens))
                r["drafter"] = spec
                runs.append(r)
                sys.stderr.write(f"{spec} c={c}: {r['output_tok_s']} tok/s, p50 {r['latency_p50_s']} s\n")
    guard.cancel()
    text = table(runs)
    print(text)
    result = {
        "target": args.target,
        "dtype": args.dtype,
        "workload": args.workload,
        "max_tokens": args.max_tokens,
        "k": args.k,
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": _threads()},
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".txt").write_text(text + "\n")
    print(json.dumps({"out": str(out.with_suffix(".json")), "levels": levels, "drafters": drafters}))
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    raise SystemExit(main())
