#!/usr/bin/env bash
# Set up, then the main job: a first report about this machine (hwlab doctor).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/link_cli.sh  # `hwlab` in new shells (or the one line that makes it so)
.venv/bin/hwlab doctor "$@"
