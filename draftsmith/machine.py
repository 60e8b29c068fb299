"""What machine a measurement ran on, recorded next to every result, and what its arithmetic is good
at (the training dtype `auto` follows it)."""

from __future__ import annotations

import os
import platform

import torch


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = cpu_flags()
    info = {
        "cpu": cpu,
        "native_bf16": cpu_has_native_bf16(flags),
        "cpu_features": sorted(flags & _REPORTED_FLAGS),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


# x86 flags of bf16 arithmetic in hardware (Sapphire Rapids' AMX, Cooper Lake's and Zen 4's
# AVX512-BF16) and aarch64's "bf16" feature. Without one, PyTorch emulates bf16 matrix products:
# on an AVX2-only EPYC a 2048-token EAGLE-3 training step took 287 s in bf16 against 17 s in fp32.
_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})


# The vector and matrix extensions that decide which kernels a CPU runs fast.
_REPORTED_FLAGS = frozenset(
    {
        "avx2",
        "fma",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    }
    | {"avx_vnni", "asimd", "sve", "bf16", "i8mm"}
)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", aarch64 "Features"); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16(flags: set[str]) -> bool:
    return bool(_BF16_FLAGS & flags)


def auto_dtype(device: torch.device) -> str:
    """bfloat16 where the device computes it natively, float32 elsewhere (where it is the faster
    one by far, and never less accurate)."""
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_has_native_bf16(cpu_flags()) else "float32"
