"""What *this* machine measured: copy bandwidth, GEMM rate per dtype, host link.

Labs judge "% of ceiling" against these, not against the datasheet: a kernel at 90% of
the copy bandwidth this card really reaches is done, whatever the brochure says. The
datasheet peak (:mod:`hwlab.core.specs`) is kept beside them to spot a card that is itself
slow (measured copy under ``SLOW_CARD_PCT`` of its datasheet figure).

Ceilings are cached per machine under ``$HWLAB_CACHE`` (default ``~/.cache/hwlab``) as
``ceilings-<machine key>.json`` (host, device name and, on a MIG slice, the slice's uuid: ceilings are
per slice, not per GPU) and re-measured only when asked (``hwlab doctor --remeasure``). On a CPU the
key carries the thread count torch runs with (``torch.get_num_threads()``): a CPU's GEMM and copy
rates scale with its threads, so a ceiling measured with two threads would judge a one-thread run
slow by the threads it lacks; a cache whose recorded ``n_threads`` differs from the run's is not
used (the key already keeps them apart). A machine without a cache and without time to measure can borrow the
kit's recorded H200 ceilings, labelled as such.

Each ceiling keeps the timing it came from (median, p10-p90, repeats, sizes: ``bands``), so a
fresh measurement can be held against the cache: :func:`drift` flags a ceiling whose fresh
value differs from the cached one by more than both runs' spread (:mod:`hwlab.core.spread`'s rule,
with ``DRIFT_TOL_PCT``, 10%, as the tolerance: the size of change that moves a "% of ceiling"
verdict), and says when the change is within spread (borderline) instead.

**bf16 on this machine** (:func:`bf16_support`): a GPU runs bf16 on its tensor cores from compute
capability 8.0 (Ampere); a CPU has a bf16 path where it reports AVX512_BF16 or AMX_BF16
(``/proc/cpuinfo`` flags), and otherwise emulates it, slower than fp32. Advice to move a matmul
to bf16 is checked against what the machine reaches (:func:`bf16_gain`): a native path, and a
bf16 GEMM measured faster than fp32.

On a CPU the probes are timed net of the run-queue wait (:mod:`hwlab.core.hostwait`): a ceiling is
what this CPU reaches while it runs, not how much of a busy host's time it was given (a copy
long enough to be preempted read a fraction of its rate beside other processes, while a short
GEMM did not); each band names its timer.

A fresh measurement is cached only where its own timing is stable (:func:`to_cache`, with
:func:`hwlab.core.spread.unstable`: at least ``MIN_REPEATS`` repeats and a p10-p90 band at most
``NOISY_SPREAD_PCT`` of its median). An unstable ceiling measured the host's load, and every later
"% of ceiling" would be judged against it; the previous cached value is kept in its place (and said
so), and with no previous value nothing is cached, so the next run measures again. A ceiling
measured on a SHARED GPU (:mod:`hwlab.core.gpu_share`: another process ran on it) is treated the same.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


from hwlab.core.measure import InputError, device_name, device_of
from hwlab.core.store import write_json_atomic
from hwlab.core import record_shape, validate
from hwlab.core.store import read_user_json

#: measured copy bandwidth under this % of the datasheet figure flags the card itself
SLOW_CARD_PCT = 80.0
#: a fresh ceiling this far (%) from the cached one, beyond both spreads, is flagged
DRIFT_TOL_PCT = 10.0


@dataclass
class Ceilings:
    device: str
    copy_gbps: float
    gemm_tflops: dict[str, float] = field(default_factory=dict)
    host_link_gbps: float | None = None
    measured_at: str = ""
    source: str = "measured"  # "measured" | "recorded on <device>, <date>" | "spec"
    host: str = ""
    #: per ceiling ("copy", "gemm fp32", ...): t_ms, t_p10_ms, t_p90_ms, n_rep, params
    bands: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: CPU: the torch thread count the ceilings were measured with (None: a GPU, or an older cache)
    n_threads: int | None = None

    def gemm(self, dtype: str) -> float | None:
        return self.gemm_tflops.get(dtype)

    def ridge_point(self, dtype: str = "bf16") -> float | None:
        """FLOP/byte where this machine's measured roofline bends (GEMM rate / copy bandwidth)."""
        r = self.gemm(dtype)
        return None if r is None or not self.copy_gbps else r * 1e12 / (self.copy_gbps * 1e9)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Ceilings":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @property
    def label(self) -> str:
        threads = f", {self.n_threads} thread{'s' if self.n_threads != 1 else ''}" if self.n_threads else ""
        return self.source if self.source != "measured" else (
            f"measured on {self.device}{threads}, {self.measured_at[:10]}")


