"""Run a drill's scenario now and measure every flowchart answer (the runs behind hwlab.course.drills).

A drill names a *scenario* (a workload from the labs) and a *case* (the faulty or the fixed
configuration); :func:`observe` runs that configuration on this machine and returns the
flowchart evidence the run produced, nothing else: it is never told which fault a drill
holds, so no observation can be derived from a fault's name or leaf.

Every evidence dict answers the chart's questions from measurements:

* B ``slowdown_vs_floor`` (and F/H's metrics): the workload's kernel alone against this
  machine's measured floor, from the lab's own probe;
* D ``e2e_slowdown``: the workload run as one process serves it (back-to-back calls timed as
  one step) over what the kernel's own median predicts (:func:`scenarios.one_gpu_service`);
* K ``rank_tail_pct`` with ``n_ranks``: from the per-step times of the process's ranks.

Two scenarios from the seed's checklist:

* ``syncpoint``: a step of GPU work followed by the host's own per-step work, with (``item``) and
  without (``async``) a per-step ``.item()``. With the sync the host waits for the GPU and the
  GPU then idles through the host's work: the launch gap and the host's step time show it.
  The host work is a timed busy loop (a stand-in for logging or scheduling, said so in the
  evidence) of :data:`SYNC_HOST_OVER_GPU` times the kernels' own time: the sync's idle time is
  then the larger part of the step (the chart's launch-gap line is 50%), and without the sync
  the host's work hides under the queued kernels up to that same factor (within B's 1.5x).
* ``badcard``: the node's bad card. The kernels are measured live (Lab 1's fused chain: a
  healthy kernel); the card's state is an NVML snapshot compared with the node's recorded
  baseline (``recorded/h200/baseline.json``): new throttle reasons, uncorrected ECC errors and
  pending row remaps. A lent card is healthy, so the faulty case's snapshot is *constructed*
  from this card's real one with those fields set, and labelled so; the fixed case (the
  healthy card swapped in) is the real snapshot.

Where runs happen: ``chain`` (Lab 1), ``dtype`` and ``workload`` (scenarios) and ``fp8``
(Lab 4's decoder) run on a CPU at small sizes as well as on a GPU; ``tile``, ``launch``,
``syncpoint`` and ``badcard`` need a GPU (a Triton GEMM's speed, CUDA graphs, device queues, NVML); ``slowlink`` needs several ranks behind a
shaped link (root, network namespaces), so it always comes from its recorded CPU run. A
machine that cannot run a scenario reads it from the kit's recorded drill runs
(``recorded/h200/drills.json``, field ``runs``: each (scenario, case) measured on the H200).
"""
from __future__ import annotations

from typing import Any, Callable

from hwlab.core.ceilings import get as get_ceilings
from hwlab.core.evidence import EvidenceError, recorded
from hwlab.core.measure import device_name, device_of, time_fn
from hwlab.core.probes import hbm_copy

# torch, its profiler and the labs (Triton kernels) are imported by the live runs that use them:
# a recorded run (a drill graded on a machine that cannot run it live) is read without them

#: the by-hand answers a lab's evidence may still carry: dropped, the run measures them
BY_HAND_KEYS = ("single_gpu_slow", "multi_gpu_or_service_slow", "rank_tail")

CPU_OK = ("chain", "dtype", "workload", "fp8")
GPU_ONLY = ("tile", "launch", "syncpoint", "badcard")
RECORDED_ONLY = ("slowlink",)


def can_run_live(scenario: str, device=None) -> bool:
    """Whether this machine can run ``scenario`` now (see the module docstring)."""
    if scenario in RECORDED_ONLY:
        return False
    return scenario in CPU_OK or device_of(device).type == "cuda"


def _measured_only(ev: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ev.items() if k not in BY_HAND_KEYS and v is not None}


def _copy_gbps(dev) -> float:
    return hbm_copy(size_mib=1024 if dev.type == "cuda" else 16, device=dev, impl="torch").gbps


