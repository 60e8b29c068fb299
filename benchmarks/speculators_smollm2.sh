#!/usr/bin/env bash
# The trained speculators of speculators/ against plain decoding and the training-free drafters on
# the embedded target: code, chat and long (20 prompts, 256 new tokens, bf16, k=7) at temperature 0
# with EAGLE-3 chains and trees, DFlash and MTP, then at temperature 1 (seed 0), then one float32
# run whose match_rate must be 1.0 for every method. Results land in benchmarks/results/.
# MTP runs at k=3 (`@3`): each of its draft steps is a target-sized layer plus the target's 49k-row
# LM head, about a quarter of a SmolLM2 forward, so long chains cost more than they return.
# `bash benchmarks/speculators_smollm2.sh t0` (or t1, fp32, eagle3, eagle3-t1, dflash, learned, learned-t1, draftlm,
# draftlm-t1; several in a row) runs those parts;
# WORKLOADS="code chat" limits the eagle3, dflash, learned and draftlm parts to those workloads.
# min_prob=0.2 cuts EAGLE-3 chains where the draft is unsure (best of 0.2/0.4/0.6 on 5 code prompts).
# The hybrid drafts with suffix decoding where its expected accepted length is at least 2, else EAGLE-3
# (min_score 0.5/1/2/3/4 on 5 code prompts x 128: tau 1.82/1.91/2.03/2.02/2.04; suffix 1.56, EAGLE-3 1.64).
# Trees: the narrow one (topk=4 size=16) verifies half the tokens of topk=8 size=32 for a little less
# tau; on 5 code prompts x 128 with the stage-5 weights, 1.61x (tau 2.46) against 1.35x (tau 2.70).
# On long (about 4,800 prompt tokens) a method costs 7-13 minutes on a 2-core CPU, so the eagle3 part
# leaves out the wide tree there and eagle3-t1 runs only the four methods the issue asks for.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results
spec=speculators
mkdir -p "${out}"
e3="eagle3:${spec}/smollm2-135m-eagle3"
tree="eagle3-tree:${spec}/smollm2-135m-eagle3:topk=8:size=32"
tree16="eagle3-tree:${spec}/smollm2-135m-eagle3:topk=4:size=16"
df="dflash:${spec}/smollm2-135m-dflash"
# DFlash over the 16,384 tokens most frequent in its training data (vocab_order.json): a third of
# the head it reads for every slot; they hold 96% of the v3 held-out answers' tokens.
df_cut="${df}:vocab=16384"
# The same block verified as a tree of the 16 likeliest paths through each slot's 3 best tokens,
# over the cut head (4 chat prompts x 128, stage-4 weights: chain tau 1.76 1.21x; topk=2 size=12
# 1.96 1.19x; topk=4 size=24 2.26 1.08x; topk=3 size=16 vocab=16384 2.14 1.23x).
df_tree="dflash-tree:${spec}/smollm2-135m-dflash:topk=3:size=16:vocab=16384"
mtp="mtp:${spec}/smollm2-135m-mtp@3"
hybrid="suffix:min_score=2+${e3}:min_prob=0.2"
draftlm="draft:${spec}/smollm2-135m-draftlm"
draft_k=${DRAFT_K:-4}
# The draft LM's head cut to the 16,384 tokens most frequent in its training data (all of them; a
# draft step 8.6 -> 5.3 ms), and in the hybrid chains cut where the draft's top probability is
# under 0.3 (5 chat prompts x 128 at T=0: draft@4 tau 2.06 0.99x, vocab=16384@4 2.01 1.13x,
# @3 1.91 1.22x; hybrid with min_prob=0.3:k=6 2.00 1.53x against suffix 1.42 1.40x).
draftlm_fast="${draftlm}:vocab=16384"
draftlm_hybrid="suffix:min_score=2+${draftlm}:vocab=16384:min_prob=0.3:k=6"
draft_peers=${DRAFT_PEERS-hf-assisted}  # DRAFT_PEERS= leaves transformers' assistant_model out
run() {  # name, extra bench args...
    local name=$1
    shift
    .venv/bin/draftsmith bench --target smollm2-135m --num-prompts 20 --max-new-tokens 256 --k 7 \
        --no-progress --out "${out}/${name}.json" "$@" | tee "${out}/${name}.txt"
}
parts=${*:-t0 t1 fp32}
workloads=${WORKLOADS:-code chat long}
for part in ${parts}; do
    case ${part} in
    t0)
        for w in code chat long; do
            run "speculators-${w}-t0" --workload "${w}" --drafters "ar,ngram,suffix,${e3},${tree},${df},${mtp}"
        done
        ;;
    eagle3-t1)
        for w in ${workloads}; do
            extra=",${hybrid}"
            [[ ${w} == long ]] && extra=""
            run "speculators-eagle3-${w}-t1" --workload "${w}" --temperature 1 --seed 0 \
                --drafters "ar,ngram,suffix,${e3}${extra}"
        done
        ;;
    t1)
        for w in code chat long; do
            run "speculators-${w}-t1" --workload "${w}" --temperature 1 --seed 0 \
                --drafters "ar,ngram,suffix,${e3},${df}"
        done
        ;;
    eagle3)
        # After retraining EAGLE-3 alone: its rows against the same baselines, without rerunning the others.
        for w in ${workloads}; do
            wide="${tree},"
            [[ ${w} == long ]] && wide=""
            run "speculators-eagle3-${w}-t0" --workload "${w}" \
                --drafters "ar,ngram,suffix,${e3},${e3}:min_prob=0.2,${wide}${tree16},${hybrid}"
        done
        ;;
    learned|learned-t1)
        # Issue 22's table: the training-free drafters, both learned speculators, each in the
        # suffix hybrid (min_score=2), one run per workload. learned-t1: the same at temperature 1.
        temp=(--temperature 0) t=t0
        [[ ${part} == learned-t1 ]] && temp=(--temperature 1 --seed 0) t=t1
        for w in ${workloads}; do
            run "speculators-learned-${w}-${t}" --workload "${w}" "${temp[@]}" \
                --drafters "ar,ngram,suffix,${e3},${df},${df_cut},${df_tree},suffix:min_score=2+${e3},suffix:min_score=2+${df},suffix:min_score=2+${df_tree}"
        done
        ;;
    draftlm|draftlm-t1)
        # Issue 26's table: the distilled draft LM (at its own k, DRAFT_K, default 4: each of its
        # draft tokens costs five layers plus the 49k-row head) beside the training-free drafters and
        # the learned speculators, its hybrid, and transformers' assistant_model with the same draft.
        temp=(--temperature 0) t=t0
        [[ ${part} == draftlm-t1 ]] && temp=(--temperature 1 --seed 0) t=t1
        for w in ${workloads}; do
            peers=()
            [[ -n ${draft_peers} ]] && peers=(--peers "${draft_peers}")
            run "speculators-draftlm-${w}-${t}" --workload "${w}" "${temp[@]}" "${peers[@]}" \
                --drafters "ar,ngram,suffix,${draftlm_fast}@${draft_k},${e3},${df},${draftlm_hybrid}"
        done
        ;;
    dflash)
        # After retraining DFlash alone: its rows and its suffix hybrid against the training-free
        # drafters, without rerunning the other speculators (their taus are in the learned tables).
        for w in ${workloads}; do
            run "speculators-dflash-${w}-t0" --workload "${w}" \
                --drafters "ar,ngram,suffix,${df},${df_cut},${df_tree},suffix:min_score=2+${df},suffix:min_score=2+${df_tree}"
        done
        ;;
    fp32)
        run "speculators-code-fp32" --workload code --dtype float32 --num-prompts 5 \
            --drafters "ar,ngram,suffix,${e3},${tree},${df},${mtp}"
        ;;
    *) echo "unknown part ${part}: use t0, t1, fp32, eagle3, eagle3-t1, dflash, learned, learned-t1, draftlm or draftlm-t1" >&2; exit 2 ;;
    esac
done
