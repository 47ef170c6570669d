#!/usr/bin/env bash
# Sets up ./.venv and runs every check CI runs: lint, format, types, layer contracts, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow" -x).
set -euo pipefail
cd "$(dirname "$0")/.."
DSSUP_EXTRAS="${DSSUP_EXTRAS:-dev,train,deepspeed,calibrate,hf}" bash scripts/setup.sh
# etcd (Debian etcd-server) backs the etcd-v2 rendezvous tests; install it when we can.
if ! command -v etcd >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "dssup test: installing etcd-server (Debian) for the elastic rendezvous tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server) \
    > .venv/apt.log 2>&1 || echo "dssup test: etcd-server not installed (see .venv/apt.log)"
fi
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff check";   ruff check .
echo "== ruff format";  ruff format --check .
echo "== mypy";         mypy
echo "== import-linter"; lint-imports
echo "== pytest";       python -m pytest "$@"
