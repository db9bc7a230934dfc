"""System state through NVML (``nvidia-ml-py``, module ``pynvml``) and library versions.

Three states, all non-fatal:

* NVML absent (CPU machine, no driver): ``snapshot()["nvml"] == {"available": False,
  "reason": ...}`` and an empty GPU list. Nothing raises.
* NVML present, a query not supported on this GPU/driver/VM (NVLink on a one-GPU VM,
  retired pages on parts that use row remapping): that field is recorded as
  ``{"unsupported": "<NVML error>"}``, never an exception.
* NVML present and answering: the value, with units in the key name.

``clock_event_reasons`` decodes NVML's throttle bitmask; anything other than idle or
"none" while a probe runs (power cap, thermal slowdown, HW slowdown) explains a slow node
before any kernel is blamed.
"""
from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

UNSUPPORTED = "unsupported"

# NVML clocks-event (throttle) reason bits, from nvml.h
_CLOCK_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: reasons that mean the clock is held down by power/thermal limits, not by idleness
THROTTLE_REASONS = {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                    "hw_thermal_slowdown", "hw_power_brake_slowdown"}
#: the throttle reasons that are signs of a sick card: all but the software power cap. A card at its
#: power limit under load holds its clocks down by design (a healthy card reads it under load, and an
#: idle record never shows it); a slowdown from the hardware or from heat is not normal operation
BAD_CARD_REASONS = frozenset(THROTTLE_REASONS - {"sw_power_cap"})


def decode_clock_reasons(mask: int) -> list[str]:
    names = [name for bit, name in _CLOCK_REASONS.items() if mask & bit]
    return names or ["none"]


def _q(fn: Callable[[], Any]) -> Any:
    """Run one NVML query; NotSupported / NoPermission / any NVML error -> marker dict."""
    try:
        return fn()
    except Exception as e:  # pynvml raises subclasses of NVMLError per code
        return {UNSUPPORTED: f"{type(e).__name__}: {e}"}


def is_unsupported(value: Any) -> bool:
    return isinstance(value, dict) and UNSUPPORTED in value


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def versions(load_torch: bool = True) -> dict[str, Any]:
    """Python, torch, CUDA, triton, NCCL, driver versions (what is importable here).

    ``load_torch=False`` (commands that read records, which must start fast and run where torch
    is not installed): torch and triton are not imported for this; their versions come from the
    installed packages' metadata, and the CUDA facts only from a torch this process already loaded
    (else ``cuda_runtime`` is None and ``cuda_not_queried`` says why)."""
    out: dict[str, Any] = {"python": platform.python_version()}
    if not load_torch and "torch" not in sys.modules:
        from importlib import metadata

        for pkg in ("torch", "triton"):
            try:
                out[pkg] = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                out[pkg] = None
        out["cuda_runtime"] = None
        out["cuda_not_queried"] = "torch was not loaded by this command (it reads records only)"
        return out
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda_runtime"] = torch.version.cuda
        out["cuda_available"] = torch.cuda.is_available()
        try:
            nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
            out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
        except Exception as e:
            out["nccl"] = {UNSUPPORTED: str(e)}
    except ImportError:
        out["torch"] = None
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


NVML_MISSING = "module pynvml missing"


