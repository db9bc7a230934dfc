"""What a fresh CPU machine downloads from PyPI alone: the wheel sizes pip printed during
``pip install --dry-run --isolated --ignore-installed --no-cache-dir --index-url
https://pypi.org/simple -c constraints-cpu.txt -e '.[dev,lab]'`` (pip downloads each wheel to
read its metadata where the index offers no separate metadata, and names its size).

    python tools/install_size.py PIP_LOG OUT.json

Measured on a CPU machine, not a GPU run. The README's download figure is rendered from OUT
(tests/test_packaging.py re-derives it).
"""
from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

UNIT_MB = {"bytes": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}
#: the wheels that come with torch's CUDA build on PyPI (and torch, triton themselves)
CUDA_STACK = ("torch-", "triton-", "nvidia_", "nvidia-", "cuda_", "cuda-")


def wheels_mb(log_text: str) -> dict[str, float]:
    """wheel file name -> size in MB (decimal), from pip's ``Downloading NAME (SIZE UNIT)`` lines."""
    out = {}
    for m in re.finditer(r"Downloading (\S+) \(([\d.]+) (bytes|kB|MB|GB)\)", log_text):
        out[m.group(1)] = float(m.group(2)) * UNIT_MB[m.group(3)]
    return out


def summary(wheels: dict[str, float]) -> dict[str, float]:
    total = sum(wheels.values())
    cuda = sum(v for k, v in wheels.items() if k.startswith(CUDA_STACK))
    return {"n_wheels": len(wheels), "total_mb": round(total, 1), "torch_cuda_stack_mb": round(cuda, 1)}


def main(argv: list[str]) -> int:
    log, out = Path(argv[0]), Path(argv[1])
    wheels = wheels_mb(log.read_text())
    rec = {"what": "wheels pip downloaded resolving the README's install from PyPI alone (CPU machine)",
           "measured_on": "CPU machine (not a GPU run)",
           "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "pip install --dry-run --isolated --ignore-installed --no-cache-dir --index-url "
                      "https://pypi.org/simple -c constraints-cpu.txt -e '.[dev,lab]'",
           **summary(wheels), "wheels_mb": dict(sorted(wheels.items()))}
    out.write_text(json.dumps(rec, indent=2) + "\n")
    print(json.dumps(summary(wheels)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
