#!/usr/bin/env bash
# The one command that refreshes all GPU evidence on a GPU machine and executes every notebook
# there:   bash scripts/device_run.sh OUTDIR
# On the project's offline H200 (no Jupyter stack), first run scripts/fetch_wheels.sh here and
# carry .whl/ along; the preamble installs it into /tmp/site. On a normal GPU node with
# `bash scripts/setup.sh` done, the preamble is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: scripts/device_run.sh OUTDIR}
mkdir -p "$OUTDIR"
if [ -d .whl ]; then source scripts/device_preamble.sh; fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
rc=0
if [ -z "${SKIP_REFRESH:-}" ]; then
  nvidia-smi topo -m > "$OUTDIR/topo.txt" 2>&1
  $PY benchmarks/refresh_gpu_evidence.py --out "$OUTDIR" ${PARTS:+--only $PARTS} 2>&1 | tee "$OUTDIR/refresh.log"
  rc=${PIPESTATUS[0]}
fi
[ -n "${SKIP_NOTEBOOKS:-}" ] && exit $rc
# notebooks read the runs just recorded (overlaid on the committed ones), in a copy
mkdir -p "$OUTDIR/recorded/h200" && cp -r src/hwlab/recorded/. "$OUTDIR/recorded/"
cp "$OUTDIR"/*.json "$OUTDIR/recorded/h200/" 2>/dev/null
export HWLAB_RECORDED_DIR=$OUTDIR/recorded
$PY benchmarks/execute_notebooks.py --out "$OUTDIR/nb" 2>&1 | tee "$OUTDIR/notebooks.log"
exit $(( rc || PIPESTATUS[0] ))
