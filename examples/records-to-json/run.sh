#!/usr/bin/env bash
# Reproduce this example in one command: the traffic file, `draftsmith tune` (30-minute budget for
# regeneration and training), then the report copied next to this script.
#
#   bash examples/records-to-json/run.sh              # BASE=speculator folder, OUT=run folder, RESUME=1 to continue
set -euo pipefail
cd "$(dirname "$0")/../.."
here=examples/records-to-json
out=${OUT:-runs/tune-records-to-json}
.venv/bin/python "${here}/make_traffic.py" --num 300 --out "${here}/traffic.jsonl"
.venv/bin/draftsmith tune --target smollm2-135m --traffic "${here}/traffic.jsonl" \
    --from "${BASE:-speculators/smollm2-135m-eagle3}" --out "${out}" --holdout 20 --budget-minutes 30 \
    --max-new-tokens 128 --k 7 --hardware h100,b200 ${RESUME:+--resume}
cp "${out}/report.json" "${out}/report.md" "${out}/curve.png" "${here}/"
