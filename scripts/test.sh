#!/usr/bin/env bash
# Lint, format check and the whole test suite, in the repository's .venv.
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
.venv/bin/ruff check draftsmith tests
.venv/bin/ruff format --check draftsmith tests
.venv/bin/python -m pytest "$@"
