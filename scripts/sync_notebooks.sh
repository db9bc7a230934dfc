#!/usr/bin/env bash
# Regenerate the .ipynb of every paired notebook from its reviewable .py (jupytext percent),
# outputs stripped. Edit the .py, then run this; tests/test_notebooks.py checks they agree.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in notebooks/*.py exercises/*.py solutions/*.py; do
  upd=(); [ -f "${f%.py}.ipynb" ] && upd=(--update)  # keep cell ids: no churn in the diff
  .venv/bin/jupytext --quiet --to ipynb "${upd[@]}" --update-metadata '{"jupytext": {"formats": "ipynb,py:percent"}}' "$f" -o "${f%.py}.ipynb"
done
