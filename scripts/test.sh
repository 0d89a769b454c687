#!/usr/bin/env bash
# The whole test suite: set-up, lint, types, layering, the docs site, pytest (real Prometheus
# and promtool, a real NVIDIA Dynamo frontend and mocker workers).
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
echo "==> mkdocs build --strict"
# The docs site: every page in the nav, every link and anchor resolving. Built into a
# temporary folder, so a run leaves nothing behind.
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
echo "==> pytest"
# Three workers on two cores: the end-to-end tests mostly wait on real servers, so they overlap
# the CPU-bound ones. --dist loadfile keeps a file's tests (and its module-scoped servers) on
# one worker. PDSCALE_TEST_WORKERS=0 runs in one process.
workers=${PDSCALE_TEST_WORKERS:-3}
if [ "$workers" = "0" ]; then
  .venv/bin/pytest "$@"
else
  .venv/bin/pytest -n "$workers" --dist loadfile "$@"
fi
