"""The machine facts the kit's verdicts depend on, for tests.

A verdict rule that holds on the machine a test was written on can fail on another: a different
last-level cache moves the wasted-traffic bound, a different kernel answers a folder it cannot
make with another errno, a different core count changes what a busy host looks like. Tests whose
verdict depends on one of these run on this machine's fact *and* on a second profile far from it
(:func:`machine_profiles`), and the facts are printed in the session header (``conftest.py``), so
a failure on an unfamiliar machine is read beside what that machine is.
"""
from __future__ import annotations

import errno
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: a second profile's cache: this far from this machine's (a factor), in either direction, so a rule
#: tuned to one cache size meets a very different one (a laptop's few MiB against a server's tens)
PROFILE_FACTOR = 8
#: the second profile when this machine's cache is unknown
FALLBACK_CACHE_BYTES = 32 * 2 ** 20


@dataclass(frozen=True)
class MachineProfile:
    name: str
    cache_bytes: int


def llc_bytes() -> int | None:
    import torch

    from hwlab.core.measure import last_level_cache_bytes

    return last_level_cache_bytes(torch.device("cpu"))


def machine_profiles() -> list[MachineProfile]:
    """This machine's last-level cache, and a second profile :data:`PROFILE_FACTOR` away from it
    (smaller when this cache is 16 MiB or more, larger otherwise)."""
    own = llc_bytes()
    if own is None:
        return [MachineProfile("unknown-cache-profile", FALLBACK_CACHE_BYTES)]
    other = own // PROFILE_FACTOR if own >= 16 * 2 ** 20 else own * PROFILE_FACTOR
    return [MachineProfile(f"this-machine-{own / 2 ** 20:g}MiB", own),
            MachineProfile(f"other-profile-{other / 2 ** 20:g}MiB", other)]


def unwritable_errno() -> str:
    """The errno this kernel answers for a folder made under /proc (ENOENT on some, EACCES on others)."""
    try:
        os.makedirs("/proc/hwlab-errno-probe/x")
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    os.removedirs("/proc/hwlab-errno-probe/x")
    return "none (made it)"


def facts() -> dict[str, str]:
    """The machine facts printed beside the test results."""
    model = "?"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    own = llc_bytes()
    if os.environ.get("HWLAB_TEST_MACHINE_PROFILE") == "other":
        own = None  # said below: the examination runs on the second profile's cache
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": f"{model} ({platform.machine()})", "cores usable": str(len(os.sched_getaffinity(0))),
            "last-level cache": f"{own / 2 ** 20:g} MiB" if own else
            f"examined as {machine_profiles()[-1].name} (HWLAB_TEST_MACHINE_PROFILE=other)",
            "second cache profile": ", ".join(p.name for p in machine_profiles()),
            "isa": " ".join(isa) or "none of avx2/avx512/amx",
            "errno making a folder under /proc": unwritable_errno(),
            "uid": str(os.getuid()), "tmp": tempfile.gettempdir(),
            "load average": " ".join(f"{x:.1f}" for x in load) if load else "?"}
