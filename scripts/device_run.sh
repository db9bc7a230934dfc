#!/usr/bin/env bash
# The one command that refreshes all GPU evidence on a GPU machine and executes every notebook
# there:   bash scripts/device_run.sh OUTDIR
# On the project's offline H200 (no Jupyter stack), first run scripts/fetch_wheels.sh here and
# carry .whl/ along; the preamble installs it into /tmp/site. On a normal GPU node with
# `bash scripts/setup.sh` done, the preamble is skipped.
# Environment: PARTS (refresh only these), SKIP_REFRESH / SKIP_NOTEBOOKS / NOTEBOOKS (names for
# execute_notebooks.py --only), PACK=FILE.tgz (pack OUTDIR into one archive at the end: a lent
# device call returns at most 8 files and runs at most 600 s, so split the parts over two calls,
# e.g. PARTS=doctor,probe_vs_torch,lab01,lab02,lab03,baseline then PARTS=scenarios,lab04,drills,
# each with PACK=$OUT/NAME.tgz and SKIP_NOTEBOOKS=1, and run the notebooks in a third call).
# A failing part does not stop the others (--keep-going); the exit status says one failed. Logs are
# appended, so two calls into one OUTDIR on a warm machine keep both calls' lines.
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
  $PY tools/refresh_gpu_evidence.py --out "$OUTDIR" --keep-going ${PARTS:+--only $PARTS} 2>&1 \
    | grep -v "Warning\|warnings.warn\|_warn_once" | tee -a "$OUTDIR/refresh.log"
  rc=${PIPESTATUS[0]}
fi
pack() { [ -n "${PACK:-}" ] && tar czf "$PACK" -C "$OUTDIR" . && echo "packed $OUTDIR into $PACK"; }
if [ -n "${SKIP_NOTEBOOKS:-}" ]; then pack; exit $rc; fi
# notebooks read the runs just recorded (overlaid on the committed ones), in a copy
mkdir -p "$OUTDIR/recorded/h200" && cp -r src/hwlab/recorded/. "$OUTDIR/recorded/"
cp "$OUTDIR"/*.json "$OUTDIR/recorded/h200/" 2>/dev/null
export HWLAB_RECORDED_DIR=$OUTDIR/recorded
$PY tools/execute_notebooks.py --out "$OUTDIR/nb" ${NOTEBOOKS:+--only $NOTEBOOKS} 2>&1 | tee -a "$OUTDIR/notebooks.log"
nbrc=${PIPESTATUS[0]}
pack
exit $(( rc || nbrc ))
