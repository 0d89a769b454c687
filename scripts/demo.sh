#!/usr/bin/env bash
# The first run: set up, then compare pdscale with the reactive (HPA-like) and static policies
# and the best fixed allocation in hindsight on a generated working morning, print the table,
# and write plots, per-policy results and the spec's alerts and dashboards into out/.
#   scripts/demo.sh [SPEC] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh run
SPEC=${1:-examples/vllm.yaml}
OUT=${2:-out}
.venv/bin/pdscale validate "$SPEC"
.venv/bin/pdscale demo --spec "$SPEC" --out "$OUT"
