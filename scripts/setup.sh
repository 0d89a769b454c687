#!/usr/bin/env bash
# Create .venv and install pdscale (idempotent, fast when done).
#   scripts/setup.sh        pdscale and its development tools (tests, lint, types)
#   scripts/setup.sh run    pdscale only (what `make demo` needs)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "pdscale needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
dev_stamp=.venv/.pdscale-installed
run_stamp=.venv/.pdscale-installed-run
if [ "${1:-dev}" = "run" ]; then
  for stamp in "$dev_stamp" "$run_stamp"; do
    if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then exit 0; fi
  done
  echo "==> installing pdscale into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e .
  touch "$run_stamp"
  exit 0
fi
if [ ! -f "$dev_stamp" ] || [ pyproject.toml -nt "$dev_stamp" ]; then
  echo "==> installing pdscale and its development tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch "$dev_stamp"
fi
