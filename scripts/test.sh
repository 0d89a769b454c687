#!/usr/bin/env bash
# The whole test suite: set-up, lint, types, layering, pytest (real Prometheus and promtool, a
# real NVIDIA Dynamo frontend and mocker workers).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/system-deps.sh
scripts/dynamo-setup.sh
PKGS="pdscale"
echo "==> ruff"
.venv/bin/ruff check $PKGS tests bench
echo "==> mypy --strict"
.venv/bin/mypy $PKGS
echo "==> import-linter"
.venv/bin/lint-imports
echo "==> pytest"
.venv/bin/pytest "$@"
