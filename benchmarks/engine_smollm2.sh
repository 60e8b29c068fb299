#!/usr/bin/env bash
# The engine's benchmark on the embedded target: ar, ngram and suffix against transformers and
# llama.cpp on code, chat and long (20 prompts, 256 new tokens, greedy, bf16), then one float32 run
# whose match_rate must be 1.0 for every method. Results land in benchmarks/results/.
# Needs `bash scripts/setup.sh --peers` for the llama.cpp peers (skipped otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results
mkdir -p "${out}"
for w in code chat long; do
    .venv/bin/draftsmith bench --target smollm2-135m --drafters ar,ngram,suffix --workload "${w}" \
        --num-prompts 20 --max-new-tokens 256 --peers hf,hf-assisted,llamacpp --no-progress \
        --out "${out}/smollm2-${w}-bf16.json" | tee "${out}/smollm2-${w}-bf16.txt"
done
.venv/bin/draftsmith bench --target smollm2-135m --drafters ar,ngram,suffix --workload code --dtype float32 \
    --num-prompts 20 --max-new-tokens 256 --no-progress \
    --out "${out}/smollm2-code-fp32.json" | tee "${out}/smollm2-code-fp32.txt"
