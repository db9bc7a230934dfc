"""``hwlab.examine``: measure any function under the kit's protocol and walk the flowchart on it.

    ex = hwlab.examine(my_fn, x, w)              # or make_inputs=factory for fresh input sets
    print(ex.report()); ex.leaf_id; ex.to_dict(); ex.incident

What happens, in order (each step refuses bad input with one line saying what to do):

1. **Inputs.** Tensors anywhere in ``args``/``kwargs`` (nested tuples, lists, dicts), plus plain
   scalars; anything else is refused. All tensors on one device; constant (e.g. all-zero)
   floating inputs refused (:func:`hwlab.core.measure.refuse_constant_inputs`).
2. **One checked call.** It must run, return at least one tensor, and leave its inputs
   unchanged (version counters and a float64 checksum): a function that writes its inputs
   would time different data at every repetition. Its wall time (compile, autotune) is kept
   as ``first_call_s``, never in the median.
3. **Counting** (:mod:`hwlab.examine.estimate`): required bytes and FLOPs from the caller when
   given, else estimated and labelled so; the traffic model (moved bytes, sector amplification).
4. **Timing** (:func:`hwlab.core.measure.time_fn`): warm-up to the sustained state, device events,
   median and p10-p90; with ``make_inputs`` enough fresh input sets to rotate past 2x L2.
5. **Profile** (:mod:`hwlab.examine.torch_profile`): kernels per call, GPU busy time, dominating
   kernels, tensor-core kernels, Triton spills; ``ncu=True`` adds Nsight Compute counters,
   kept apart from the estimates (:mod:`hwlab.examine.ncu_counters`).
6. **Evidence and walk.** Only measured metrics enter :func:`hwlab.diagnosis.flowchart.diagnose` (the
   table in :data:`METRIC_SOURCES`); the walk names its leaf, the seed's actions, the lab.
   With no matmul FLOPs counted and no tensor-core kernel in the profile, the Tensor-Core
   question is answered "not applicable" and the walk goes on to J. A rate above a measured
   ceiling raises that ceiling where the working set proves it low, and moved over required
   bytes of 2 or more answers F (:mod:`hwlab.examine.rates`); the report says which was raised.
7. **Parts** (:mod:`hwlab.examine.parts`): the measured time split by part (kernels joined to
   the aten ops that launched them, plus GPU idle), each part floored and walked on its own
   metrics; the headline (``leaf_id``) is the part with the largest expected gain, and the
   whole-function walk above stays in the report beside it.

``fn`` may be an ``nn.Module`` or a bound method of one (a decode step): it is examined in eval
mode under ``torch.no_grad`` (:func:`as_inference`), its weights read once per call.

Question D for one function on one device: ``e2e_slowdown`` is the host wall-clock per call
of the function run back to back, as a caller runs it (one synchronise at the end), over the
device-event median: what a caller gets over what the single-device measurement predicts.
Multi-GPU behaviour is not examined (one function, one device); the report says so.

On a CPU the same steps run; every figure is this CPU's against this CPU's measured
ceilings, and the leaf is indicative of the code path, not a GPU verdict.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from hwlab.core import ceilings as ceilings_mod
from hwlab.diagnosis import incident as incident_mod
from hwlab.errors import UserInputError
from hwlab.core.evidence import Evidence, machine_info
from hwlab.examine.walk_metrics import METRIC_SOURCES, build_evidence, flop_bound  # noqa: F401 (re-exported)
from hwlab.examine.ncu_counters import collect as ncu_collect
from hwlab.examine.torch_profile import ProfileSummary, profile_calls
from hwlab.diagnosis.flowchart import LEAVES, Diagnosis, diagnose
from hwlab.core.measure import (
    InsufficientMemoryError, Measurement, device_name, l2_bytes_of, last_level_cache_bytes, n_rotating_sets,
    require_memory, synchronize, time_fn)
from hwlab.core.store import dumps_strict
from hwlab.core.system import versions
from hwlab.core import validate
from hwlab.examine.ncu_counters import MAX_KERNELS
from hwlab.examine.parts import Part, Parts, build_parts
from hwlab.examine.rates import settle_copy, settle_gemm, traffic_ratio

# torch, the counting modes (estimate) and the input checks (inputs) load when a function is examined:
# the package itself, its report and its trace readers import without torch (commands that only read)
if TYPE_CHECKING:
    from hwlab.examine.estimate import Traffic

#: torch dtype of the matmul inputs -> the measured GEMM ceiling that is its floor. fp32 data
#: can take the TF32 MMA path, so its floor is the TF32 rate (pass dtype_peak="fp32" when the
#: function needs full fp32 accuracy); fp16 runs at the bf16 rate on the cards the kit knows.
PEAK_FOR_DTYPE = {"float32": "tf32", "bfloat16": "bf16", "float16": "bf16",
                  "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}
#: composite ops a profile shows -> the ops below them that the dispatch mode sees
COMPOSITE_OPS = {"aten::matmul": ("aten::mm", "aten::bmm"), "aten::linear": ("aten::addmm", "aten::mm"),
                 "aten::einsum": ("aten::bmm", "aten::mm")}
#: labs that teach a leaf whose flowchart entry names none
LAB_FALLBACK = {"I": "06_case_studies (the dtype / MMA-path scenario)"}
#: question D's back-to-back run: chunks (median taken) of about this many ms each
E2E_CHUNKS = 15
E2E_CHUNK_MS = 5.0
#: the phases ``on_step`` announces, in order (progress on the command line's stderr)
PHASES = ("checked call (runs, returns tensors, leaves its inputs unchanged)",
          "ceilings of this machine (cached or measured)",
          "warm-up and timing (device events, median and p10-p90)",
          "back to back (question D)", "profiling (torch.profiler)",
          "counting bytes and FLOPs (traffic model)", "parts and the walk")
#: the first phase after every refusal of bad input (inputs, ceilings, given counts)
ACCEPTED_PHASE = PHASES[3]


@dataclass
class Examination:
    """The result of :func:`examine`: measurement, counts, profile, evidence, walk, incident."""

    name: str
    on_gpu: bool
    measurement: Measurement
    counts: dict[str, Any]
    profile: ProfileSummary
    ceilings: dict[str, Any]
    evidence: dict[str, Any]
    evidence_sources: dict[str, str]
    diagnosis: Diagnosis
    incident: incident_mod.Incident
    ncu: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    parts: Parts | None = None

    @property
    def headline(self) -> Part | None:
        """The walked part with the largest expected gain (:mod:`hwlab.examine.parts`)."""
        return self.parts.headline if self.parts is not None else None

    @property
    def leaf_id(self) -> str | None:
        """The headline part's leaf; the whole-function walk's where no part was walked."""
        h = self.headline
        return h.leaf_id if h is not None else self.diagnosis.leaf_id

    @property
    def trace_path(self) -> str | None:
        """The profiler's Chrome trace of this examination (a temporary file)."""
        return self.profile.trace_path

    @property
    def lab(self) -> str:
        return leaf_lab(self.leaf_id) if self.leaf_id else ""

    @property
    def label(self) -> str:
        where = "GPU" if self.on_gpu else "CPU (figures and ceilings are this CPU's; the leaf is indicative)"
        return f"measured live on {self.measurement.device} [{where}]"

    def to_dict(self) -> dict[str, Any]:
        d = self.diagnosis
        return {
            "name": self.name, "label": self.label, "on_gpu": self.on_gpu,
            "measurement": self.measurement.to_dict(), "counts": self.counts,
            "profile": self.profile.to_dict(), "ceilings": self.ceilings, "ncu": self.ncu,
            "evidence": self.evidence, "evidence_sources": self.evidence_sources,
            "walk": {"path": d.path, "leaf": self.leaf_id,
                     "undecided_at": d.undecided.id if d.undecided else None,
                     "steps": [{"question": s.question, "answer": s.answer, "metric": s.metric,
                                "value": s.value, "rule": s.criterion, "overridden": s.overridden,
                                "how": "estimated" if s.estimated and not s.by_hand else s.how,
                                "source": self.evidence_sources.get(s.metric, "by hand")}
                               for s in d.steps],
                     "explain": d.explain(),
                     "borderline": d.to_dict()["borderline"], "invalid": d.to_dict()["invalid"],
                     "estimated": d.to_dict()["estimated"], "lens_notes": list(d.lens_notes),
                     "spreads": {s.question: (list(s.spread) if s.spread else None) for s in d.steps},
                     "actions": list(d.leaf.actions) if d.leaf else [], "lab": self.lab},
            "incident_draft": self.incident.__dict__, "notes": self.notes,
            "leaf": self.leaf_id, "whole_function_leaf": d.leaf_id,
            "parts": self.parts.to_dict() if self.parts is not None else None,
        }

    def save_incident(self, folder: str) -> tuple:
        """Write the draft incident record (Markdown + JSON, numbered, never over another)."""
        return incident_mod.save(self.incident, folder)

    def to_json(self) -> str:
        return dumps_strict(self.to_dict())

    def report(self) -> str:
        from hwlab.examine.report_text import render

        return render(self)

    __str__ = report


