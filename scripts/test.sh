#!/usr/bin/env bash
# Lint, format check and the whole test suite, in the repository's .venv. pyproject's addopts
# deselect the slow tests for a bare `pytest`; here they run, unless the caller passes its own -m
# (pytest keeps the last -m: `scripts/test.sh -m "not slow"`).
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -m "slow or not slow" "$@"
