#!/usr/bin/env bash
# The main job: validate the example spec and generate its alerts and dashboards into out/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
SPEC=${1:-examples/vllm.yaml}
OUT=${2:-out}
.venv/bin/pdscale validate "$SPEC"
.venv/bin/pdscale generate all "$SPEC" --out "$OUT"
