#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs dssup with the extras named in $DSSUP_EXTRAS
# (default: dev,train). Idempotent: a second run only checks. torch is pinned by the `train`
# extra (torch==2.13.0), so pip never resolves an unpinned, multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${DSSUP_EXTRAS:-dev,train}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=".venv/.dssup-installed-${extras//,/-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
  touch "$stamp"
fi
