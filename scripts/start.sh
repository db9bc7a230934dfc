#!/usr/bin/env bash
# Set up, then the main job: a first report about this machine (hwlab doctor).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/hwlab doctor "$@"
