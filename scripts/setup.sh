#!/usr/bin/env bash
# Create .venv and install hwlab with everything it needs (idempotent): the library, the CLI,
# the notebooks' Jupyter stack (extra `lab`), the test tools (extra `dev`) and nbgrader for
# instructors (extra `grade`; its course is tested in CI) and JupyterHub with its Slurm and
# Kubernetes spawners for a class (extra `hub`; deploy/, tested in CI with a real hub) and Dask
# distributed for reading a job's traces on a cluster (extra `dist`; a LocalCluster test in CI).
# Without an NVIDIA driver the CPU pins apply (constraints-cpu.txt: torch 2.13.0 and the triton
# PyPI's torch 2.13.0 requires, whose ptxas compiles for sm_90a with no GPU); on a GPU node pip
# picks the CUDA build in range. From PyPI alone a Linux machine gets torch's CUDA build (several
# GB, see README); HWLAB_TORCH_INDEX=https://download.pytorch.org/whl/cpu installs the pinned
# torch from that index first (the CPU build, a few hundred MB) and everything else from PyPI.
#
#   bash scripts/setup.sh               install into .venv
#   bash scripts/setup.sh --check-pypi  prove the same install resolves from PyPI alone (no local
#                                       wheels, no pip config), in a throwaway venv; installs nothing
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the one install command's arguments, shared by the install and by --check-pypi
spec=(-e '.[dev,lab,grade,hub,dist]')
constraints=()
if [ "${1:-}" = "--check-pypi" ] || ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  constraints=(-c constraints-cpu.txt)
fi

if [ "${1:-}" = "--check-pypi" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$PY" -m venv "$tmp/venv"
  # --isolated: no pip config, no PIP_* variables (no local wheel folder); an empty cache of its
  # own (shared by the two checks below, so each wheel downloads once); --ignore-installed:
  # resolve everything, as on a fresh machine
  pypi=(--isolated --cache-dir "$tmp/cache" --index-url https://pypi.org/simple)
  "$tmp/venv/bin/python" -m pip install -q "${pypi[@]}" --upgrade pip
  check() {  # check NAME PIP-ARGS...: a dry-run install from PyPI alone, then what it resolved
    local name=$1; shift
    if ! "$tmp/venv/bin/python" -m pip install "${pypi[@]}" --dry-run --ignore-installed -q \
         --report "$tmp/report.json" "$@"; then
      echo "setup --check-pypi: $name (pip install $*) does NOT resolve from PyPI alone:" \
           "fix the pins in constraints-cpu.txt / pyproject.toml (pip's reason is above)" >&2
      exit 1
    fi
    "$tmp/venv/bin/python" - "$tmp/report.json" "$name" <<'EOF'
import json, sys
got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
print(f"setup --check-pypi: {sys.argv[2]} resolves from PyPI alone: {len(got)} packages, "
      f"torch {got.get('torch')}, triton {got.get('triton')}")
EOF
  }
  check "the setup install" "${constraints[@]}" "${spec[@]}"
  check "a plain pip install ." .
  exit 0
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ -n "${HWLAB_TORCH_INDEX:-}" ]; then
  torch_pin=$(grep -E '^torch==' constraints-cpu.txt)
  .venv/bin/python -m pip install -q --index-url "$HWLAB_TORCH_INDEX" "$torch_pin"
fi
.venv/bin/python -m pip install -q "${constraints[@]}" "${spec[@]}"
# The kit's own Jupyter kernel, `hwlab`, installed inside .venv (--sys-prefix): it is seen by
# this venv's Jupyter (`hwlab lab`) and never replaces a kernel of the user's or of another
# clone (the display name says which venv it runs).
.venv/bin/python -m ipykernel install --sys-prefix --name hwlab \
  --display-name "$(.venv/bin/python -c 'import sys; print(f"hwlab (Python {sys.version_info[0]}.{sys.version_info[1]})")')" >/dev/null
echo "hwlab installed in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')); Jupyter kernel 'hwlab' in .venv"