@contextlib.contextmanager
def nvml_session(pynvml: Any | None = None) -> Iterator[tuple[Any | None, str | None]]:
    """The kit's one NVML session: ``with nvml_session() as (nvml, why):`` gives the initialised
    ``pynvml`` module and ``why=None``, or ``nvml=None`` and one sentence saying why NVML is not
    there (module missing, no driver); NVML is shut down on leaving, whatever happened inside.

    ``pynvml`` may be injected (tests pass a fake). The real module is imported here, not at
    the top of this module, on purpose: ``nvidia-ml-py`` is optional and a CPU machine has no
    driver for it, and the import must not cost anything to a caller that never asks NVML.
    """
    if pynvml is None:
        try:
            import pynvml as _pynvml  # provided by nvidia-ml-py; optional (docstring)
            pynvml = _pynvml
        except ImportError:
            yield None, f"{NVML_MISSING}: pip install nvidia-ml-py"
            return
    try:
        pynvml.nvmlInit()
    except Exception as e:
        yield None, f"NVML could not start ({type(e).__name__}: {e})"
        return
    try:
        yield pynvml, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _gpu_state(pynvml: Any, i: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    g: dict[str, Any] = {"index": i}
    g["name"] = _q(lambda: _s(pynvml.nvmlDeviceGetName(h)))
    g["uuid"] = _q(lambda: _s(pynvml.nvmlDeviceGetUUID(h)))
    g["pci_bus_id"] = _q(lambda: _s(pynvml.nvmlDeviceGetPciInfo(h).busId))
    g["temperature_c"] = _q(lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
    g["power_w"] = _q(lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
    g["power_limit_w"] = _q(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
    g["sm_clock_mhz"] = _q(lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    g["sm_clock_max_mhz"] = _q(lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
    g["mem_clock_mhz"] = _q(lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
    g["mem_clock_max_mhz"] = _q(lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))
    mask = _q(lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
    if is_unsupported(mask):
        mask = _q(lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
    g["clock_event_reasons"] = mask if is_unsupported(mask) else decode_clock_reasons(int(mask))
    g["ecc_mode"] = _q(lambda: dict(zip(("current", "pending"),
                                         map(bool, pynvml.nvmlDeviceGetEccMode(h)))))
    g["ecc_errors_volatile"] = _q(lambda: {
        "corrected": pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
        "uncorrected": pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)})
    g["ecc_errors_aggregate"] = _q(lambda: {
        "corrected": pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
        "uncorrected": pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC)})
    g["retired_pages"] = _q(lambda: {
        "single_bit_ecc": len(pynvml.nvmlDeviceGetRetiredPages(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
        "double_bit_ecc": len(pynvml.nvmlDeviceGetRetiredPages(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))})
    g["remapped_rows"] = _q(lambda: dict(zip(
        ("correctable", "uncorrectable", "pending", "failure"),
        pynvml.nvmlDeviceGetRemappedRows(h))))
    g["pcie_gen"] = _q(lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
    g["pcie_gen_max"] = _q(lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
    g["pcie_width"] = _q(lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))
    g["pcie_width_max"] = _q(lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))
    links = []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        st = _q(lambda: pynvml.nvmlDeviceGetNvLinkState(h, link))
        if is_unsupported(st):
            if not links:
                links = st  # whole NVLink query unsupported (one-GPU VM, PCIe part)
            break
        links.append({"link": link, "active": bool(st),
                      "remote_pci_bus_id": _q(lambda: _s(
                          pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))})
    g["nvlink"] = links
    g["utilization_pct"] = _q(lambda: {"gpu": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                                       "memory": pynvml.nvmlDeviceGetUtilizationRates(h).memory})
    g["memory_mib"] = _q(lambda: {"used": pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                                  "total": pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**20})
    g["numa_node"] = _q(lambda: pynvml.nvmlDeviceGetNumaNodeId(h))
    return g


def snapshot(pynvml: Any | None = None, *, load_torch: bool = True) -> dict[str, Any]:
    """Everything NVML and the Python stack say about this machine, now.

    ``pynvml`` may be injected (tests pass a partial fake); by default the real module is
    imported. Never raises for a missing driver or an unsupported query. ``load_torch``: see
    :func:`versions`.
    """
    snap: dict[str, Any] = {
        "taken_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": versions(load_torch),
        "gpus": [],
    }
    with nvml_session(pynvml) as (nvml, why):
        if nvml is None:
            if not why.startswith(NVML_MISSING):
                why += ". No NVIDIA driver here: GPU state is unknown; CPU results and recorded evidence still work."
            snap["nvml"] = {"available": False, "reason": why}
            return snap
        snap["nvml"] = {"available": True}
        snap["versions"]["driver"] = _q(lambda: _s(nvml.nvmlSystemGetDriverVersion()))
        snap["versions"]["cuda_driver"] = _q(lambda: nvml.nvmlSystemGetCudaDriverVersion_v2())
        n = nvml.nvmlDeviceGetCount()
        snap["gpus"] = [_gpu_state(nvml, i) for i in range(n)]
    return snap


def health_flags(snap: dict[str, Any]) -> list[str]:
    """Plain-language warnings from a snapshot (throttling, ECC, degraded PCIe, hot card).

    Thresholds: temperature >= 85 C (most data-centre parts start slowing near 87-90 C);
    any uncorrected volatile ECC error; any pending row remap; PCIe gen/width under max
    *while busy* is reported as a note, since idle links train down to save power.
    """
    flags: list[str] = []
    if not snap.get("nvml", {}).get("available"):
        return [f"NVML unavailable: {snap.get('nvml', {}).get('reason', 'unknown')}"]
    for g in snap["gpus"]:
        tag = f"GPU{g['index']}"
        t = g.get("temperature_c")
        if isinstance(t, (int, float)) and t >= 85:
            flags.append(f"{tag}: temperature {t} C >= 85 C")
        reasons = g.get("clock_event_reasons")
        if isinstance(reasons, list) and THROTTLE_REASONS & set(reasons):
            flags.append(f"{tag}: clocks held down by {sorted(THROTTLE_REASONS & set(reasons))}")
        ecc = g.get("ecc_errors_volatile")
        if isinstance(ecc, dict) and ecc.get("uncorrected", 0):
            flags.append(f"{tag}: {ecc['uncorrected']} uncorrected ECC errors since boot")
        rr = g.get("remapped_rows")
        if isinstance(rr, dict) and (rr.get("pending") or rr.get("failure")):
            flags.append(f"{tag}: row remapping pending/failed: reset needed")
        gen, gmax = g.get("pcie_gen"), g.get("pcie_gen_max")
        w, wmax = g.get("pcie_width"), g.get("pcie_width_max")
        if all(isinstance(x, int) for x in (gen, gmax, w, wmax)) and (gen < gmax or w < wmax):
            flags.append(f"{tag}: PCIe Gen{gen} x{w} now (max Gen{gmax} x{wmax}); "
                         "normal at idle, a fault if it stays so under load")
    return flags
