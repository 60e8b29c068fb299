#!/usr/bin/env bash
# The data flywheel: SmolLM2 regenerates training conversations in the background, resumably.
#
#   bash scripts/flywheel.sh                 # one process over everything not yet written
#   bash scripts/flywheel.sh --shard 1/3     # one of 3 machines or processes (distinct outputs)
#
# Prompts (rebuilt here, not committed): the first user turn of ShareGPT train-split conversations
# of at most 6,000 characters (the chat benchmark's own limit, on its held-out split), minus those
# regenerated before. Answers: greedy, bf16, at most 256 new tokens, one turn. Outputs go to
# data/flywheel/sharegpt.<i>of<n>.jsonl (committed as they are; `.partial` while a run is going: a
# killed run continues where it stopped when this script is run again). `data/build_trainset.py`
# then splits everything regenerated into the training and held-out sets.
#
# Environment: THREADS (torch threads, default 2), BATCH (rows in flight, default 32), NUM (prompts
# to cover, default 8000), ENDPOINT (an OpenAI-compatible server to regenerate with instead).
set -euo pipefail
cd "$(dirname "$0")/.."
shard="0/1"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --shard) shard="$2"; shift 2 ;;
        *) echo "error: unknown option $1: use --shard i/n" >&2; exit 2 ;;
    esac
done
[[ "${shard}" =~ ^[0-9]+/[0-9]+$ ]] || { echo "error: --shard ${shard} is not i/n" >&2; exit 2; }
py=.venv/bin/python
prompts=data/flywheel/prompts-sharegpt.jsonl
mkdir -p data/flywheel
if [[ ! -s "${prompts}" ]]; then
    "${py}" data/export_prompts.py --source sharegpt --num "${NUM:-8000}" --max-turns 1 --max-chars 6000 \
        --skip data/sharegpt-smollm2-t0.0.jsonl.partial --skip data/sharegpt-smollm2-t0.1.jsonl.partial \
        --out "${prompts}"
fi
out="data/flywheel/sharegpt.${shard/\//of}.jsonl"
extra=()
[[ -n "${ENDPOINT:-}" ]] && extra=(--endpoint "${ENDPOINT}")
OMP_NUM_THREADS="${THREADS:-2}" .venv/bin/draftsmith data regenerate --target smollm2-135m \
    --source "${prompts}" --num "${NUM:-8000}" --max-new-tokens 256 --max-turns 1 \
    --batch-size "${BATCH:-32}" --shard "${shard}" --out "${out}" --no-progress "${extra[@]}"