def cpu_threads() -> int:
    """The threads torch's CPU ops run with now (what a CPU ceiling is keyed by)."""
    import torch

    return int(torch.get_num_threads())


def machine_key(device=None) -> str:
    dev = device_of(device)
    name = device_name(dev) if dev.type == "cuda" else f"cpu-{cpu_threads()}t"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{socket.gethostname()}-{name}{mig_slice_key(dev)}")


def mig_slice_key(dev) -> str:
    """``-<MIG uuid>`` on a MIG slice (``CUDA_VISIBLE_DEVICES`` names it), else "": a slice's ceilings
    are its own, so two slices of one GPU (or of one profile) never share a cache."""
    if dev.type != "cuda":
        return ""
    vis = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    i = dev.index or 0
    return f"-{vis[i]}" if i < len(vis) and vis[i].startswith("MIG-") else ""


#: CPU flags (``/proc/cpuinfo``) of a native bf16 path: AVX-512 BF16 dot products, AMX tiles
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_support(device=None, cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether this device runs bf16 natively, and why (module doc). ``cpuinfo``: the text of
    ``/proc/cpuinfo`` (read when None; unreadable counts as no native path)."""
    dev = device_of(device)
    if dev.type == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(dev)
        ok = major >= 8
        return ok, (f"compute capability {major}.{minor} " + ("(>= 8.0: bf16 tensor cores)" if ok else
                                                            "(< 8.0: no bf16 tensor cores)"))
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
    have = [f for f in CPU_BF16_FLAGS if f in flags]
    if have:
        return True, f"CPU flags {', '.join(have)} (a native bf16 path)"
    return False, (f"no {' / '.join(f.upper() for f in CPU_BF16_FLAGS)} in the CPU flags: bf16 is emulated "
                   "there, slower than fp32")


def bf16_gain(c: "Ceilings | None" = None, device=None, size: int = 256) -> tuple[bool, str]:
    """Whether moving an fp32 matmul to bf16 can help on this machine, and why: the device must run
    bf16 natively (:func:`bf16_support`) and bf16 must be measured faster than fp32. Where ``c``
    holds both GEMM ceilings they decide; else, on a CPU, both GEMMs (``size`` cubed) are timed
    now, back to back, so host load weighs on both alike."""
    ok, why = bf16_support(device)
    if not ok:
        return False, why
    bf, fp = (c.gemm("bf16"), c.gemm("fp32")) if c is not None else (None, None)
    what = "measured GEMM ceiling"
    if (bf is None or fp is None) and device_of(device).type != "cuda":
        from hwlab.core import probes

        fp = probes.gemm(size=size, dtype="fp32", device="cpu", n_rep=5).tflops
        bf = probes.gemm(size=size, dtype="bf16", device="cpu", n_rep=5).tflops
        what = f"{size}^3 GEMM timed now"
    if bf is not None and fp is not None and bf <= fp:
        return False, (f"{why}, but its bf16 {what} ({bf * 1e3:,.4g} GFLOP/s) is not above fp32's "
                       f"({fp * 1e3:,.4g} GFLOP/s)")
    return True, why + (f"; bf16 {what} {bf * 1e3:,.4g} GFLOP/s over fp32's {fp * 1e3:,.4g}"
                        if bf is not None and fp is not None else "")


def cpu_gemm_dtypes(device=None) -> list[str]:
    """The GEMM ceilings a CPU's examination is judged against: fp32 (cached, :func:`measure`), bf16
    where it runs natively, fp64 (measured where asked, :func:`with_cpu_gemms`)."""
    return ["fp32"] + (["bf16"] if bf16_support(device)[0] else []) + ["fp64"]


def with_cpu_gemms(c: "Ceilings", device=None, progress=None) -> tuple["Ceilings", list[str]]:
    """``c`` with the CPU GEMM ceilings of :func:`cpu_gemm_dtypes` it lacks measured now at the quick
    size, net of the run-queue wait, and said so in its source; not cached (the cache keeps what
    ``hwlab doctor`` measures, under its stability rule). Returns
    the ceilings and the dtypes measured now. A GPU's ceilings come back unchanged."""
    from hwlab.core import probes

    dev = device_of(device)
    missing = [d for d in cpu_gemm_dtypes(dev) if c.gemm(d) is None] if dev.type != "cuda" else []
    if not missing:
        return c, []
    out = Ceilings.from_dict(c.to_dict())
    out.gemm_tflops, out.bands = dict(c.gemm_tflops), dict(c.bands)
    for dt in missing:
        if progress:
            progress(f"gemm {dt}")
        m = probes.gemm(size=256, dtype=dt, device=dev, n_rep=10, net_of_wait=True)
        out.gemm_tflops[dt] = m.tflops
        out.bands[f"gemm {dt}"] = {"t_ms": m.t_ms, "t_p10_ms": m.t_p10_ms, "t_p90_ms": m.t_p90_ms,
                                   "n_rep": m.n_rep, "timer": m.timer, "params": m.params}
    out.source = f"{c.label}; {', '.join(missing)} GEMM measured now (not in the cache)"
    return out, missing


def cache_dir() -> Path:
    return Path(os.environ.get("HWLAB_CACHE", Path.home() / ".cache" / "hwlab"))


def cache_path(device=None) -> Path:
    return cache_dir() / f"ceilings-{machine_key(device)}.json"


def measure(device=None, quick: bool = False, progress=None) -> Ceilings:
    """Run the ceiling probes now. ``quick`` uses small sizes (seconds, less accurate)."""
    from hwlab.core import probes

    dev = device_of(device)
    gpu = dev.type == "cuda"
    steps: list[tuple[str, Any]] = [
        ("copy", lambda: probes.hbm_copy(size_mib=(256 if quick else 2048) if gpu else
                                         (64 if quick else 256), device=dev,
                                         impl="torch", n_rep=20 if quick else 50, net_of_wait=not gpu)),
    ]
    dtypes = ["fp32", "tf32", "bf16"] + (["fp8"] if gpu and probes.fp8_supported(dev) else [])
    if not gpu:  # a CPU caches its fp32 GEMM; bf16 and fp64 are measured where asked (with_cpu_gemms)
        dtypes = ["fp32"]
    for dt in dtypes:
        size = (4096 if quick else 8192) if gpu else (256 if quick else 512)
        steps.append((f"gemm {dt}", lambda dt=dt, size=size: probes.gemm(
            size=size, dtype=dt, device=dev, n_rep=10 if quick else 30, net_of_wait=not gpu)))
    if gpu:
        steps.append(("host link", lambda: probes.host_link(size_mib=64 if quick else 256,
                                                           device=dev, n_rep=10)))
    results = {}
    for label, step in steps:
        if progress:
            progress(label)
        results[label] = step()
    return Ceilings(
        device=device_name(dev), copy_gbps=results["copy"].gbps,
        gemm_tflops={k.split()[1]: v.tflops for k, v in results.items() if k.startswith("gemm")},
        host_link_gbps=results["host link"].gbps if "host link" in results else None,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        host=socket.gethostname(), n_threads=None if gpu else cpu_threads(),
        bands={k: {"t_ms": m.t_ms, "t_p10_ms": m.t_p10_ms, "t_p90_ms": m.t_p90_ms, "n_rep": m.n_rep,
                   "timer": m.timer,
                   "params": m.params, **({"gpu_share": m.gpu_share} if m.gpu_share else {})}
               for k, m in results.items()})


def drift(cached: Ceilings, fresh: Ceilings) -> list[str]:
    """One line per ceiling whose fresh measurement differs from the cached one by more than
    ``DRIFT_TOL_PCT``: beyond both runs' p10-p90 (flagged: the cache is not today's), or within
    spread (borderline). Ceilings measured at other sizes, or cached without their timing
    (an older cache), are said to be not comparable when their values differ that much."""
    from hwlab.core.spread import BEYOND, OK, Band, judge_rise

    out = []
    for key, f in fresh.bands.items():
        c = cached.bands.get(key)
        if c is None or c.get("params") != f.get("params"):
            old = cached.copy_gbps if key == "copy" else cached.gemm_tflops.get(key.split()[-1]) \
                if key.startswith("gemm") else cached.host_link_gbps if key == "host link" else None
            new = fresh.copy_gbps if key == "copy" else fresh.gemm_tflops.get(key.split()[-1]) \
                if key.startswith("gemm") else fresh.host_link_gbps if key == "host link" else None
            if old and new and abs(new / old - 1) * 100 > DRIFT_TOL_PCT:
                why = "without its timing (an older cache)" if c is None else "at other sizes"
                out.append(f"{key}: cached {old:,.4g} vs fresh {new:,.4g}, the cache was measured {why}: "
                           "not comparable; the fresh figure is the one in use")
            continue
        cb = Band(c["t_ms"], c["t_p10_ms"], c["t_p90_ms"], c["n_rep"])
        fb = Band(f["t_ms"], f["t_p10_ms"], f["t_p90_ms"], f["n_rep"])
        # a slower or a faster fresh run: judge the rise of the slower one over the faster
        j = judge_rise(cb, fb, DRIFT_TOL_PCT) if fb.median >= cb.median else judge_rise(fb, cb, DRIFT_TOL_PCT)
        if j.status == OK:
            continue
        ratio = cb.median / fb.median  # a rate's fresh / cached
        head = "CACHE NOT TODAY'S" if j.status == BEYOND else "differs"
        out.append(f"{key}: {head}: fresh rate {ratio:.3g}x the cached one (time {fb.text()} vs cached "
                   f"{cb.text()}); {j.reason}")
    return out


def value_of(c: Ceilings, key: str) -> float | None:
    """The ceiling named by a ``bands`` key ("copy", "gemm fp32", "host link")."""
    if key == "copy":
        return c.copy_gbps
    if key.startswith("gemm"):
        return c.gemm_tflops.get(key.split()[-1])
    return c.host_link_gbps if key == "host link" else None


def _set_value(c: Ceilings, key: str, v: float) -> None:
    if key == "copy":
        c.copy_gbps = v
    elif key.startswith("gemm"):
        c.gemm_tflops[key.split()[-1]] = v
    elif key == "host link":
        c.host_link_gbps = v


def to_cache(fresh: Ceilings, previous: Ceilings | None) -> tuple[Ceilings, bool, list[dict[str, Any]]]:
    """The ceilings to use and cache after a measurement (module doc): ``(ceilings, cacheable,
    kept)``. Each fresh ceiling whose own band is unstable is replaced by ``previous``'s value and
    band where it has one; ``kept`` lists each unstable ceiling (``ceiling``, ``fresh``, ``kept``:
    the value in use, None when no previous value existed, ``why``). ``cacheable`` is False when an
    unstable ceiling had no previous value to keep: then nothing may be cached."""
    from hwlab.core.spread import Band, unstable

    out = Ceilings.from_dict(fresh.to_dict())
    kept: list[dict[str, Any]] = []
    cacheable = True
    for key, b in fresh.bands.items():
        why = unstable(Band(b["t_ms"], b["t_p10_ms"], b["t_p90_ms"], b["n_rep"]))
        if why is None and (b.get("gpu_share") or {}).get("shared"):  # measured beside another process
            why = "measured on a SHARED GPU: " + ", ".join(f"pid {o['pid']}" for o in b["gpu_share"]["others"])
        if why is None:
            continue
        old = value_of(previous, key) if previous is not None else None
        if old is None:
            cacheable = False
        else:
            _set_value(out, key, old)
            if key in previous.bands:
                out.bands[key] = previous.bands[key]
            else:
                out.bands.pop(key, None)
        kept.append({"ceiling": key, "fresh": value_of(fresh, key), "kept": old, "why": why,
                     "kept_measured_at": previous.measured_at if old is not None else None})
    return out, cacheable, kept


def kept_lines(kept: list[dict[str, Any]]) -> list[str]:
    """One line per unstable fresh ceiling (:func:`to_cache`): what was measured, why it is not
    cached, and which value is in use."""
    out = []
    for k in kept:
        head = f"{k['ceiling']}: fresh {k['fresh']:,.4g} NOT cached, unstable ({k['why']})"
        out.append(head + (f"; kept the previous {k['kept']:,.4g} (measured {str(k['kept_measured_at'])[:16]})"
                           if k["kept"] is not None else "; no previous value to keep: nothing cached, "
                           "the next run measures again"))
    return out


def save(c: Ceilings, device=None, *, overwrite: bool = False) -> Path:
    return write_json_atomic(cache_path(device), c.to_dict(), overwrite=overwrite)


def load_cached(device=None) -> Ceilings | None:
    p = cache_path(device)
    if not p.exists():
        return None
    fix = "delete the file or run `hwlab doctor --remeasure`"
    d = read_user_json(p, "cached ceilings", fix, error=InputError)  # a regular file, bounded size
    try:
        if not isinstance(d, dict):
            raise TypeError(f"a JSON {type(d).__name__}, not an object")
        record_shape.check_ceilings_cache(d)  # every field's type, as a record's ceilings are checked
        validate.ceilings(d)  # finite, > 0, at most the datasheet peak: a corrupt cache is never used
        c = Ceilings.from_dict(d)
    except (TypeError, validate.NumberError, record_shape.ShapeError) as e:
        raise InputError(f"cached ceilings {p} are unreadable or corrupt ({e}); {fix}") from None
    if device_of(device).type != "cuda" and c.n_threads is not None and c.n_threads != cpu_threads():
        return None  # measured with another thread count: not this run's ceilings (module doc)
    return c


def get(device=None, *, remeasure: bool = False, quick: bool = False, progress=None) -> Ceilings:
    """Cached ceilings for this machine, measuring (and caching) them when absent. An unstable
    fresh ceiling is never cached (:func:`to_cache`); its ``source`` then says so."""
    try:
        previous = load_cached(device)
    except InputError:
        if not remeasure:
            raise
        previous = None  # an unreadable cache is replaced: re-measuring is the remedy it names
    if not remeasure and previous is not None:
        return previous
    fresh = measure(device, quick=quick, progress=progress)
    c, cacheable, kept = to_cache(fresh, previous)
    if cacheable:
        save(c, device, overwrite=True)  # a cache: re-measuring is the explicit request
    if kept:
        c.source = f"measured on {c.device}, {c.measured_at[:10]}; " + "; ".join(kept_lines(kept))
    return c


def recorded(device: str = "h200") -> Ceilings:
    """The ceilings measured in the kit's recorded doctor run, labelled as recorded."""
    from hwlab.core.evidence import recorded as rec

    ev = rec("doctor", device)
    c = Ceilings.from_dict(ev.ceilings)
    c.source = ev.label
    return c


def datasheet_check(c: Ceilings) -> str | None:
    """A warning when measured copy bandwidth is under SLOW_CARD_PCT of the datasheet."""
    from hwlab.core.specs import try_lookup

    spec = try_lookup(c.device)
    if spec is None:  # a CPU, or a GPU without a datasheet entry: nothing to compare against
        return None
    pct = 100.0 * c.copy_gbps / spec.hbm_gbps
    if pct < SLOW_CARD_PCT:
        return (f"measured copy {c.copy_gbps:,.0f} GB/s is {pct:.0f}% of the {spec.name} "
                f"datasheet {spec.hbm_gbps:,.0f} GB/s (< {SLOW_CARD_PCT:.0f}%): check clocks, "
                "ECC and other tenants before blaming kernels")
    return None
