"""What the machine record says and what the training dtype `auto` picks from it."""

from __future__ import annotations

import torch

from draftsmith import machine


def test_native_bf16_needs_a_bf16_flag():
    avx2_epyc = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"}  # read off a Zen 3 EPYC
    assert not machine.cpu_has_native_bf16(avx2_epyc)
    assert not machine.cpu_has_native_bf16(avx2_epyc | {"avx512f", "avx512bw", "avx512_vnni"})
    assert machine.cpu_has_native_bf16(avx2_epyc | {"avx512f", "avx512_bf16"})
    assert machine.cpu_has_native_bf16(avx2_epyc | {"amx_tile", "amx_bf16"})
    assert machine.cpu_has_native_bf16({"fp", "asimd", "bf16"})  # aarch64 Features
    assert not machine.cpu_has_native_bf16(set())


def test_auto_dtype_follows_the_cpu(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "fma"})
    assert machine.auto_dtype(cpu) == "float32"
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "amx_bf16"})
    assert machine.auto_dtype(cpu) == "bfloat16"


def test_machine_info_records_native_bf16():
    info = machine.machine_info()
    assert info["native_bf16"] == machine.cpu_has_native_bf16(machine.cpu_flags())
