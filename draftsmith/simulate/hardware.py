"""Hardware profiles: peak bandwidth and matmul throughput per dtype, achieved fractions, interconnect
and the fixed time every forward pays whatever its size.

The GPU rows are the vendors' dense (no sparsity) peaks from the table in `shared/reference.md`
(GB200, GB300 and MI355X from their vendors' data sheets); interconnect figures are the vendors'
per-GPU, per-direction NVLink / Infinity Fabric bandwidths. The achieved fractions are defaults for a
serving engine that replays CUDA graphs (SGLang, vLLM, TensorRT-LLM): weight streaming reaches
60-85% of peak bandwidth, large GEMMs about 70% of peak.

What a decode step costs beyond bytes and FLOPs is a set of fixed latencies, each a field below with
the figure it came from (the comments above `GPUS`): per forward (scheduling, sampling, graph
launch), per decoder layer (a dozen small kernels even under a CUDA graph), per MoE layer (router,
top-k, token permutation, grouped GEMMs), per all-reduce (a base plus a step per peer GPU), per
expert-parallel all-to-all (dispatch and combine), and per request of a speculative step for a host
drafter's look-up (the node's CPU, not its GPU, but a constant of the same serving stack). Small kernels do not reach peak bandwidth; the
per-layer latency absorbs that too, which is why it is fitted per GPU generation rather than derived.

`local` is this machine, measured by `draftsmith calibrate` and stored as JSON in the draftsmith
cache folder; every field added after a profile was written defaults to the neutral value (0 or
"same as overhead_s"), so an old profile predicts exactly as before. What this module does not do:
measure anything (see calibrate.py) or model cost.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.errors import UserError

TB = 1e12


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_gb: float
    bandwidth: float  # bytes/s, peak
    flops: dict[str, float]  # dtype -> dense FLOP/s, peak
    bw_eff: float = 0.8  # achieved fraction of peak bandwidth when streaming weights
    flops_eff: float = (
        0.5  # achieved fraction of peak FLOP/s in decode-sized GEMMs (M = B*q <= a few hundred)
    )
    attn_flops_eff: float | None = None  # achieved fraction in attention kernels (None: flops_eff)
    overhead_s: float = 3e-4  # per forward: scheduling, sampling, graph launch
    overhead_per_layer_s: float = 1.5e-5  # per forward and decoder layer: launch gaps, small kernels
    overhead_per_token_s: float = 0.0  # per forward and token: work outside the roofline (CPU engines)
    overhead_per_row_s: float = 0.0  # per forward and batch row: per-request engine work (Python engines)
    spec_step_overhead_s: float = 2e-4  # per speculative step: draft/verify hand-off, acceptance
    spec_overhead_per_row_s: float = 0.0  # per speculative step and request: proposer/sampler bookkeeping
    host_draft_per_row_s: float = 0.0  # per speculative step and request: a host drafter's look-up (n-gram)
    link_bandwidth: float = 0.0  # bytes/s per GPU for all-reduce (0: no fast interconnect)
    allreduce_latency_s: float = 1e-5  # per all-reduce, whatever the GPU count
    allreduce_latency_per_peer_s: float = 0.0  # per all-reduce and peer GPU (N - 1 peers)
    moe_overhead_per_layer_s: float = 0.0  # per forward and MoE layer: router, top-k, permute, launches
    alltoall_latency_s: float = 0.0  # per expert-parallel all-to-all (two per MoE layer)
    draft_overhead_s: float | None = None  # per draft forward (None: same as overhead_s)
    source: str = "shared/reference.md GPU table (vendor dense peaks)"
    measured: dict = field(default_factory=dict)  # calibrate's raw measurements, for local

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.flops:
            have = ", ".join(sorted(self.flops))
            raise UserError(f"{self.name} has no {dtype} matmul throughput: use --dtype {have}")
        return self.flops[dtype]


# Fixed latencies of a CUDA-graph serving engine (see the module docstring). NVIDIA defaults: 0.3 ms
# per forward; all-reduce 8 us + 1 us per peer (one-shot NVLink kernels of vLLM/SGLang/TensorRT-LLM
# for decode-sized messages); 2 us per draft forward (the k draft steps replay in one graph).
# Attention kernels run far closer to peak than decode-sized GEMMs: FlashAttention-3 reaches 75% of
# H100's BF16 peak, FlashMLA 660 of 989 TFLOP/s on H800 (its README); 0.7 for every current GPU.
# All-reduce: 8 us + 1 us per peer GPU (one-shot NVLink kernels of vLLM/SGLang/TensorRT-LLM for
# decode-sized messages). Per forward 0.3 ms (the existing default), draft forwards included: a lower
# per-draft-forward cost made every published EAGLE-3, MTP and DFlash point of the validation worse.
_NV = dict(
    attn_flops_eff=0.7,
    overhead_s=3e-4,
    allreduce_latency_s=8e-6,
    allreduce_latency_per_peer_s=1e-6,
    alltoall_latency_s=7.3e-5,
    host_draft_per_row_s=5e-5,
)
# Host drafters (n-gram, suffix): the proposer for step t+1 needs the tokens step t accepted, so its
# look-up runs between two GPU steps, serially, once per request. 50 us per request and step, set from
# the host work of TensorRT-LLM's n-gram pool (tensorrt_llm/_torch/speculative/ngram.py, the Python
# version its tech blog 7 measured: "runs on the host"): per request it copies the token list
# (~1-2k ints through pybind, 15-30 us), re-inserts k * (v + k) pattern windows into a dict of
# OrderedSets (20-30 windows at ~1.5-3 us each in CPython) and looks the last k tokens up: 50-100 us.
# The low end is taken; not fitted to a published point (benchmarks/validate_simulator.py holds the
# Llama-4-Scout n-gram points out). A GPU-side proposer (TensorRT-LLM's later CUDA suffix automaton,
# vLLM's numba one when overlapped) costs less: pass a profile with 0 to model one.
# Fits (benchmarks/validate_simulator.py, FIT_CONSTANTS; each value reproduces one published plain rate):
# Blackwell 46 us per layer <- Qwen3-8B on B200, SGLang, 230.4 tok/s at concurrency 1; with it the
#   Qwen3.5-122B-A10B node (TP 8) already runs below the founding document's ~250 tok/s, so the MoE
#   per-layer cost fitted to that point is 0 on NVIDIA GPUs.
# Hopper 12 us per layer <- Llama-3.1-8B on H100, SGLang, 158.34 tok/s at batch 1.
# All-to-all 73 us (every GPU here) <- DeepSeek-V3 on 16 H200 (DP attention + EP 16), SGLang, 51.0 tok/s per rank.
_BLACKWELL = dict(_NV, overhead_per_layer_s=4.6e-5)
_HOPPER = dict(_NV, overhead_per_layer_s=1.2e-5)
# MI355X under vLLM on ROCm <- AMD's MiniMax-M2.5 FP8 Eagle3 points (TP 4): 131 us per layer from the
# plain 90 tok/s/GPU at concurrency 4, 12.2 us per token from the plain 822 at 64, and 0.144 ms per
# request and speculative step from the Eagle3 1137 at 64 (the speculative step grows far faster with
# concurrency than its bytes and FLOPs do on this stack). Its Kimi-K2.5 points are held out.
_MI355X = dict(
    _NV,
    overhead_per_layer_s=1.31e-4,
    overhead_per_token_s=1.22e-5,
    spec_overhead_per_row_s=1.44e-4,
)

GPUS: dict[str, Hardware] = {
    "a100": Hardware("A100 80GB SXM", 80, 2.039 * TB, {"bf16": 312 * TB}, link_bandwidth=300e9),
    "h100": Hardware(
        "H100 SXM", 80, 3.35 * TB, {"bf16": 989 * TB, "fp8": 1979 * TB}, link_bandwidth=450e9, **_HOPPER
    ),
    "h200": Hardware(
        "H200", 141, 4.8 * TB, {"bf16": 989 * TB, "fp8": 1979 * TB}, link_bandwidth=450e9, **_HOPPER
    ),
    "b200": Hardware(
        "B200",
        180,
        8.0 * TB,
        {"bf16": 2250 * TB, "fp8": 4500 * TB, "fp4": 9000 * TB},
        link_bandwidth=900e9,
        **_BLACKWELL,
    ),
    # Grace-Blackwell: the same Blackwell GPU (slightly higher clocks and power), NVLink 5 at 900 GB/s
    # per direction (1.8 TB/s both ways). NVIDIA GB200/GB300 NVL72 data sheets, per GPU, dense.
    "gb200": Hardware(
        "GB200 (per GPU)",
        186,
        8.0 * TB,
        {"bf16": 2500 * TB, "fp8": 5000 * TB, "fp4": 10000 * TB},
        link_bandwidth=900e9,
        source="NVIDIA GB200 NVL72 data sheet, per GPU, dense",
        **_BLACKWELL,
    ),
    "gb300": Hardware(
        "GB300 (per GPU)",
        288,
        8.0 * TB,
        {"bf16": 2500 * TB, "fp8": 5000 * TB, "fp4": 15000 * TB},
        link_bandwidth=900e9,
        source="NVIDIA GB300 NVL72 data sheet, per GPU, dense (Blackwell Ultra: 1.5x the FP4 of GB200)",
        **_BLACKWELL,
    ),
    # L40S has no NVLink: all-reduce crosses PCIe 4.0 x16.
    "l40s": Hardware("L40S", 48, 0.864 * TB, {"bf16": 362 * TB, "fp8": 733 * TB}, link_bandwidth=32e9),
    "mi300x": Hardware("MI300X", 192, 5.3 * TB, {"bf16": 1307 * TB, "fp8": 2615 * TB}, link_bandwidth=448e9),
    # AMD Instinct MI355X data sheet: 288 GB HBM3E at 8 TB/s; dense FP16/BF16 2.5 PF, FP8 5 PF,
    # MXFP4 10 PF; 7 Infinity Fabric links of 153.6 GB/s (1075 GB/s both ways, ~537 GB/s per direction).
    "mi355x": Hardware(
        "MI355X",
        288,
        8.0 * TB,
        {"bf16": 2500 * TB, "fp8": 5000 * TB, "fp4": 10000 * TB},
        link_bandwidth=537e9,
        source="AMD Instinct MI355X data sheet, dense",
        **_MI355X,
    ),
}
LOCAL = "local"


def cache_dir() -> Path:
    return Path(os.environ.get("DRAFTSMITH_CACHE") or os.path.expanduser("~/.cache/draftsmith"))


def local_profile_path() -> Path:
    return cache_dir() / "hardware" / "local.json"


def hardware_names() -> list[str]:
    return [*GPUS, LOCAL]


def load_hardware(name: str) -> Hardware:
    key = name.strip().lower().replace("-", "").replace(" ", "")
    aliases = {
        "h100sxm": "h100",
        "a10080gb": "a100",
        "mi300": "mi300x",
        "mi355": "mi355x",
        "mi350x": "mi355x",
    }
    key = aliases.get(key, key)
    if key in GPUS:
        return GPUS[key]
    if key == LOCAL:
        return load_local()
    raise UserError(f"unknown --hardware '{name}': choose one of {', '.join(hardware_names())}")


def load_local(path: Path | None = None) -> Hardware:
    path = path or local_profile_path()
    if not path.is_file():
        raise UserError(f"no local hardware profile at {path}: run `draftsmith calibrate` first")
    try:
        d = json.loads(path.read_text())
        return Hardware(**{k: v for k, v in d.items() if k in Hardware.__dataclass_fields__})
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise UserError(
            f"local hardware profile {path} is unreadable ({e}): run `draftsmith calibrate` again"
        ) from None


def profile_dict(hw: Hardware) -> dict:
    return asdict(hw)
