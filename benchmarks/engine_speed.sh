#!/usr/bin/env bash
# Issue 27's tables: the engine before and after its fast path, on the same machine, T=0.
#   after:  the default engine (lean compiled forward, packed weights, --dtype auto) with ar, ngram,
#           suffix, the shipped EAGLE-3 alone and in the suffix hybrid, against llama.cpp (and
#           transformers on code);
#   before: DRAFTSMITH_FAST=0 DRAFTSMITH_PACK=0 (transformers' modules and torch.mv products, the
#           engine until then) with ar, ngram, suffix, against llama.cpp.
# WORKLOADS (default "code chat long"), PHASES (default "after before"), NUM (prompts, default 20;
# long uses NUM_LONG, default 10). Needs `bash scripts/setup.sh --peers` for the llama.cpp peers.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results
mkdir -p "${out}"
eagle=speculators/smollm2-135m-eagle3
for w in ${WORKLOADS:-code chat long}; do
    n=${NUM:-20}
    [[ "${w}" == long ]] && n=${NUM_LONG:-10}
    peers=llamacpp
    [[ "${w}" == code ]] && peers=hf,llamacpp
    for phase in ${PHASES:-after before}; do
        if [[ "${phase}" == after ]]; then
            env=()
            drafters="ar,ngram,suffix,eagle3:${eagle},suffix:min_score=2+eagle3:${eagle}:min_prob=0.2"
        else
            env=(DRAFTSMITH_FAST=0 DRAFTSMITH_PACK=0)
            drafters=ar,ngram,suffix
            peers=llamacpp
        fi
        env "${env[@]}" .venv/bin/draftsmith bench --target smollm2-135m --drafters "${drafters}" \
            --workload "${w}" --num-prompts "${n}" --max-new-tokens 256 --k 7 --peers "${peers}" \
            --no-progress --out "${out}/engine-${phase}-${w}-t0.json" | tee "${out}/engine-${phase}-${w}-t0.txt"
    done
done
