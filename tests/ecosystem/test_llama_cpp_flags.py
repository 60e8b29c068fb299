"""scripts/llama_cpp_flags.sh (the CMAKE_ARGS of `setup.sh --peers`) turns on only the instruction
sets the CPU has, on fabricated /proc/cpuinfo flag lines of the three CPU kinds these machines are."""

from __future__ import annotations

import subprocess

from ecosystem import REPO

ZEN2_AVX2 = "fpu sse4_1 sse4_2 avx f16c fma bmi2 avx2 sha_ni"  # EPYC, AVX2 only
ZEN4 = ZEN2_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"
SAPPHIRE = ZEN4 + " avx_vnni amx_bf16 amx_tile amx_int8"  # Xeon with AMX
KNL = "sse4_2 avx avx2 fma f16c bmi2 avx512f avx512cd"  # AVX512F without VL/DQ/BW


def _flags(tmp_path, line: str) -> dict[str, str]:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {line}\n\nprocessor\t: 1\nflags\t\t: {line}\n")
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "llama_cpp_flags.sh"), str(cpuinfo)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(arg.removeprefix("-D").split("=") for arg in out.split())


def test_avx2_only_cpu_gets_no_avx512(tmp_path):
    f = _flags(tmp_path, ZEN2_AVX2)
    assert f["GGML_AVX2"] == "ON" and f["GGML_FMA"] == "ON" and f["GGML_F16C"] == "ON"
    assert all(
        f[k] == "OFF" for k in ("GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX512_VBMI")
    )


def test_avx512_cpu_gets_its_extensions_and_never_amx(tmp_path):
    for line in (ZEN4, SAPPHIRE):
        f = _flags(tmp_path, line)
        assert f["GGML_AVX512"] == f["GGML_AVX512_BF16"] == f["GGML_AVX512_VNNI"] == "ON"
        assert f["GGML_NATIVE"] == f["GGML_AMX_TILE"] == f["GGML_AMX_INT8"] == f["GGML_AMX_BF16"] == "OFF"
    assert _flags(tmp_path, SAPPHIRE)["GGML_AVX_VNNI"] == "ON"


def test_avx512_needs_all_five_base_sets(tmp_path):
    assert _flags(tmp_path, KNL)["GGML_AVX512"] == "OFF"
