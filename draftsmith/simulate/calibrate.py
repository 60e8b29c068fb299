"""`draftsmith calibrate`: measure this machine and write the `local` hardware profile.

Measured, in well under a minute: memory bandwidth (sum over a large fp32 tensor, the best of a few
runs), bf16 and fp32 matmul throughput (square products), and the fixed costs of the target's
engine: a q=1 forward at short context and a q=16 forward, each minus its roofline estimate, give
the fixed per-forward overhead (per layer) and the extra cost per token beyond the roofline; short
plain `generate` runs, alternating batch 1 and 4 (ragged rows), add the engine's own per-step and
per-row work. On a CPU the "achieved fractions" are 1: the measured figures already are what is
achieved.

What it does not measure: interconnect (tensor parallelism is a GPU matter), KV cache bandwidth at
long context (it uses the same bandwidth), or anything about a drafter.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from draftsmith.fileio import atomic_write_json
from draftsmith.simulate.catalog import shape_from_config
from draftsmith.simulate.hardware import Hardware, local_profile_path, profile_dict
from draftsmith.simulate.roofline import forward_cost


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return min(times)


def measure_bandwidth(device: torch.device, mbytes: int = 256) -> float:
    """Bytes/s reading a large fp32 tensor (a reduction reads every byte once)."""
    x = torch.ones(mbytes * 2**20 // 4, dtype=torch.float32, device=device)
    t = _best(lambda: x.sum(), device, 5)
    return x.numel() * 4 / t


def measure_matmul(device: torch.device, dtype: torch.dtype, n: int) -> float:
    """FLOP/s of an n x n x n product."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t = _best(lambda: a @ b, device, 3)
    return 2 * n**3 / t


def _median_forward(target, cache, ids: torch.Tensor, repeats: int) -> float:
    target.forward(cache, ids)
    target.sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        target.forward(cache, ids)
        target.sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _engine_step(generate, target, prompts: list[list[int]], tokens: int = 16) -> float:
    """Seconds per decode step of plain decoding with these prompts in one batch."""
    res = generate(target, None, prompts, k=1, max_new_tokens=tokens)
    steps = max(len(r.token_ids) for r in res) - 1  # the first token comes from prefill
    # A row's decode_s sums the steps it took part in; the longest row took part in all of them.
    return max(r.stats.decode_s for r in res) / max(steps, 1)


def calibrate(
    target_spec: str = "smollm2-135m",
    device: str = "cpu",
    out: str | None = None,
    log: Callable[[str], None] = print,
    small: bool = False,
) -> tuple[dict, Path]:
    """Measure, write the profile (default: the cache's local.json) and return (profile, path).

    `small` shrinks the bandwidth and matmul probes (for tests; the figures get noisier)."""
    from draftsmith.decoding.engine import generate
    from draftsmith.target.model import load_target

    dev = torch.device(device)
    t0 = time.perf_counter()
    log("calibrate: memory bandwidth ...")
    bw = measure_bandwidth(dev, 32 if small else 1024 if dev.type == "cuda" else 256)
    log(f"  {bw / 1e9:.1f} GB/s")
    big = dev.type == "cuda" and not small
    log("calibrate: matmul throughput ...")
    bf16 = measure_matmul(dev, torch.bfloat16, 8192 if big else 512 if small else 2048)
    fp32 = measure_matmul(dev, torch.float32, 8192 if big else 256 if small else 1024)
    log(f"  bf16 {bf16 / 1e12:.2f} TFLOP/s, fp32 {fp32 / 1e12:.2f} TFLOP/s")

    log(f"calibrate: fixed costs of {target_spec} ...")
    target = load_target(target_spec, "bfloat16", device)
    cfg = target.model.config.to_dict()
    shape = shape_from_config(cfg, target.name, target.name)
    prompt_len, reps = 32, 20
    cache = target.new_cache(1, 256)
    prompt = torch.randint(1, target.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        target.forward(cache, prompt)
        cache.advance(0, prompt_len)
        t1 = _median_forward(target, cache, prompt[:, :1], reps)
        t16 = _median_forward(target, cache, prompt[:, :16], reps // 2)
    # Alternate batch 1 and batch 4 three times and keep medians: a shared machine's load drifts.
    ids = prompt[0].tolist()
    ragged = [ids[: prompt_len - 4 * i] for i in range(4)]  # 4 rows of different lengths, as served
    s1, s4 = [], []
    for _ in range(3):
        s1.append(_engine_step(generate, target, [ids]))
        s4.append(_engine_step(generate, target, ragged))
    step, step4 = statistics.median(s1), statistics.median(s4)

    hw = Hardware(
        name=f"local ({device})",
        memory_gb=0.0,
        bandwidth=bw,
        flops={"bf16": bf16, "fp32": fp32},
        bw_eff=1.0,
        flops_eff=1.0,
        overhead_s=0.0,
        overhead_per_layer_s=0.0,
        spec_step_overhead_s=0.0,
        source="draftsmith calibrate",
    )

    def roof(q: int, batch: int = 1) -> float:
        return forward_cost(shape, hw, batch=batch, q=q, context=prompt_len, dtype="bf16").total

    r1, r16, r4 = roof(1), roof(16), roof(1, batch=4)
    # Beyond the roofline: a cost per extra token of one forward (q=16 vs q=1), a cost per extra
    # row of an engine step (batch 4 vs 1, per-request Python work), the forward's fixed cost
    # (spread over layers), and the engine's own per-step work outside the forward.
    per_token = max(0.0, ((t16 - r16) - (t1 - r1)) / 15)
    per_row = max(0.0, ((step4 - r4) - (step - r1)) / 3 - per_token)
    fixed = max(0.0, (t1 - r1) - per_token)
    engine = max(0.0, step - t1 - per_row)
    measured = {
        "bandwidth_gb_s": round(bw / 1e9, 2),
        "bf16_tflop_s": round(bf16 / 1e12, 3),
        "fp32_tflop_s": round(fp32 / 1e12, 3),
        "target": target.name,
        "forward_q1_ms": round(t1 * 1e3, 3),
        "forward_q16_ms": round(t16 * 1e3, 3),
        "roofline_q1_ms": round(r1 * 1e3, 3),
        "roofline_q16_ms": round(r16 * 1e3, 3),
        "engine_step_ms": round(step * 1e3, 3),
        "engine_step_batch4_ms": round(step4 * 1e3, 3),
        "overhead_per_layer_ms": round(fixed / shape.num_layers * 1e3, 4),
        "overhead_per_token_ms": round(per_token * 1e3, 4),
        "overhead_per_row_ms": round(per_row * 1e3, 4),
        "engine_overhead_ms": round(engine * 1e3, 3),
        "torch_threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    hw = replace(
        hw,
        overhead_s=engine,
        overhead_per_layer_s=fixed / shape.num_layers,
        overhead_per_token_s=per_token,
        overhead_per_row_s=per_row,
        measured=measured,
    )
    path = Path(out) if out else local_profile_path()
    profile = profile_dict(hw)
    atomic_write_json(path, profile)
    return profile, path
