#!/usr/bin/env bash
# Sets up ./.venv and runs every check CI runs: lint, format, types, layer contracts, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow" -x).
set -euo pipefail
cd "$(dirname "$0")/.."
DSSUP_EXTRAS="${DSSUP_EXTRAS:-dev,train,deepspeed}" bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff check";   ruff check .
echo "== ruff format";  ruff format --check .
echo "== mypy";         mypy
echo "== import-linter"; lint-imports
echo "== pytest";       python -m pytest "$@"
