#!/usr/bin/env bash
# Sets up ./.venv and runs the main job on built-in defaults: estimate DeepSeek-V3's memory,
# plan a config that fits, then recover a real torchrun job (2 ranks, CPU) from a real OOM.
set -euo pipefail
cd "$(dirname "$0")/.."
DSSUP_EXTRAS="${DSSUP_EXTRAS:-dev,train}" bash scripts/setup.sh
echo "+ .venv/bin/dssup demo $*"
exec .venv/bin/dssup demo "$@"
