#!/usr/bin/env bash
# `draftsmith data regenerate --endpoint` against `vllm serve` (vLLM's OpenAI server, CPU build) beside
# our own batched regeneration, on the same prompts, greedy, float32:
#
#   bash scripts/regen_vllm.sh [NUM] [MAX_NEW_TOKENS] [BATCH] [SPEC]   # defaults 8 64 8 none
#
# SPEC `eagle3` serves with the shipped SmolLM2 EAGLE-3 (exported here with `draftsmith export
# --format vllm`) as `--speculative-config`, the command the README gives. Needs .peers/vllm (bash
# scripts/setup.sh --vllm). Writes benchmarks/results/regen-vllm[-SPEC].json (both runs' reports and
# how many answers are identical) and prints a line per engine. The server is started here, on a
# free port, and stopped on exit.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
num="${1:-8}"
max_new="${2:-64}"
batch="${3:-8}"
spec="${4:-none}"
venv=.peers/vllm
[[ -x "${venv}/bin/vllm" ]] || { echo "error: no ${venv}: run bash scripts/setup.sh --vllm" >&2; exit 2; }
folder="$(.venv/bin/python -c "from draftsmith.target.resolve import resolve_target as r; print(r('smollm2-135m').model_path)")"
port="$(.venv/bin/python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [[ -n "${server_pid}" ]]; then kill "${server_pid}" 2>/dev/null || true; wait "${server_pid}" 2>/dev/null || true; fi
    rm -rf "${work}"
}
trap cleanup EXIT

serve_spec=()
suffix=""
if [[ "${spec}" == eagle3 ]]; then
    .venv/bin/draftsmith export --format vllm --verifier "${folder}" speculators/smollm2-135m-eagle3 "${work}/eagle3" >/dev/null
    serve_spec=(--speculative-config "{\"model\": \"${work}/eagle3\", \"method\": \"eagle3\", \"num_speculative_tokens\": 3}")
    suffix="-eagle3"
elif [[ "${spec}" != none ]]; then
    echo "error: SPEC ${spec}: use none or eagle3" >&2; exit 2
fi
start=$(date +%s)
VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 LD_PRELOAD="${repo_root}/${venv}/lib/libiomp5.so" \
    "${venv}/bin/vllm" serve "${folder}" --served-model-name smollm2-135m --dtype float32 \
    --max-model-len 2048 --enforce-eager --host 127.0.0.1 --port "${port}" "${serve_spec[@]}" \
    >"${work}/server.log" 2>&1 &
server_pid=$!
until curl -sf "http://127.0.0.1:${port}/health" >/dev/null; do
    if ! kill -0 "${server_pid}" 2>/dev/null; then tail -5 "${work}/server.log" >&2; exit 1; fi
    if (( $(date +%s) - start > 1200 )); then echo "error: vllm serve not up after 20 min" >&2; exit 1; fi
    sleep 5
done
echo "vllm serve up in $(( $(date +%s) - start )) s on port ${port}"

common=(--source sharegpt --num "${num}" --max-new-tokens "${max_new}" --max-turns 1 --temperature 0 --no-progress)
.venv/bin/draftsmith data regenerate "${common[@]}" --endpoint "http://127.0.0.1:${port}/v1" \
    --concurrency "${batch}" --out "${work}/vllm.jsonl"
kill "${server_pid}"; wait "${server_pid}" 2>/dev/null || true; server_pid=""  # free the cores
.venv/bin/draftsmith data regenerate "${common[@]}" --dtype float32 --batch-size "${batch}" \
    --out "${work}/local.jsonl"

.venv/bin/python - "${work}" "${num}" "${max_new}" "${batch}" "${spec}" "${suffix}" <<'EOF'
import json
import sys
from pathlib import Path

from draftsmith.machine import machine_info

work, (num, max_new, batch), spec, suffix = Path(sys.argv[1]), map(int, sys.argv[2:5]), *sys.argv[5:7]
reports, answers = {}, {}
for name in ("vllm", "local"):
    reports[name] = json.loads((work / f"{name}.jsonl.report.json").read_text())
    rows = [json.loads(line) for line in (work / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    answers[name] = {r["id"]: r["messages"][-1]["content"] for r in rows}
same = sum(answers["vllm"].get(k) == v for k, v in answers["local"].items())
out = {
    "what": "draftsmith data regenerate: --endpoint (vllm serve, vllm-cpu 0.32.0) vs local batched engine",
    "source": "sharegpt", "num": num, "max_new_tokens": max_new, "batch_or_concurrency": batch,
    "dtype": "float32", "temperature": 0.0, "vllm_speculative": spec,
    "vllm": reports["vllm"]["run"], "local": reports["local"]["run"],
    "identical_answers": f"{same}/{len(answers['local'])}",
    "machine": machine_info(),
}
Path(f"benchmarks/results/regen-vllm{suffix}.json").write_text(json.dumps(out, indent=1) + "\n")
for name in ("vllm", "local"):
    r = reports[name]["run"]
    print(f"{name:6s} {r['generated_tokens']} tokens in {r['seconds']} s: {r['tokens_per_s']} tok/s")
print(f"identical answers: {out['identical_answers']}")
EOF