def _chain(case: str, dev) -> dict[str, Any]:
    import torch

    from hwlab.labs import bandwidth, scenarios

    n_rows, n_cols = bandwidth.default_size(dev)
    dtype = torch.float16
    copy = _copy_gbps(dev)
    r = bandwidth.run(n_rows, n_cols, dtype, device=dev, ceiling_gbps=copy, cases=(case,))
    m = r.measurements[case]
    if case in ("unfused", "fused"):
        fn = bandwidth.unfused_chain if case == "unfused" else bandwidth.fused_chain

        def make():
            return bandwidth.make_chain_inputs(n_rows, n_cols, dtype, dev)
    else:
        def fn(x, L=case):
            return bandwidth.scale_layout(x, 0.5, L)

        def make():
            return (torch.randn(n_rows, n_cols, device=dev, dtype=dtype),)
    ev = _measured_only(r.evidence[case])
    ev.update(_service(fn, make, m.t_ms, dev))
    ev["metric_sources"] = {
        "slowdown_vs_floor": f"{m.name} alone vs its required bytes at the copy ceiling measured in this run",
        "dram_pct_estimated": f"{m.name}: bytes moved (traffic model) over time, vs the measured copy ceiling",
        "sector_amplification": "Nsight Compute counters where recorded, else the layout's access model",
        **scenarios.SERVICE_SOURCE}
    return ev


def _service(fn, make, kernel_ms: float, dev) -> dict[str, Any]:
    from hwlab.labs import scenarios

    svc = scenarios.one_gpu_service(fn, make, kernel_ms, dev)
    return {k: svc[k] for k in ("e2e_slowdown", "rank_tail_pct", "n_ranks")}


def _tile(case: str, dev) -> dict[str, Any]:
    import torch

    from hwlab.labs import registers, scenarios

    cfg = next(c for c in registers.SWEEP if c.label == case)
    cublas = registers.cublas_bf16(device=dev)
    r = registers.sweep([cfg], ceiling_tflops=cublas.tflops, device=dev)[0]
    if r.measurement is None:
        raise RuntimeError(f"tile {case} did not run: {r.report.skipped}")
    size = 8192
    ev = _measured_only(registers.config_evidence(r, _copy_gbps(dev)))

    def make():
        return (torch.randn(size, size, device=dev, dtype=torch.bfloat16),
                torch.randn(size, size, device=dev, dtype=torch.bfloat16))
    ev.update(_service(lambda a, b: registers.matmul(a, b, cfg)[0], make, r.measurement.t_ms, dev))
    ev["metric_sources"] = {
        "slowdown_vs_floor": f"triton {cfg.label} alone vs cuBLAS bf16 measured in this run",
        "tensor_pct_of_peak": "TFLOP/s over cuBLAS bf16 in this run",
        "n_spills": "the compiled kernel's spill count (Triton runtime report)",
        **scenarios.SERVICE_SOURCE}
    return ev


def _kernel_busy_ms(step: Callable[[], Any]) -> float:
    """Device time of one step's kernels (sum of kernel durations, torch.profiler): the floor
    of a launch-bound step, what it would take with no gap between launches."""
    import torch
    from torch.profiler import ProfilerActivity

    from hwlab.core.profiling import quiet_profile

    step()
    torch.cuda.synchronize()
    with quiet_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    us = sum(e.time_range.elapsed_us() for e in prof.events()
             if "CUDA" in str(getattr(e.device_type, "name", e.device_type)))
    if us <= 0:
        raise RuntimeError("torch.profiler recorded no kernel time for the step: cannot set its floor")
    return us / 1e3


def _launch(case: str, dev) -> dict[str, Any]:
    import torch

    from hwlab.core.measure_graph import capture_graph
    from hwlab.labs import registers, scenarios

    n_layers, hidden = 64, 4096
    weights = [torch.randn(2, hidden, device=dev) for _ in range(n_layers)]
    x = torch.randn(hidden, device=dev)
    if case == "eager":
        def step():
            return registers.decode_like_step(x, weights)
    else:  # the fix: the same kernels captured once in a CUDA graph and replayed
        step = capture_graph(lambda: registers.decode_like_step(x, weights), dev).replay
    busy_ms = _kernel_busy_ms(lambda: registers.decode_like_step(x, weights))
    t = time_fn(step, [()], dev, n_warmup=5, n_rep=50)
    n_bytes = 3 * n_layers * 2 * hidden * 4  # each of the 3 kernels per layer reads and writes the hidden vector
    ev = {"slowdown_vs_floor": t.median_ms / busy_ms,
          "dram_pct_estimated": 100.0 * n_bytes / (t.median_ms * 1e-3) / 1e9 / _copy_gbps(dev),
          "launch_gap_pct": max(0.0, 100.0 * (1 - busy_ms / t.median_ms)),
          "kernel_busy_ms": busy_ms, "step_ms": t.median_ms}
    ev.update(_service(step, lambda: (), t.median_ms, dev))
    ev["metric_sources"] = {
        "slowdown_vs_floor": f"{case} step (median of {len(t.samples_ms)}) over its kernels' device time "
                             "(torch.profiler, same run)",
        "launch_gap_pct": "1 - kernels' device time / step time, both measured in this run",
        "dram_pct_estimated": "the step's bytes over its time, vs the copy ceiling measured in this run",
        **scenarios.SERVICE_SOURCE}
    return ev