def _count(fn: Callable[..., Any], args: tuple, kwargs: dict, want_flops: bool,
           notes: list[str]) -> tuple[Traffic, int, str]:
    """The traffic model and the FLOP count of one call each, under ``force_eager`` where torch
    has it (so counting never changes how a compiled function runs afterwards)."""
    import torch

    from hwlab.examine.estimate import Traffic, count_flops, count_traffic

    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    guard = stance("force_eager") if stance else contextlib.nullcontext()
    flops, src = 0, ("estimated: torch.utils.flop_counter (matmul family only; none inside Triton or "
                     "compiled graphs)")
    with guard:
        try:
            traffic = count_traffic(fn, args, kwargs)
        except Exception as e:  # a function that will not run under a dispatch mode: no traffic model
            traffic = Traffic()
            notes.append(f"the traffic model could not run the function ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:150]}); moved bytes = required bytes")
        if want_flops:
            try:
                flops = count_flops(fn, args, kwargs)
            except Exception as e:
                src = f"not counted: FlopCounterMode failed ({type(e).__name__}); pass n_flops"
    return traffic, flops, src


def _peak_dtype(traffic: Traffic, args: tuple, dtype_peak: str | None, c, gpu: bool,
                notes: list[str]) -> str | None:
    from hwlab.examine.estimate import tensors_of

    if dtype_peak:
        if c.gemm(dtype_peak) is None:
            raise UserInputError(f"dtype_peak={dtype_peak!r} has no measured ceiling here (have: "
                                 f"{', '.join(c.gemm_tflops) or 'none'})")
        return dtype_peak
    dt = traffic.matmul_dtype()
    if dt is None:
        floats = [t for t in tensors_of(args) if t.is_floating_point()]
        dt = str(max(floats, key=lambda t: t.numel()).dtype).replace("torch.", "") if floats else None
    want = PEAK_FOR_DTYPE.get(dt or "", "bf16")
    if not gpu:
        want = "fp32"  # a CPU has one measured GEMM ceiling
    if c.gemm(want) is None:
        alt = next(iter(c.gemm_tflops), None)
        notes.append(f"no measured {want} GEMM ceiling here; the FLOP floor uses {alt}")
        want = alt
    elif dt == "float32" and want == "tf32" and traffic.matmul_dtype() is not None:
        notes.append("fp32 matmul: its floor is the TF32 tensor-core rate (the fastest path fp32 data "
                     "can take); pass dtype_peak='fp32' if the function needs full fp32 accuracy")
    return want


