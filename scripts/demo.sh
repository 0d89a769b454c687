#!/usr/bin/env bash
# The first run: set up, then compare pdscale with the reactive (HPA-like) and static policies
# on the embedded synthetic trace, print the table, and write plots, per-policy results and
# the spec's alerts and dashboards into out/.
#   scripts/demo.sh [SPEC] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh run
SPEC=${1:-examples/vllm.yaml}
OUT=${2:-out}
.venv/bin/pdscale validate "$SPEC"
.venv/bin/pdscale demo --spec "$SPEC" --out "$OUT"
