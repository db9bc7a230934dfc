#!/usr/bin/env bash
# Create .venv and install hwlab with everything it needs (idempotent).
# Without an NVIDIA driver the CPU pins apply (torch 2.13.0 CPU wheel, triton 3.8.0 whose
# ptxas compiles for sm_90 with no GPU); on a GPU node pip picks the CUDA build in range.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
constraints=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  constraints=(-c constraints-cpu.txt)
fi
.venv/bin/python -m pip install -q "${constraints[@]}" -e '.[dev]'
.venv/bin/python -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
echo "hwlab installed in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
