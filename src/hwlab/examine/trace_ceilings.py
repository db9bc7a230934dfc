"""The ceilings and the cache a trace's floors and wasted-traffic bound use, and what they are
(``hwlab examine --trace``, :mod:`hwlab.examine.from_trace`'s module doc): a node record given with
``--baseline`` (measured), else the datasheet of the trace's GPU (a peak, said so), else none; the
recording machine's cache from an examine record or the kit's key in its own trace, never this
machine's."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwlab.core import specs
from hwlab.core.profiling import KIT_CACHE_BYTES_KEY
from hwlab.errors import UserInputError
from hwlab.traces.trace_ops import OpTrace


@dataclass
class TraceCeilings:
    """The ceilings a trace's floors use, and what they are."""
    copy_gbps: float | None
    gemm_tflops: dict[str, float]
    source: str  # "measured" | "datasheet" | "none"
    label: str
    #: the recording machine's last-level cache (bytes) for the wasted-traffic bound, and where it came from
    cache_bytes: int | None = None
    cache_source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"copy_gbps": self.copy_gbps, "gemm_tflops": self.gemm_tflops, "source": self.source,
                "label": self.label, "cache_bytes": self.cache_bytes, "cache_source": self.cache_source or None}


def _cache_of(ot: OpTrace, record: Any) -> tuple[int | None, str]:
    """The recording machine's last-level cache: an examine record's (``counts.cache_bytes``, the
    cache its live walk used) given with ``--baseline``, else the one ``hwlab examine`` wrote into its
    own trace (:data:`~hwlab.core.profiling.KIT_CACHE_BYTES_KEY`), else unknown. Never this machine's:
    the trace may come from any machine, and the bound is only as true as the cache it assumes."""
    counts = record.get("counts") if isinstance(record, dict) else None
    for v, src in (((counts or {}).get("cache_bytes") if isinstance(counts, dict) else None,
                    "the --baseline examine record's cache"),
                   (ot.meta.get(KIT_CACHE_BYTES_KEY), "the cache hwlab examine wrote into this trace")):
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2 ** 48:
            return v, src
    return None, ""


def ceilings_for(ot: OpTrace, baseline: str | None) -> TraceCeilings:
    """--baseline's measured ceilings, else the datasheet of the trace's GPU, else none (module doc)."""
    if baseline:
        c, record = _baseline_ceilings(baseline)
        c.cache_bytes, c.cache_source = _cache_of(ot, record)
        return c
    c = _trace_ceilings(ot)
    c.cache_bytes, c.cache_source = _cache_of(ot, None)
    return c


def _trace_ceilings(ot: OpTrace) -> TraceCeilings:
    names = [str(d.get("name")) for d in ot.devices if d.get("name")]
    if ot.on_gpu and names:
        spec = specs.try_lookup(names[0])
        how = ""
        if spec is None:  # a bare vendor name (ROCm's 'AMD Radeon Graphics'): by compute units and memory
            d0 = next(d for d in ot.devices if d.get("name"))
            spec = specs.lookup_by_props(names[0], d0.get("numSms"), d0.get("totalGlobalMem"))
            how = f", matched by its {d0.get('numSms')} compute units and memory" if spec else ""
        if spec is not None:
            gemm = {k: v for k in ("fp32", "tf32", "bf16", "fp16", "fp8") if (v := spec.peak_tflops(k))}
            return TraceCeilings(spec.hbm_gbps, gemm, "datasheet",
                                 f"datasheet peaks of the {spec.name} (the trace's deviceProperties name "
                                 f"{names[0]!r}{how}; not measured: floors are lower and gains upper bounds; "
                                 "pass --baseline with the node's measured record for measured ceilings)")
        return TraceCeilings(None, {}, "none", f"no datasheet entry for {names[0]!r} and no --baseline: "
                             "parts get shares but no floors (pass --baseline with this node's doctor or "
                             "baseline record)")
    what = ("the trace names no device" if ot.on_gpu else "no device kernels in the trace (host op times): no "
            "datasheet applies" if ot.launches or names else "a CPU trace has no datasheet")
    return TraceCeilings(None, {}, "none", what +
                         ": parts get shares but no floors (pass --baseline with the recording machine's "
                         "doctor, baseline or examine record)")


def _baseline_ceilings(path: str) -> tuple[TraceCeilings, Any]:
    from hwlab.core.store import read_user_json

    d = read_user_json(Path(path), "--baseline record", "pass a doctor, baseline or examine JSON "
                       "(hwlab doctor --out / hwlab baseline record / hwlab examine --out)")
    c = d.get("ceilings") if isinstance(d, dict) else None
    copy, gemm = None, {}
    if isinstance(c, dict) and _pos(c.get("copy_gbps")):
        copy = float(c["copy_gbps"])
        gemm = {k: float(v) for k, v in (c.get("gemm_tflops") or {}).items() if _pos(v)}
    elif isinstance(d, dict) and isinstance(d.get("results"), list):  # a baseline: its probes
        for r in d["results"]:
            if not isinstance(r, dict) or not _pos(r.get("t_ms")):
                continue
            name = str(r.get("name", ""))
            if name.startswith("hbm_copy") and _pos(r.get("n_bytes")):
                copy = r["n_bytes"] / (r["t_ms"] * 1e6)
            elif name.startswith("gemm[") and _pos(r.get("n_flops")):
                gemm[name[5:].split("]")[0]] = r["n_flops"] / (r["t_ms"] * 1e9)
    if copy is None:
        raise UserInputError(f"--baseline {path}: no measured copy ceiling in it (no 'ceilings.copy_gbps', no "
                             "hbm_copy probe): pass a doctor, baseline or examine record")
    dev = (d.get("machine") or {}).get("device") if isinstance(d.get("machine"), dict) else None
    dev = dev or (c or {}).get("device") or "?"
    return TraceCeilings(copy, gemm, "measured", f"measured on {dev} (from --baseline {Path(path).name})"), d


def _pos(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
