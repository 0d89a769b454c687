#!/usr/bin/env bash
# NVIDIA Dynamo's frontend and mocker workers in their own venv, .venv-dynamo (idempotent, fast
# when done), so that Dynamo's dependencies never disturb pdscale's .venv. Pinned:
#   ai-dynamo-runtime 1.6.1 (the Rust runtime, an abi3 wheel) with its declared dependencies;
#   ai-dynamo 1.6.1 with --no-deps (it declares aisimulate, a PyPI placeholder that cannot
#   install, and a GPU stack the mocker does not use);
#   the three packages the frontend and the mocker import beyond those (found by starting them).
# A failed install removes the half-made venv and says why; nothing is started.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-dynamo
PINS=(
  "ai-dynamo-runtime==1.6.1"
  # its dependencies, pinned to what was tested
  "pydantic==2.13.5"
  "pydantic-core==2.46.5"
  "annotated-types==0.8.0"
  "typing-extensions==4.16.0"
  "typing-inspection==0.4.5"
  "uvloop==0.23.0"
  # imported by the frontend and the mocker, not declared by the runtime
  "packaging==26.4"
  "pyyaml==6.0.4"
  "msgspec==0.23.0"
)
NO_DEPS=("ai-dynamo==1.6.1")
stamp=$VENV/.pdscale-dynamo-installed
want="$(printf '%s\n' "${PINS[@]}" "${NO_DEPS[@]}")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x $VENV/bin/python ]; then
  exit 0
fi
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
  echo "Dynamo 1.6.1 needs Python >= 3.10; set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
fail() {
  echo "dynamo-setup: $1" >&2
  echo "dynamo-setup: removed the half-made $VENV; fix the cause and run scripts/dynamo-setup.sh again" >&2
  rm -rf "$VENV"
  exit 1
}
echo "==> installing NVIDIA Dynamo 1.6.1 (frontend, mocker) into $VENV"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" || fail "could not create a venv with $PYTHON (install python3-venv)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! $VENV/bin/python -m pip install -q --disable-pip-version-check "${PINS[@]}" >"$log" 2>&1; then
  tail -20 "$log" >&2
  fail "pip could not install ${PINS[*]} (is PyPI reachable? is this x86_64 or aarch64 Linux with glibc >= 2.28?)"
fi
if ! $VENV/bin/python -m pip install -q --disable-pip-version-check --no-deps "${NO_DEPS[@]}" >"$log" 2>&1; then
  tail -20 "$log" >&2
  fail "pip could not install ${NO_DEPS[*]}"
fi
# Both entry points must import: the same check the stack makes before it starts anything.
for mod in dynamo.frontend dynamo.mocker; do
  if ! timeout 120 $VENV/bin/python -m "$mod" --help >"$log" 2>&1; then
    tail -20 "$log" >&2
    fail "python -m $mod does not start (a dependency is missing?)"
  fi
done
echo "$want" >"$stamp"