def examine(fn: Callable[..., Any], *args: Any, n_bytes: int | None = None, n_flops: int | None = None,
            dtype_peak: str | None = None, make_inputs: Callable[[], Any] | None = None,
            ceilings: Any = None, ncu_target: str | None = None, name: str | None = None,
            max_total_s: float = 20.0, on_step: Callable[[str], None] | None = None,
            **kwargs: Any) -> Examination:
    """Measure ``fn(*args, **kwargs)`` under the kit's protocol and walk the flowchart on it.

    ``make_inputs()`` returns a fresh argument tuple per call (used instead of ``args``, and
    to rotate input sets past L2). ``n_bytes`` / ``n_flops`` override the estimates;
    ``dtype_peak`` ("fp32", "tf32", "bf16", "fp8") picks the GEMM ceiling of the floor.
    ``ceilings`` (a :class:`hwlab.core.ceilings.Ceilings`) defaults to this machine's cached or
    freshly measured ones. ``ncu_target`` ("MODULE:FUNC[@MODULE:INPUTS]") adds Nsight
    Compute counters where ``ncu`` exists. ``on_step(label)`` is called as each phase starts
    (checked call, timing, back to back, profile, counting, ceilings, parts): the command line
    shows it as progress on stderr (:data:`PHASES`). The keyword names above are examine's own;
    every other keyword goes to ``fn``.
    """
    import torch

    from hwlab.examine.estimate import Traffic, required_bytes, tensors_of
    from hwlab.examine.inputs import call, check_inputs, fingerprint, make

    def step(label: str) -> None:
        if on_step is not None:
            on_step(label)

    if not callable(fn):
        raise UserInputError(f"{fn!r} is not callable: pass a function (MODULE:FUNC on the command line)")
    name = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    fn = as_inference(fn)
    for what, v in (("n_bytes", n_bytes), ("n_flops", n_flops)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UserInputError(f"{what}={v!r}: give a whole number >= 0, or leave it out to estimate it")
    notes: list[str] = []
    if make_inputs is not None:
        if args:
            raise UserInputError("pass either arguments or make_inputs, not both")
        if not callable(make_inputs):
            raise UserInputError(f"make_inputs {make_inputs!r} is not callable")
        args = make(make_inputs, "make_inputs")
    args = tuple(args)
    dev = check_inputs(args, kwargs)
    gpu = dev.type == "cuda"
    in_tensors = tensors_of((args, kwargs))
    before = fingerprint(in_tensors)

    step(PHASES[0])
    t0 = time.perf_counter()
    out = call(fn, name, args, kwargs)
    synchronize(dev)
    first_call_s = time.perf_counter() - t0
    if out is None:
        raise UserInputError(f"{name} returned None: examine counts the bytes a function writes from "
                             "what it returns; return the result tensor(s)")
    if not tensors_of(out):
        raise UserInputError(f"{name} returned {type(out).__name__} with no tensor in it: return the "
                             "result tensor(s)")
    changed = [i for i, (a, b) in enumerate(zip(before, fingerprint(in_tensors)))
               if a[0] != b[0] or not (a[1] == b[1] or (math.isnan(a[1]) and math.isnan(b[1])))]
    if changed:
        raise UserInputError(f"{name} changed its input tensor(s) #{', #'.join(map(str, changed))} in place: "
                             "every repetition would run on different data. Write results to new tensors "
                             "(or clone inside the function), then examine it")
    outs = tensors_of(out)
    if any(t.is_floating_point() and not torch.isfinite(t).all() for t in outs):
        notes.append("the output holds NaN or inf on these inputs: check the function before trusting its speed")

    # required bytes from what went in and came out (caller's figures win, below)
    read_b, written_b = required_bytes((args, kwargs), out)
    del out, outs

    # timing under the protocol
    arg_sets = [args]
    l2 = l2_bytes_of(dev)
    if make_inputs is not None:
        n_sets = n_rotating_sets(max(read_b, 1), l2)
        try:
            require_memory(read_b * (n_sets - 1), dev, what="the rotating input sets")
        except InsufficientMemoryError:
            notes.append(f"{n_sets} rotating input sets do not fit in free memory: timed on one set")
            n_sets = 1
        arg_sets += [make(make_inputs, "make_inputs") for _ in range(n_sets - 1)]
        for s in arg_sets[1:]:
            check_inputs(s, kwargs)
    elif l2 and read_b < 2 * l2:
        notes.append(f"inputs not rotated (no input factory): {read_b / 2**20:.1f} MiB read per call may be "
                     f"served from the {l2 / 2**20:.0f} MiB L2; pass an input factory (--inputs)")
    run = (lambda *a: fn(*a, **kwargs)) if kwargs else fn
    # the ceilings before timing, so every refusal of input (a corrupt cache, a dtype_peak with no
    # ceiling, a given count no device reaches) comes before the long phases
    step(PHASES[1])
    c = ceilings if ceilings is not None else ceilings_mod.get(
        dev, quick=True, progress=(lambda s: step(f"ceiling: {s}")) if on_step else None)
    if dtype_peak and c.gemm(dtype_peak) is None:
        _peak_dtype(Traffic(), args, dtype_peak, c, gpu, notes)  # refuses it with its one line
    step(PHASES[2])
    timing = time_fn(run, arg_sets, dev, n_warmup=3, n_rep=20, max_total_s=max_total_s)
    if n_bytes is not None or n_flops is not None:  # a given count no device reaches: refused now
        _check_given_counts(Measurement(
            name=name, t_ms=timing.median_ms, t_p10_ms=timing.p10_ms, t_p90_ms=timing.p90_ms,
            n_bytes=int(n_bytes or 0), n_flops=int(n_flops or 0), device=device_name(dev), timer=timing.timer,
            n_rep=len(timing.samples_ms)), c, gpu, n_bytes is not None, n_flops is not None)
    # question D: the same calls back to back as a caller runs them (short chunks, see below)
    step(PHASES[3])
    wall_chunks_ms = back_to_back_ms(run, arg_sets, dev, timing.median_ms)
    wall_ms = statistics.median(wall_chunks_ms)
    step(PHASES[4])
    try:
        prof = profile_calls(fn, arg_sets, kwargs, dev, unprofiled_median_ms=timing.median_ms)
    except Exception as e:  # the measurement stands without a profile; the walk says what is missing
        prof = ProfileSummary(on_gpu=gpu, n_calls=0, kernels_per_call=0.0, busy_ms_per_call=0.0,
                              error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
        notes.append(f"the profiler failed ({prof.error}): no kernel list, launch-gap or spill figures")

    # counting after timing and profiling, compiled functions held eager: a torch.compile'd
    # function called under a dispatch mode runs eagerly from then on (seen with torch 2.13)
    step(PHASES[5])
    traffic, flops_est, flops_src = _count(fn, args, kwargs, n_flops is None, notes)
    by_op = traffic.by_op()
    for k in prof.top:  # the dtypes of each dominating kernel's op, from that op's real tensors
        op = k.get("launched_by") or ""
        for op_seen in (op, *COMPOSITE_OPS.get(op, ())):  # a CPU profile names composites (matmul)
            if op_seen in by_op:
                k["dtypes"] = by_op[op_seen]["dtypes"]
                break
    captured_b = traffic.captured_read_bytes((args, kwargs))
    if traffic.ops:  # inputs only read through gathers need only what the gathers touched
        read_b = min(read_b, traffic.input_read_bytes((args, kwargs)))
    counts: dict[str, Any] = {
        "required_read_bytes": read_b, "required_written_bytes": written_b,
        "captured_read_bytes": captured_b,
        "n_bytes": int(n_bytes) if n_bytes is not None else read_b + captured_b + written_b,
        "n_bytes_source": "given by the caller" if n_bytes is not None else
        "estimated: inputs (and tensors it captured: weights, closures) read once + outputs written "
        "once (unique storages)",
        "n_flops": int(n_flops) if n_flops is not None else flops_est,
        "n_flops_source": "given by the caller" if n_flops is not None else flops_src,
        "ops": traffic.counts(), "by_op": by_op, "first_call_s": first_call_s,
    }
    peak = _peak_dtype(traffic, args, dtype_peak, c, gpu, notes)
    m = Measurement(name=name, t_ms=timing.median_ms, t_p10_ms=timing.p10_ms, t_p90_ms=timing.p90_ms,
                    n_bytes=counts["n_bytes"], n_flops=counts["n_flops"], device=device_name(dev),
                    timer=timing.timer, n_rep=len(timing.samples_ms),
                    params={"n_rotating_sets": len(arg_sets), "gemm_ceiling_dtype": peak,
                            "first_call_s": first_call_s, "wall_ms_per_call": wall_ms})
    m = m.with_ceilings(gbps=c.copy_gbps, tflops=c.gemm(peak) if peak else None, source=c.label)
    _check_given_counts(m, c, gpu, n_bytes is not None, n_flops is not None)

    # moved bytes: the traffic model where it saw the kernels, else the required bytes (labelled)
    seen_all = prof.attributable_pct is None or prof.attributable_pct >= 95.0
    if prof.compiled_region or not seen_all or traffic.unamplified_bytes < read_b + captured_b + written_b:
        moved = counts["n_bytes"]
        counts["moved_bytes_source"] = (
            "not attributable: kernels ran outside aten ops (Triton / torch.compile), so the traffic "
            "model did not see them; moved bytes = required bytes")
        amp = None
    else:
        moved = max(traffic.moved_bytes, counts["n_bytes"])
        counts["moved_bytes_source"] = "estimated: each aten op's tensors, reads x estimated sector amplification"
        amp = traffic.sector_amplification
    counts["moved_bytes"] = moved
    counts["sector_amplification_estimated"] = amp

    # a rate above a measured ceiling: the ceiling raised where the rate proves it low (examine.rates)
    cache_b = last_level_cache_bytes(dev)
    counts["cache_bytes"] = cache_b
    s_copy = settle_copy(moved / (m.t_ms * 1e6) if m.t_ms > 0 else None, c.copy_gbps, counts["n_bytes"], cache_b)
    s_gemm = settle_gemm(m.tflops if m.n_flops and m.t_ms > 0 else None, c.gemm(peak) if peak else None, peak)
    counts["ceilings_raised"] = [x.note for x in (s_copy, s_gemm) if x.raised]
    notes += [x.note for x in (s_copy, s_gemm) if x.note]
    if s_copy.raised or s_gemm.raised:
        label = c.label
        c = ceilings_mod.Ceilings.from_dict(c.to_dict())
        if s_copy.raised:
            c.copy_gbps = s_copy.ceiling * (1 + 1e-9)  # the achieved rate reads 100%, not a rounding over it
        if s_gemm.raised:
            c.gemm_tflops[peak] = s_gemm.ceiling * (1 + 1e-9)
        c.source = (f"{label}; RAISED for this examination to the achieved "
                    + " and ".join(w for w, x in (("copy rate", s_copy), (f"{peak} GEMM rate", s_gemm)) if x.raised)
                    + " (not re-measured, not cached)")
        m = m.with_ceilings(gbps=c.copy_gbps, tflops=c.gemm(peak) if peak else None, source=c.label)
    ratio = (traffic_ratio(moved, counts["n_bytes"], counts["n_bytes"], cache_b)
             if counts["moved_bytes_source"].startswith("estimated") else None)

    many = prof.on_gpu and prof.kernels_per_call > MAX_KERNELS  # then count only the top kernels
    ncu = ncu_collect(ncu_target, notes, top_kernels=[k["name"] for k in prof.top] if many else None) \
        if ncu_target else None
    ev, sources = build_evidence(m, moved=moved, amp=amp, prof=prof, wall_chunks_ms=wall_chunks_ms,
                                 flop_bound=flop_bound(m), ncu=ncu, on_gpu=gpu, traffic_ratio=ratio)
    diag = diagnose({**ev, "metric_sources": sources})  # the walk prints what measured each answer
    if diag.undecided is not None and diag.undecided.id == "H" and not flop_bound(m):
        notes.append("H asks about Tensor-Core use, which applies to matmul work; this function's floor is "
                     "set by its bytes (no matmul FLOPs counted or given). Run with --ncu for occupancy "
                     "and registers, or pass n_flops if it does matmul work the counter cannot see")
    if not gpu:
        notes.append("CPU run: no GPU kernels, so no launch-gap or spill figures; the walk is indicative")
    notes.append("multi-GPU behaviour is not examined (one function, one device): for a rank tail, record "
                 "per-rank step times (Lab 3)")
    inc = _draft_incident(name, m, c, diag, dev)

    def gemm_tflops_for(dt: str | None) -> float | None:
        if dtype_peak:
            return c.gemm(dtype_peak)
        return c.gemm("fp32" if not gpu else PEAK_FOR_DTYPE.get(dt or "", peak or "bf16")) or \
            (c.gemm(peak) if peak else None)

    slow = ev.get("slowdown_vs_floor")
    step(PHASES[6])
    try:
        parts = build_parts(prof=prof, traffic=traffic, t_ms=m.t_ms, gpu=gpu, copy_gbps=c.copy_gbps,
                            gemm_tflops_for=gemm_tflops_for, whole_floor_ms=m.t_ms / slow if slow else None,
                            whole_slowdown=slow, e2e_slowdown=ev.get("e2e_slowdown"),
                            e2e_spread=(ev.get("metric_spreads") or {}).get("e2e_slowdown"),
                            out_keys=traffic.out_keys, ncu=ncu, lab_for=leaf_lab, cache_bytes=cache_b,
                            whole_leaf=diag.leaf_id)
    except Exception as e:  # the whole-function walk stands; the parts say why they are missing
        parts = Parts([], m.t_ms, "", None, error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
    if parts.headline is not None and parts.headline.leaf_id != diag.leaf_id:
        notes.append(f"the whole function's aggregate walk lands on {diag.leaf_id or 'no leaf'}; the part with "
                     f"the largest expected gain ({parts.headline.name}) lands on {parts.headline.leaf_id}, "
                     "which is the headline")
    return Examination(name=name, on_gpu=gpu, measurement=m, counts=counts, profile=prof,
                       ceilings={**c.to_dict(), "label": c.label}, evidence=ev,
                       evidence_sources=sources, diagnosis=diag, incident=inc, ncu=ncu, notes=notes,
                       parts=parts)


def as_inference(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An ``nn.Module`` (or a bound method of one, e.g. a decode step) put in eval mode and
    called under ``torch.no_grad``: examined as it serves, weights read once per call (they
    are captured tensors, each storage counted once). Anything else is returned as is."""
    import torch

    owner = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if not isinstance(owner, torch.nn.Module):
        return fn
    owner.eval()

    def inference(*a: Any, **k: Any) -> Any:
        with torch.no_grad():
            return fn(*a, **k)

    inference.__qualname__ = getattr(fn, "__qualname__", type(owner).__name__)
    inference.__wrapped__ = fn
    return inference


def _check_given_counts(m: Measurement, c: Any, gpu: bool, bytes_given: bool, flops_given: bool) -> None:
    """Refuse a caller's ``n_bytes`` / ``n_flops`` whose rate over the measured time no device
    reaches (:func:`hwlab.core.validate.implied_rate`): above the GPU's datasheet peak, or on a
    machine without one, far above its measured ceiling. Estimated counts are the kit's own
    and are not checked here."""
    spec = validate.datasheet(m.device) if gpu else None
    if bytes_given:
        validate.implied_rate("--n-bytes (n_bytes)", m.gbps, "GB/s", m.device,
                              spec.hbm_gbps if spec else None, c.copy_gbps)
    if flops_given:
        peaks = [spec.peak_tflops(k) for k in ("fp32", "tf32", "bf16", "fp8")] if spec else []
        measured = max(c.gemm_tflops.values(), default=None) if c.gemm_tflops else None
        validate.implied_rate("--n-flops (n_flops)", m.tflops, "TFLOP/s", m.device,
                              max((x for x in peaks if x), default=None), measured)


def back_to_back_ms(call: Callable[..., Any], arg_sets: list, dev, t_ms: float,
                    n_chunks: int = E2E_CHUNKS, chunk_ms: float = E2E_CHUNK_MS) -> list[float]:
    """Wall-clock ms per call of ``call`` run back to back, one synchronise per chunk of
    ~``chunk_ms`` (1-20 calls): one figure per chunk, ``n_chunks`` of them (the evidence takes
    their median, and their p10-p90 for D's spread). Short chunks, like the single-call samples
    they are compared with, so a host that preempts long loops (a busy CPU) does not read as a
    slow function."""
    per_chunk = max(1, min(20, int(chunk_ms / max(t_ms, 1e-3))))
    chunks = []
    k = 0
    for _ in range(n_chunks):
        synchronize(dev)
        t1 = time.perf_counter()
        for _ in range(per_chunk):
            call(*arg_sets[k % len(arg_sets)])
            k += 1
        synchronize(dev)
        chunks.append((time.perf_counter() - t1) * 1e3 / per_chunk)
    return chunks


def _draft_incident(name: str, m: Measurement, c, diag: Diagnosis, dev) -> incident_mod.Incident:
    rec = Evidence(kind="examine", machine=machine_info(dev), results=[m], ceilings=c.to_dict(),
                   versions=versions())
    leaf = diag.leaf
    fix = (f"proposed (leaf {leaf.id}, {leaf.title}): {leaf.actions[0]}" if leaf else
           "undecided: " + diag.explain().splitlines()[-1])
    floor = m.t_ms / diag.steps[0].value if diag.steps and diag.steps[0].metric == "slowdown_vs_floor" else None
    symptom = f"{name}: {m.t_ms:.4g} ms per call (p10-p90 {m.t_p10_ms:.4g}-{m.t_p90_ms:.4g})" + (
        f", {diag.steps[0].value:.2f}x its floor of {floor:.4g} ms" if floor else "")
    return incident_mod.from_diagnosis(
        f"draft: {name} on {m.device}", rec, diag, symptom_scope="single-card", symptom=symptom, fix=fix,
        reverify=f"re-run `hwlab examine` on {name} after the fix: slowdown_vs_floor under 1.5x "
                 "and the walk at OK")


def leaf_lab(leaf_id: str) -> str:
    leaf = LEAVES.get(leaf_id)
    return (leaf.lab if leaf else "") or LAB_FALLBACK.get(leaf_id, "")


class _CallableModule(types.ModuleType):
    """``hwlab.examine(fn, ...)`` calls :func:`examine`, while ``hwlab.examine`` stays this module
    (so ``from hwlab.examine import Examination`` and the call both work, in any import order)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Examination:
        return examine(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
