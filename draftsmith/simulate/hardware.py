"""Hardware profiles: peak bandwidth and matmul throughput per dtype, achieved fractions, interconnect
and the fixed time every forward pays whatever its size.

The GPU rows are the vendors' dense (no sparsity) peaks from the table in `shared/reference.md`;
interconnect figures are the vendors' per-GPU NVLink / Infinity Fabric bandwidths. The achieved
fractions and fixed overheads are defaults for a serving engine that replays CUDA graphs (SGLang,
vLLM): weight streaming reaches 60-85% of peak bandwidth, large GEMMs about 70% of peak, and every
forward pays a per-step cost (scheduling, sampling, launch gaps) plus a little per layer.

`local` is this machine, measured by `draftsmith calibrate` and stored as JSON in the draftsmith
cache folder. What this module does not do: measure anything (see calibrate.py) or model cost.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
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
    overhead_s: float = 3e-4  # per forward: scheduling, sampling, graph launch
    overhead_per_layer_s: float = 1.5e-5  # per forward and decoder layer: launch gaps, small kernels
    overhead_per_token_s: float = 0.0  # per forward and token: work outside the roofline (CPU engines)
    overhead_per_row_s: float = 0.0  # per forward and batch row: per-request engine work (Python engines)
    spec_step_overhead_s: float = 2e-4  # per speculative step: draft/verify hand-off, acceptance
    link_bandwidth: float = 0.0  # bytes/s per GPU for all-reduce (0: no fast interconnect)
    allreduce_latency_s: float = 1e-5
    source: str = "shared/reference.md GPU table (vendor dense peaks)"
    measured: dict = field(default_factory=dict)  # calibrate's raw measurements, for local

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.flops:
            have = ", ".join(sorted(self.flops))
            raise UserError(f"{self.name} has no {dtype} matmul throughput: use --dtype {have}")
        return self.flops[dtype]


GPUS: dict[str, Hardware] = {
    "a100": Hardware("A100 80GB SXM", 80, 2.039 * TB, {"bf16": 312 * TB}, link_bandwidth=300e9),
    "h100": Hardware("H100 SXM", 80, 3.35 * TB, {"bf16": 989 * TB, "fp8": 1979 * TB}, link_bandwidth=450e9),
    "h200": Hardware("H200", 141, 4.8 * TB, {"bf16": 989 * TB, "fp8": 1979 * TB}, link_bandwidth=450e9),
    "b200": Hardware(
        "B200", 180, 8.0 * TB, {"bf16": 2250 * TB, "fp8": 4500 * TB, "fp4": 9000 * TB}, link_bandwidth=900e9
    ),
    # L40S has no NVLink: all-reduce crosses PCIe 4.0 x16.
    "l40s": Hardware("L40S", 48, 0.864 * TB, {"bf16": 362 * TB, "fp8": 733 * TB}, link_bandwidth=32e9),
    "mi300x": Hardware("MI300X", 192, 5.3 * TB, {"bf16": 1307 * TB, "fp8": 2615 * TB}, link_bandwidth=448e9),
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
    aliases = {"h100sxm": "h100", "a10080gb": "a100", "mi300": "mi300x"}
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


def with_overrides(hw: Hardware, **kw) -> Hardware:
    return replace(hw, **kw)
