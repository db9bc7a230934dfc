"""Opt-in background sampling of each GPU's activity and link throughput through NVML.

``with NvmlSampler(interval_s=0.05) as s: ...steps...`` starts a daemon thread that asks NVML,
every ``interval_s``, for each GPU's:

* ``util_pct``: NVML's utilisation (the share of the sample period in which *any* kernel ran);
* ``sm_active_pct``: the share of SMs busy (NVML GPM metric ``SM_UTIL``, Hopper and newer, two
  GPM samples ``interval_s`` apart); ``None`` with the NVML error where GPM is not supported;
* ``pcie_tx_mbps`` / ``pcie_rx_mbps``: PCIe throughput NVML measured over its own 20 ms window
  (``nvmlDeviceGetPcieThroughput``, KB/s -> MB/s);
* ``nvlink_tx_mbps`` / ``nvlink_rx_mbps``: from NVML's cumulative NVLink data counters
  (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``, KiB) differenced between samples, when the GPU has
  an active NVLink; a GPU without one (a one-GPU machine) records ``nvlink: "absent"``.

Only NVML is called: no CUDA call, so no synchronisation is added to the job. Without the
``pynvml`` module or a driver, the sampler records why and no samples
(:func:`hwlab.core.system.nvml_session`, the kit's one NVML session).

:func:`summarise` gives per GPU the median and p10-p90 of each series and two flags the seed
asks for: **util high but SM active low** (median utilisation at least :data:`UTIL_HIGH_PCT`
while the SMs are busy under :data:`SM_LOW_PCT`: kernels are running but few SMs work -- small
grids, a serialised stream, a rank waiting inside an NCCL kernel that spins on a few SMs), and,
across GPUs, **unbalanced links** (a GPU whose median link throughput is under
:data:`LINK_UNBALANCED` of the GPUs' median while that median is at least :data:`LINK_BUSY_MBPS`,
so idle links are not compared).
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from hwlab.core.measure import quantile
from hwlab.core.system import nvml_session

UTIL_HIGH_PCT = 80.0
SM_LOW_PCT = 50.0
LINK_UNBALANCED = 0.5
LINK_BUSY_MBPS = 100.0
NVLINK_MAX_LINKS = 18


def _err(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


class NvmlSampler:
    """The background sampler (module docstring); ``samples`` and ``status`` after :meth:`stop`."""

    def __init__(self, interval_s: float = 0.05, *, devices: list[int] | None = None, pynvml: Any | None = None):
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self.interval_s, self.devices, self._pynvml = interval_s, devices, pynvml
        self.samples: list[dict[str, Any]] = []
        self.status: dict[str, Any] = {"available": None}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> "NvmlSampler":
        self._thread = threading.Thread(target=self._run, name="hwlab-nvml-sampler", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        return self.result()

    def __enter__(self) -> "NvmlSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def result(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "status": self.status, "samples": self.samples}

    def _run(self) -> None:
        with nvml_session(self._pynvml) as (nv, why):
            if nv is None:
                self.status = {"available": False, "reason": why}
                self._ready.set()
                return
            try:
                n = nv.nvmlDeviceGetCount()
                idx = self.devices if self.devices is not None else list(range(n))
                handles = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in idx}
            except Exception as e:
                self.status = {"available": False, "reason": f"NVML device query failed ({_err(e)})"}
                self._ready.set()
                return
            gpus: dict[int, dict[str, Any]] = {}
            for i, h in handles.items():
                g: dict[str, Any] = {"nvlinks": []}
                for link in range(NVLINK_MAX_LINKS):
                    try:
                        if nv.nvmlDeviceGetNvLinkState(h, link):
                            g["nvlinks"].append(link)
                    except Exception:
                        break
                g["nvlink"] = "present" if g["nvlinks"] else "absent"
                try:
                    sup = nv.nvmlGpmQueryDeviceSupport(h)
                    g["gpm"] = bool(sup.isSupportedDevice)
                    g["gpm_why"] = None if g["gpm"] else "GPM not supported on this GPU"
                except Exception as e:
                    g["gpm"], g["gpm_why"] = False, _err(e)
                gpus[i] = g
            self.status = {"available": True, "gpus": {str(i): {k: v for k, v in g.items()} for i, g in gpus.items()}}
            self._ready.set()
            prev_gpm = {i: self._gpm_sample(nv, handles[i]) if gpus[i]["gpm"] else None for i in handles}
            prev_nvl: dict[int, tuple[float, float, float] | None] = {i: self._nvlink(nv, handles[i], gpus[i])
                                                                       for i in handles}
            t0 = time.perf_counter()
            while not self._stop.wait(self.interval_s):
                t = time.perf_counter() - t0
                for i, h in handles.items():
                    s: dict[str, Any] = {"t_s": t, "gpu": i}
                    try:
                        s["util_pct"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                    except Exception as e:
                        s["util_pct"], s["util_error"] = None, _err(e)
                    if prev_gpm[i] is not None:
                        cur = self._gpm_sample(nv, h)
                        s["sm_active_pct"] = self._gpm_sm(nv, prev_gpm[i], cur)
                        try:
                            nv.nvmlGpmSampleFree(prev_gpm[i])
                        except Exception:
                            pass
                        prev_gpm[i] = cur
                    else:
                        s["sm_active_pct"] = None
                    for key, ctr in (("pcie_tx_mbps", 0), ("pcie_rx_mbps", 1)):
                        try:
                            s[key] = nv.nvmlDeviceGetPcieThroughput(h, ctr) / 1e3  # KB/s -> MB/s
                        except Exception as e:
                            s[key], s["pcie_error"] = None, _err(e)
                    cur_nvl = self._nvlink(nv, h, gpus[i])
                    p = prev_nvl[i]
                    if cur_nvl and p and cur_nvl[0] > p[0]:
                        dt = cur_nvl[0] - p[0]
                        s["nvlink_tx_mbps"] = (cur_nvl[1] - p[1]) * 1.024 / dt / 1e3  # KiB -> MB
                        s["nvlink_rx_mbps"] = (cur_nvl[2] - p[2]) * 1.024 / dt / 1e3
                    prev_nvl[i] = cur_nvl
                    self.samples.append(s)
            for smp in prev_gpm.values():
                if smp is not None:
                    try:
                        nv.nvmlGpmSampleFree(smp)
                    except Exception:
                        pass

    @staticmethod
    def _gpm_sample(nv: Any, h: Any) -> Any:
        try:
            return nv.nvmlGpmSampleGet(h, nv.nvmlGpmSampleAlloc())
        except Exception:
            return None

    @staticmethod
    def _gpm_sm(nv: Any, a: Any, b: Any) -> float | None:
        if a is None or b is None:
            return None
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version, mg.numMetrics, mg.sample1, mg.sample2 = nv.NVML_GPM_METRICS_GET_VERSION, 1, a, b
            mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            nv.nvmlGpmMetricsGet(mg)
            return float(mg.metrics[0].value) if mg.metrics[0].nvmlReturn == 0 else None
        except Exception:
            return None

    @staticmethod
    def _nvlink(nv: Any, h: Any, g: dict[str, Any]) -> tuple[float, float, float] | None:
        if not g["nvlinks"]:
            return None
        try:
            vals = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                                   nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX])
            tx, rx = (v.value.ullVal for v in vals)
            return time.perf_counter(), float(tx), float(rx)
        except Exception:
            return None


def _stat(xs: list[float]) -> dict[str, float] | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "p10": quantile(xs, 0.1), "p90": quantile(xs, 0.9), "n": len(xs)}


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Per-GPU medians and p10-p90, and the two flags (module docstring)."""
    st = result.get("status") or {}
    if not st.get("available"):
        return {"available": False, "reason": st.get("reason", "not sampled"), "gpus": {}, "flags": []}
    per: dict[str, Any] = {}
    for gid, g in (st.get("gpus") or {}).items():
        ss = [s for s in result["samples"] if str(s["gpu"]) == gid]
        row = {k: _stat([s.get(k) for s in ss]) for k in
               ("util_pct", "sm_active_pct", "pcie_tx_mbps", "pcie_rx_mbps", "nvlink_tx_mbps", "nvlink_rx_mbps")}
        row["nvlink"] = g["nvlink"]
        row["sm_active_note"] = None if g.get("gpm") else f"SM activity not sampled: {g.get('gpm_why')}"
        per[gid] = row
    flags = []
    for gid, row in per.items():
        u, sm = row["util_pct"], row["sm_active_pct"]
        if u and sm and u["median"] >= UTIL_HIGH_PCT and sm["median"] < SM_LOW_PCT:
            flags.append(f"GPU{gid}: util high ({u['median']:.0f}%) but SM active low ({sm['median']:.0f}%)")
    for kind in ("pcie", "nvlink"):
        tot = {gid: (r[f"{kind}_tx_mbps"]["median"] + (r[f"{kind}_rx_mbps"] or {"median": 0})["median"])
               for gid, r in per.items() if r[f"{kind}_tx_mbps"]}
        if len(tot) >= 2:
            med = statistics.median(tot.values())
            if med >= LINK_BUSY_MBPS:
                for gid, v in tot.items():
                    if v < LINK_UNBALANCED * med:
                        flags.append(f"GPU{gid}: {kind} throughput {v:.0f} MB/s under half the GPUs' median "
                                     f"{med:.0f} MB/s (unbalanced)")
    return {"available": True, "gpus": per, "flags": flags}
