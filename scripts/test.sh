#!/usr/bin/env bash
# The whole test suite: set-up, lint, types, layering, the docs site, pytest (real Prometheus
# and promtool, a real NVIDIA Dynamo frontend and mocker workers).
set -euo pipefail
cd "$(dirname "$0")/.."
# Dynamo's venv installs beside pdscale's (they share nothing); a failure in either stops here.
# Its own process group (setsid), so a set-up that fails stops its pip install too.
setsid scripts/dynamo-setup.sh &
dynamo=$!
trap 'kill -- "-$dynamo" 2>/dev/null || true' EXIT
scripts/setup.sh
wait "$dynamo"
trap - EXIT
scripts/system-deps.sh
PKGS="pdscale"
echo "==> ruff"
.venv/bin/ruff check $PKGS tests bench
# mypy (about 40 s from cold) runs beside pytest, whose end-to-end tests leave a core idle;
# its report follows pytest's, and either failing fails the run.
echo "==> mypy --strict (beside pytest; its report follows pytest's)"
mypy_log=$(mktemp)
site=$(mktemp -d)
.venv/bin/mypy $PKGS >"$mypy_log" 2>&1 &
mypy=$!
# A run that stops early stops mypy too, and leaves nothing behind.
trap 'kill "$mypy" 2>/dev/null || true; rm -rf "$site" "$mypy_log"' EXIT
echo "==> import-linter"
.venv/bin/lint-imports
echo "==> mkdocs build --strict"
# The docs site: every page in the nav, every link and anchor resolving. Built into a
# temporary folder, so a run leaves nothing behind.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
echo "==> pytest"
# Three workers on two cores: the end-to-end tests mostly wait on real servers, so they overlap
# the CPU-bound ones. --dist loadfile keeps a file's tests (and its module-scoped servers) on
# one worker. PDSCALE_TEST_WORKERS=0 runs in one process.
workers=${PDSCALE_TEST_WORKERS:-3}
status=0
if [ "$workers" = "0" ]; then
  .venv/bin/pytest "$@" || status=$?
else
  .venv/bin/pytest -n "$workers" --dist loadfile "$@" || status=$?
fi
echo "==> mypy --strict"
mypy_status=0
wait "$mypy" || mypy_status=$?
cat "$mypy_log"
[ "$mypy_status" -eq 0 ] || exit "$mypy_status"
exit "$status"
