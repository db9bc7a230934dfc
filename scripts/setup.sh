#!/usr/bin/env bash
# Create .venv and install hwlab with everything it needs (idempotent): the library, the CLI,
# the notebooks' Jupyter stack (extra `lab`) and the test tools (extra `dev`).
# Without an NVIDIA driver the CPU pins apply (torch 2.13.0 CPU wheel, triton 3.8.0 whose
# ptxas compiles for sm_90a with no GPU); on a GPU node pip picks the CUDA build in range.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
constraints=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  constraints=(-c constraints-cpu.txt)
fi
.venv/bin/python -m pip install -q "${constraints[@]}" -e '.[dev,lab]'
# The kit's own Jupyter kernel, `hwlab`, installed inside .venv (--sys-prefix): it is seen by
# this venv's Jupyter (`hwlab lab`) and never replaces a kernel of the user's or of another
# clone (the display name says which venv it runs).
.venv/bin/python -m ipykernel install --sys-prefix --name hwlab \
  --display-name "hwlab ($(pwd)/.venv)" >/dev/null
echo "hwlab installed in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')); Jupyter kernel 'hwlab' in .venv"
