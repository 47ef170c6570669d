#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs dssup with the extras named in $DSSUP_EXTRAS
# (default: dev,train). Idempotent: a second run only checks a stamp. torch is pinned by the
# extras (torch==2.13.0), so pip never resolves an unpinned, multi-GB CUDA build. pip's output
# goes to .venv/setup.log and is shown only when the install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${DSSUP_EXTRAS:-dev,train}"
py="${PYTHON:-python3}"
export DS_BUILD_OPS=0   # DeepSpeed extra: no JIT/CUDA op builds at install time
if [ ! -x .venv/bin/python ]; then
  echo "dssup setup: creating .venv with $("$py" --version 2>&1)"
  "$py" -m venv .venv
fi
stamp=".venv/.dssup-installed-${extras//,/-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "dssup setup: installing dssup[${extras}] into .venv (first time: a few minutes)"
  echo "+ .venv/bin/python -m pip install -e '.[${extras}]'   # output in .venv/setup.log"
  .venv/bin/python -m pip install --disable-pip-version-check -e ".[${extras}]" \
    > .venv/setup.log 2>&1 &
  pip_pid=$!
  started=$SECONDS
  while kill -0 "$pip_pid" 2>/dev/null; do  # a line of progress every 10 s
    sleep 2
    if (( (SECONDS - started) % 10 < 2 && SECONDS > started + 1 )); then
      last=$(grep -E '^(Collecting|Downloading|Building|Installing|Successfully)' .venv/setup.log \
        | tail -n 1 | cut -c1-90)
      echo "dssup setup: $((SECONDS - started)) s: ${last:-starting pip}"
    fi
  done
  if ! wait "$pip_pid"; then
    tail -40 .venv/setup.log >&2
    echo "dssup setup: pip install failed; full log in .venv/setup.log" >&2
    exit 1
  fi
  echo "dssup setup: installed in $((SECONDS - started)) s"
  touch "$stamp"
fi