#: the host's own per-step work in the sync-point drill, over the step's kernel time (module doc)
SYNC_HOST_OVER_GPU = 1.2


def _syncpoint(case: str, dev) -> dict[str, Any]:
    """A step of bf16 GEMMs, a per-step ``.item()`` (``item``) or none (``async``), then the
    host's own work (module doc); B, the launch gap and D/K measured, the host's step time beside."""
    import torch

    from hwlab.labs import scenarios

    import time
    size, n_mm = (4096, 8) if dev.type == "cuda" else (128, 4)
    g = torch.Generator(device="cpu").manual_seed(0)
    x0 = torch.randn(size, size, generator=g).to(dev, torch.bfloat16)
    ws = [(torch.randn(size, size, generator=g) / size ** 0.5).to(dev, torch.bfloat16) for _ in range(n_mm)]

    def gpu_work():
        y = x0
        for w in ws:
            y = torch.tanh(y @ w)
        return y

    ref = gpu_work().float()
    if not torch.isfinite(ref).all() or ref.abs().max() == 0:
        raise RuntimeError("sync-point workload produced non-finite or all-zero output")
    busy_ms = _kernel_busy_ms(gpu_work)
    host_s = SYNC_HOST_OVER_GPU * busy_ms / 1e3

    def host_work():
        end = time.perf_counter() + host_s
        while time.perf_counter() < end:
            pass

    def step():
        y = gpu_work()
        if case == "item":
            y[0, 0].item()  # the new sync point: the host waits for the step's kernels
        host_work()
        return y

    t = time_fn(step, [()], dev, n_warmup=5, n_rep=40)
    host = []
    for _ in range(20):
        h0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - h0) * 1e3)
    torch.cuda.synchronize(dev)
    n_bytes = n_mm * 3 * size * size * 2
    ev = {"slowdown_vs_floor": t.median_ms / busy_ms,
          "dram_pct_estimated": 100.0 * n_bytes / (t.median_ms * 1e-3) / 1e9 / _copy_gbps(dev),
          "launch_gap_pct": max(0.0, 100.0 * (1 - busy_ms / t.median_ms)),
          "kernel_busy_ms": busy_ms, "step_ms": t.median_ms,
          "host_step_ms": sorted(host)[len(host) // 2], "host_work_ms": host_s * 1e3,
          "n_kernels_per_step": 2 * n_mm,
          "metric_spreads": {"slowdown_vs_floor": {"lo": t.p10_ms / busy_ms, "hi": t.p90_ms / busy_ms,
                                                   "what": f"p10-p90 over {len(t.samples_ms)} steps", "n": len(t.samples_ms)}}}
    ev.update(_service(step, lambda: (), t.median_ms, dev))
    ev["metric_sources"] = {
        "slowdown_vs_floor": f"step (median of {len(t.samples_ms)}, device events) over its kernels' device "
                             "time (torch.profiler, same run)",
        "launch_gap_pct": "1 - kernels' device time / step time, both measured in this run",
        "dram_pct_estimated": "the GEMMs' operand bytes over the step time, vs the copy ceiling measured in this run",
        "host_step_ms": "host wall time per step (perf_counter, median of 20): with a sync it waits for the GPU",
        "host_work_ms": f"the host's own per-step work: a timed busy loop of {SYNC_HOST_OVER_GPU}x the kernels' "
                        "time standing in for logging / scheduling (constructed load, not a measurement)",
        **scenarios.SERVICE_SOURCE}
    return ev


#: the NVML fields a bad card shows, set on a real snapshot for the constructed faulty case
BAD_CARD_FIELDS = {"clock_event_reasons": ["hw_slowdown", "sw_thermal_slowdown"],
                   "ecc_uncorrected_added": 2, "remapped_rows_pending": 1}


def card_state_vs_baseline(gpu: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The hardware signs of a bad card in one GPU's NVML state against the node's baseline
    state of the same card: throttle reasons not in the baseline (the power cap excepted:
    :data:`hwlab.core.system.BAD_CARD_REASONS`), uncorrected ECC errors added, pending or failed row remaps."""
    from hwlab.core.system import BAD_CARD_REASONS
    r0 = set(base.get("clock_event_reasons") or []) if isinstance(base.get("clock_event_reasons"), list) else set()
    r1 = set(gpu.get("clock_event_reasons") or []) if isinstance(gpu.get("clock_event_reasons"), list) else set()
    new_thr = sorted((r1 - r0) & BAD_CARD_REASONS)
    e0 = (base.get("ecc_errors_volatile") or {}).get("uncorrected", 0) if isinstance(base.get("ecc_errors_volatile"), dict) else 0
    e1 = (gpu.get("ecc_errors_volatile") or {}).get("uncorrected", 0) if isinstance(gpu.get("ecc_errors_volatile"), dict) else 0
    rr = gpu.get("remapped_rows") if isinstance(gpu.get("remapped_rows"), dict) else {}
    remap = int(rr.get("pending") or 0) + int(rr.get("failure") or 0)
    ecc_new = max(0, int(e1) - int(e0))
    return {"throttle_reasons_new": len(new_thr), "throttle_reasons": new_thr, "ecc_uncorrected_new": ecc_new,
            "power_capped": int("sw_power_cap" in r1),
            "remapped_rows_pending": remap,
            "hw_deviations_vs_baseline": int(bool(new_thr)) + int(ecc_new > 0) + int(remap > 0)}


def constructed_bad_card(gpu: dict[str, Any]) -> dict[str, Any]:
    """A real GPU state with :data:`BAD_CARD_FIELDS` set (throttle reasons, ECC, row remap)."""
    import copy
    g = copy.deepcopy(gpu)
    g["clock_event_reasons"] = list(BAD_CARD_FIELDS["clock_event_reasons"])
    ecc = dict(g.get("ecc_errors_volatile") or {}) if isinstance(g.get("ecc_errors_volatile"), dict) else {}
    ecc["uncorrected"] = int(ecc.get("uncorrected", 0)) + BAD_CARD_FIELDS["ecc_uncorrected_added"]
    g["ecc_errors_volatile"] = ecc
    rr = dict(g.get("remapped_rows") or {}) if isinstance(g.get("remapped_rows"), dict) else {}
    rr["pending"] = BAD_CARD_FIELDS["remapped_rows_pending"]
    g["remapped_rows"] = rr
    g["constructed"] = "from this card's real NVML snapshot with throttle reasons, ECC errors and a pending row remap set"
    return g


def rederive_card_state(ev: dict[str, Any]) -> dict[str, Any]:
    """A recorded bad-card observation re-read through :func:`card_state_vs_baseline` from the
    NVML state it holds (``nvml_state``) and the node's recorded baseline: no new measurement."""
    base = ((recorded("baseline").snapshot or {}).get("gpus") or [{}])[0]
    out = dict(ev)
    out.update({k: v for k, v in card_state_vs_baseline(ev["nvml_state"], base).items() if not isinstance(v, list)})
    out["metric_sources"] = {**(ev.get("metric_sources") or {}), "power_capped": POWER_CAP_SOURCE}
    return out


#: what ``power_capped`` is: read, and beside the bad-card signs, never one of them
POWER_CAP_SOURCE = ("the card's NVML clock-event reasons include sw_power_cap: at its power limit under load, "
                    "normal for a healthy card, so not counted in hw_deviations_vs_baseline")


def _badcard(case: str, dev) -> dict[str, Any]:
    """Kernels measured live (Lab 1's fused chain) and the card's NVML state against the node's
    recorded baseline; ``throttled``: the state constructed from the real one (module doc)."""
    from hwlab.core.system import snapshot
    snap = snapshot()
    gpus = snap.get("gpus") or []
    if not gpus:
        raise RuntimeError(f"NVML gives no GPU state here ({snap.get('nvml')}): the bad-card drill needs it")
    idx = dev.index or 0
    real = gpus[idx]
    base_ev = recorded("baseline")
    base = ((base_ev.snapshot or {}).get("gpus") or [{}])[0]
    state = constructed_bad_card(real) if case == "throttled" else real
    ev = _chain("fused", dev)
    cmp_ = card_state_vs_baseline(state, base)
    ev.update({k: v for k, v in cmp_.items() if not isinstance(v, list)})
    ev.update({"sm_clock_mhz": real.get("sm_clock_mhz"), "temperature_c": real.get("temperature_c")})
    srcs = ev["metric_sources"]
    how = ("CONSTRUCTED: this card's real NVML snapshot with throttle reasons, ECC errors and a pending row "
           "remap set (a lent card is healthy), against" if case == "throttled" else
           "this card's real NVML snapshot, against")
    for k in cmp_:
        if not isinstance(cmp_[k], list):
            srcs[k] = f"{how} the node's recorded baseline ({base_ev.label})"
    srcs["power_capped"] = POWER_CAP_SOURCE
    srcs["sm_clock_mhz"] = srcs["temperature_c"] = "this card's real NVML snapshot, read before this drill's kernels ran"
    ev["nvml_state"] = {k: state.get(k) for k in ("name", "clock_event_reasons", "ecc_errors_volatile",
                                                  "remapped_rows", "sm_clock_mhz", "temperature_c", "constructed")
                        if k in state}
    return {k: v for k, v in ev.items() if v is not None}


def _dtype(case: str, dev) -> dict[str, Any]:
    from hwlab.labs import scenarios

    d = scenarios.dtype_path(device=dev, copy_gbps=_copy_gbps(dev), cases=(case,))
    return d["flowchart_evidence"][case]


def _workload(case: str, dev) -> dict[str, Any]:
    from hwlab.labs import scenarios

    w = scenarios.workload_mix(device=dev, ceilings=get_ceilings(dev, quick=True))
    return w["flowchart_evidence"][case]


def _fp8(case: str, dev) -> dict[str, Any]:
    """Lab 4's decoder on the ``case`` path (``mixed``: the seed's fallback; ``fixed``) serving
    one context bucket's stream (4k context on a GPU, where KV bytes matter; the tiny stream
    on a CPU); evidence from Lab 4's own :func:`fp8.flowchart_evidence` (B, D, K measured)."""
    from hwlab.labs import fp8

    spec = fp8.default_streams(dev)[1 if dev.type == "cuda" else 0]
    res = fp8.run_stream(streams=[spec], paths=(case,), device=dev)
    fe = fp8.flowchart_evidence(res, _copy_gbps(dev))
    return _measured_only(fe[f"{case} ctx {spec.ctx} x{spec.max_batch}"])


def _slowlink(case: str) -> tuple[dict[str, Any], str]:
    ev = recorded("lab03_slowlink", "cpu")
    return dict(ev.extra["experiment"][case]["flowchart_evidence"]), ev.label


LIVE: dict[str, Callable[[str, torch.device], dict[str, Any]]] = {
    "chain": _chain, "tile": _tile, "launch": _launch, "dtype": _dtype, "workload": _workload, "fp8": _fp8,
    "syncpoint": _syncpoint, "badcard": _badcard}


def live_label(dev) -> str:
    kind = "GPU" if dev.type == "cuda" else "CPU at small sizes (not GPU speed)"
    return f"measured live on {device_name(dev)}, {kind}"


def observe(scenario: str, case: str, *, live: bool = True, device=None) -> tuple[dict[str, Any], str]:
    """Flowchart evidence of ``case`` of ``scenario`` and where it came from.

    ``live`` and this machine can run it: run it now. Otherwise: the kit's recorded run of
    that (scenario, case) (the slow link: its recorded CPU run)."""
    if scenario not in LIVE and scenario not in RECORDED_ONLY:
        raise ValueError(f"no drill scenario {scenario!r}")
    if scenario == "slowlink":
        return _slowlink(case)
    if live:
        dev = device_of(device)
        if can_run_live(scenario, dev):
            return LIVE[scenario](case, dev), live_label(dev)
    return recorded_run(scenario, case)


def recorded_run(scenario: str, case: str) -> tuple[dict[str, Any], str]:
    """The H200's recorded run of (scenario, case) from ``recorded/h200/drills.json``."""
    ev = recorded("drills")
    runs = ev.extra.get("runs") or {}
    key = f"{scenario}/{case}"
    if key not in runs:
        raise EvidenceError(f"recorded drills ({ev.label}) hold no measured run of {key}: "
                            "re-record them with tools/refresh_gpu_evidence.py --only drills")
    r = runs[key]
    src = r.get("source") or ev.label
    if src.startswith("measured live on "):  # live on the machine that recorded it, not here
        src = f"{ev.label} (a recorded run, not measured here)"
    return dict(r["evidence"]), src
