#!/usr/bin/env bash
# Print the CMAKE_ARGS llama-cpp-python is built with here (scripts/setup.sh --peers), chosen from the
# CPU's features in /proc/cpuinfo (or the file given):
#
#   bash scripts/llama_cpp_flags.sh [CPUINFO]
#
# Not native (-DGGML_NATIVE=OFF): a native build crashed in decode on these machines (AMX), so AMX
# stays off and every other instruction set is named explicitly, each ON only when the CPU has it.
# An instruction set the CPU lacks dies with "illegal instruction" at the first product, which is
# what an AVX512 build did on an AVX2-only EPYC. GGML_AVX512 compiles with AVX512 F, CD, VL, DQ and
# BW together, so it needs all five; VBMI, VNNI and BF16 are separate extensions.
set -euo pipefail
cpuinfo="${1:-/proc/cpuinfo}"
flags=" $(grep -m1 '^flags' "${cpuinfo}" 2>/dev/null | cut -d: -f2) "
has() { for f in "$@"; do [[ "${flags}" == *" ${f} "* ]] || return 1; done; }
on() { if has "$@"; then echo ON; else echo OFF; fi; }
echo "-DGGML_NATIVE=OFF -DGGML_SSE42=$(on sse4_2) -DGGML_AVX=$(on avx) -DGGML_AVX2=$(on avx2) \
-DGGML_BMI2=$(on bmi2) -DGGML_FMA=$(on fma) -DGGML_F16C=$(on f16c) -DGGML_AVX_VNNI=$(on avx_vnni) \
-DGGML_AVX512=$(on avx512f avx512cd avx512vl avx512dq avx512bw) -DGGML_AVX512_VBMI=$(on avx512vbmi) \
-DGGML_AVX512_VNNI=$(on avx512_vnni) -DGGML_AVX512_BF16=$(on avx512_bf16) \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
