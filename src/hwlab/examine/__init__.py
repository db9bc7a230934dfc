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
   median and p10-p90; with ``make_inputs`` enough fresh input sets to rotate past 2x L2. Taken
   in :data:`~hwlab.examine.repeats.N_REPEATS` blocks, each single calls then back to back
   (question D), so each block is a repeat (:mod:`hwlab.examine.repeats`).
5. **Profile** (:mod:`hwlab.examine.torch_profile`): kernels per call, GPU busy time, dominating
   kernels, tensor-core kernels, Triton spills; ``ncu=True`` adds Nsight Compute counters,
   kept apart from the estimates (:mod:`hwlab.examine.ncu_counters`).
6. **Evidence and walk.** Only measured metrics enter :func:`hwlab.diagnosis.flowchart.diagnose` (the
   table in :data:`METRIC_SOURCES`); the walk names its leaf, the seed's actions, the lab.
   With no matmul FLOPs counted and no tensor-core kernel in the profile, the Tensor-Core
   question is answered "not applicable" and the walk goes on to J. A rate above a measured
   ceiling raises that ceiling where the working set proves it low, and DRAM bytes of at least
   2x the required bytes by the per-op cache bound (moved - cache x op boundaries) answer F
   (:mod:`hwlab.examine.rates`); the report says which ceiling was raised.
7. **Parts** (:mod:`hwlab.examine.parts`): the measured time split by part (kernels joined to
   the aten ops that launched them, plus GPU idle), each part floored and walked on its own
   metrics; the headline (``leaf_id``) is the part with the largest expected gain, and the
   whole-function walk above stays in the report beside it.
8. **Repeats** (:mod:`hwlab.examine.repeats`): the whole function and every part are walked on each
   repeat (a timing block and, on a CPU, a profiled call) too; the repeats' range is each metric's
   spread, and a leaf a repeat or a spread end differs on is BORDERLINE with its alternatives named
   (:attr:`Examination.alternatives`). The incident draft's fix is the headline part's.

``fn`` may be an ``nn.Module`` or a bound method of one (a decode step): it is examined in eval
mode under ``torch.no_grad`` (:func:`as_inference`), its weights read once per call.

Question D for one function on one device: ``e2e_slowdown`` is the host wall-clock per call
of the function run back to back, as a caller runs it (one synchronise at the end), over the
device-event median: what a caller gets over what the single-device measurement predicts.
Multi-GPU behaviour is not examined (one function, one device); the report says so, and the
evidence carries ``n_ranks`` = 1, so the walk never asks K (rank tail) of one process.

On a CPU the same steps run; every figure is this CPU's against this CPU's measured
ceilings, and the leaf is indicative of the code path, not a GPU verdict.
"""
from __future__ import annotations

import dataclasses
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
from hwlab.examine.torch_profile import CPU_EXTRA_CALLS, ProfileSummary, profile_calls
from hwlab.diagnosis.flowchart import LEAVES, Diagnosis, diagnose
from hwlab.core.measure import Measurement, device_name, last_level_cache_bytes, quantile, synchronize, time_fn
from hwlab.core.store import dumps_strict
from hwlab.core.system import versions
from hwlab.core import validate
from hwlab.examine.ncu_counters import MAX_KERNELS
from hwlab.examine.parts import Part, Parts, build_parts
from hwlab.examine.rates import traffic_ratio
from hwlab.examine.dtype_lever import CPU_PEAK_FOR_DTYPE, gemm_ceiling
from hwlab.examine.op_overhead import per_op_share, per_op_us
from hwlab.examine.progress import SUBSTEP, Progress
from hwlab.examine.repeats import (
    N_REPEATS, Blocks, Retimer, alternatives, ceiling_band, leaf_name, merge_spreads, spreads_over)
from hwlab.examine.timing_blocks import timed_blocks

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
#: profiled calls on a CPU: the parts read the least disturbed five of them
#: (:data:`hwlab.examine.parts.N_STEADY_CALLS`: one per repeat and two more, so each op's median over
#: them, :func:`hwlab.examine.parts.op_medians`, leaves out a call preempted inside that op), and
#: three more to choose from, as the profiler's own memory makes some calls fault inside their ops
N_PROFILED = N_REPEATS + 5
#: the phases ``on_step`` announces, in order (progress on the command line's stderr)
PHASES = ("checked call (runs, returns tensors, leaves its inputs unchanged)",
          "ceilings of this machine (cached or measured)",
          f"warm-up and timing in {N_REPEATS} blocks sized by the measured spread: single calls (median and "
          "p10-p90), then back to back (question D)",
          "timing accepted (the given counts checked against it)", "profiling (torch.profiler)",
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
    #: leaves other than the whole function's that a repeat or a spread end reaches (BORDERLINE)
    whole_alternatives: list[str] = field(default_factory=list)
    #: the leaf each timing block's own walk of the whole function reached (:mod:`hwlab.examine.repeats`)
    whole_repeat_leaves: list[str | None] = field(default_factory=list)

    @property
    def alternatives(self) -> list[str]:
        """The headline leaf's alternatives (:mod:`hwlab.examine.repeats`): empty when the leaf holds."""
        h = self.headline
        if h is not None:
            return self.parts.headline_alternatives
        # no part heads: the whole function's walk does, and a repeat that a part headed is a re-run's leaf
        heads = {leaf for _, leaf in (self.parts.repeat_headlines if self.parts is not None else []) if leaf}
        return sorted((set(self.whole_alternatives) | heads) - {self.diagnosis.leaf_id})

    @property
    def borderline(self) -> bool:
        """The headline leaf is one re-run from another (its alternatives are named)."""
        return bool(self.alternatives)

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
            "borderline": self.borderline, "alternatives": self.alternatives,
            "whole_function_alternatives": self.whole_alternatives,
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
    if not gpu:  # a CPU's whole-function floor: its data's own precision (the parts take the dtype lever)
        want = CPU_PEAK_FOR_DTYPE.get(dt or "", "fp32")
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
            cache_bytes: int | None = None, **kwargs: Any) -> Examination:
    """Measure ``fn(*args, **kwargs)`` under the kit's protocol and walk the flowchart on it.

    ``make_inputs()`` returns a fresh argument tuple per call (used instead of ``args``, and
    to rotate input sets past L2). ``n_bytes`` / ``n_flops`` override the estimates;
    ``dtype_peak`` ("fp32", "tf32", "bf16", "fp8") picks the GEMM ceiling of the floor.
    ``ceilings`` (a :class:`hwlab.core.ceilings.Ceilings`) defaults to this machine's cached or
    freshly measured ones (on a CPU, with its bf16 and fp64 GEMM ceilings measured now for the
    dtype lever, :mod:`hwlab.examine.dtype_lever`; given ceilings are used as given).
    ``cache_bytes`` is the last-level cache the wasted-traffic bound and the working set are
    judged against (default: this device's, read from the system).
    ``ncu_target`` ("MODULE:FUNC[@MODULE:INPUTS]") adds Nsight Compute counters where ``ncu``
    exists. ``on_step(label)`` is called as each phase starts (:data:`PHASES`): the command line
    shows it as progress on stderr. The keyword names above are examine's own; every other
    keyword goes to ``fn``.
    """
    from hwlab.examine.inputs import check_inputs, make
    from hwlab.examine.phases import checked_call, probe_call, rotating_sets

    prog = Progress(on_step, N_PROFILED, PHASES)
    step = prog.step

    if not callable(fn):
        raise UserInputError(f"{fn!r} is not callable: pass a function (MODULE:FUNC on the command line)")
    if ceilings is not None and not isinstance(ceilings, ceilings_mod.Ceilings):
        raise UserInputError(f"ceilings={ceilings!r:.40}: pass a hwlab.core.ceilings.Ceilings (e.g. "
                             "ceilings.recorded() or ceilings.get()), or leave it out for this machine's")
    name = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    fn = as_inference(fn)
    for what, v in (("n_bytes", n_bytes), ("n_flops", n_flops), ("cache_bytes", cache_bytes)):
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
    prog.device_type = dev.type
    prog.n_profiled = N_PROFILED + CPU_EXTRA_CALLS if dev.type != "cuda" else N_REPEATS
    prog.heartbeat()
    try:
        step(PHASES[0])
        first_call_s, read_b, written_b = checked_call(fn, name, args, kwargs, dev, notes)
        arg_sets = rotating_sets(args, make_inputs, kwargs, dev, read_b, notes)
        run = (lambda *a: fn(*a, **kwargs)) if kwargs else fn
        prog.probe(*probe_call(run, arg_sets, dev))  # the estimate's first basis (examine/progress)
        # the ceilings before timing, so every refusal of input (a corrupt cache, a dtype_peak with no
        # ceiling, a given count no device reaches) comes before the long phases
        prog.measuring_ceilings = ceilings is None and not ceilings_mod.cache_path(dev).exists()
        step(PHASES[1])
        c = ceilings if ceilings is not None else ceilings_mod.get(
            dev, quick=True, progress=(lambda s: step(f"{SUBSTEP}ceiling: {s}")) if on_step else None)
        if dev.type != "cuda" and ceilings is None:  # bf16 and fp64, not in a CPU's cache: measured (dtype_lever)
            c, now = ceilings_mod.with_cpu_gemms(c, dev, progress=(lambda s: step(f"{SUBSTEP}ceiling: {s}"))
                                               if on_step else None)
            if now:
                notes.append(f"{', '.join(now)} GEMM ceiling{'s' if len(now) > 1 else ''} measured now (the cached "
                             "ceilings hold fp32 only): quick size, not cached")
        if dtype_peak and c.gemm(dtype_peak) is None:
            _peak_dtype(None, args, dtype_peak, c, dev.type == "cuda", notes)  # refuses it with its one line
        step(PHASES[2])
        prog.measuring_ceilings = False
        blocks = timed_blocks(run, arg_sets, dev, time_fn, back_to_back_ms, max_total_s=max_total_s,
                              retime=Retimer(c.bands, dev) if dev.type != "cuda" else None,
                              on_timed=prog.timed, on_left=prog.timing_left)
        notes.append(blocks.sizing())
        pooled = sorted(blocks.pooled_samples_ms)
        timing = (statistics.median(pooled), quantile(pooled, 0.1), quantile(pooled, 0.9))
        if n_bytes is not None or n_flops is not None:  # a given count no device reaches: refused now
            _check_given_counts(Measurement(
                name=name, t_ms=timing[0], t_p10_ms=timing[1], t_p90_ms=timing[2],
                n_bytes=int(n_bytes or 0), n_flops=int(n_flops or 0), device=device_name(dev), timer=blocks.timer,
                n_rep=len(pooled)), c, dev.type == "cuda", n_bytes is not None, n_flops is not None)
        step(PHASES[3])
        return _measured(fn, name, args, kwargs, arg_sets, dev, c, blocks, timing, first_call_s, read_b, written_b,
                         n_bytes, n_flops, dtype_peak, ncu_target, cache_bytes, notes, step)
    finally:
        prog.stop()


def _measured(fn, name: str, args: tuple, kwargs: dict, arg_sets: list, dev, c, blocks: Blocks,
              timing: tuple[float, float, float], first_call_s: float, read_b: int, written_b: int,
              n_bytes: int | None, n_flops: int | None, dtype_peak: str | None, ncu_target: str | None,
              cache_bytes: int | None, notes: list[str], step: Callable[[str], None]) -> Examination:
    """The phases after timing (module doc, 5-7): profile, counts, evidence, the walks of the
    pooled run and of each repeat, the parts, the incident draft."""
    from hwlab.examine.phases import count, counts_of, settle

    gpu = dev.type == "cuda"
    cache_b = cache_bytes if cache_bytes is not None else last_level_cache_bytes(dev)
    step(PHASES[4])
    try:
        prof = profile_calls(fn, arg_sets, kwargs, dev, n_calls=N_PROFILED if not gpu else N_REPEATS,
                             unprofiled_median_ms=timing[0], cache_bytes=cache_b)
    except Exception as e:  # the measurement stands without a profile; the walk says what is missing
        prof = ProfileSummary(on_gpu=gpu, n_calls=0, kernels_per_call=0.0, busy_ms_per_call=0.0,
                              error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
        notes.append(f"the profiler failed ({prof.error}): no kernel list, launch-gap or spill figures")
    # counting after timing and profiling, compiled functions held eager: a torch.compile'd
    # function called under a dispatch mode runs eagerly from then on (seen with torch 2.13)
    step(PHASES[5])
    traffic, flops_est, flops_src = count(fn, args, kwargs, n_flops is None, notes)
    counts = counts_of(traffic, prof, args, kwargs, read_b, written_b, n_bytes, n_flops, flops_est, flops_src,
                       first_call_s, COMPOSITE_OPS)
    peak = _peak_dtype(traffic, args, dtype_peak, c, gpu, notes)
    wall_ms = statistics.median(blocks.pooled_chunks_ms)
    m = Measurement(name=name, t_ms=timing[0], t_p10_ms=timing[1], t_p90_ms=timing[2],
                    n_bytes=counts["n_bytes"], n_flops=counts["n_flops"], device=device_name(dev),
                    timer=blocks.timer, n_rep=len(blocks.pooled_samples_ms),
                    params={"n_rotating_sets": len(arg_sets), "gemm_ceiling_dtype": peak,
                            "first_call_s": first_call_s, "wall_ms_per_call": wall_ms,
                            "n_repeats": len(blocks.samples_ms),
                            "run_queue_wait_pct": None if blocks.wait_share() is None else 100 * blocks.wait_share()})
    m = m.with_ceilings(gbps=c.copy_gbps, tflops=c.gemm(peak) if peak else None, source=c.label)
    _check_given_counts(m, c, gpu, n_bytes is not None, n_flops is not None)
    counts["cache_bytes"] = cache_b
    counts["cache_bytes_source"] = "given by the caller" if cache_bytes is not None else "this device's last-level cache"
    m, c = settle(m, c, peak, counts, cache_b, notes)
    many = prof.on_gpu and prof.kernels_per_call > MAX_KERNELS  # then count only the top kernels
    ncu = ncu_collect(ncu_target, notes, top_kernels=[k["name"] for k in prof.top] if many else None) \
        if ncu_target else None
    step(PHASES[6])
    per_op = per_op_us(dev)  # a CPU's cost per aten op (examine/op_overhead): J's per-op rule
    walks = _walk_all(m, c, peak, counts, prof, traffic, blocks, ncu, gpu, dtype_peak, dev, per_op)
    ev, sources, diag, parts, alts, rep_leaves = walks
    if diag.undecided is not None and diag.undecided.id == "H" and not flop_bound(m):
        notes.append("H asks about Tensor-Core use, which applies to matmul work; this function's floor is "
                     "set by its bytes (no matmul FLOPs counted or given). Run with --ncu for occupancy "
                     "and registers, or pass n_flops if it does matmul work the counter cannot see")
    if not gpu:
        notes.append("CPU run: no GPU kernels, so no launch-gap or spill figures; the walk is indicative")
        for k, rs in blocks.ceiling_rates.items():
            unit, now = ("GB/s", c.copy_gbps) if k == "copy" else ("TFLOP/s", c.gemm(k.split()[-1]))
            notes.append(f"ceiling {k} re-timed before each block and after the last: {min(rs):.4g}-{max(rs):.4g} "
                         f"{unit} against {now:.4g} in use; the range widens every metric judged against it")
        n_ops = counts["n_ops"]  # ops as dispatched (the traffic model's records): what each pays for
        share = per_op_share(n_ops, m.t_ms, per_op)
        if share is not None:
            notes.append(f"per-op overhead: {n_ops:.0f} aten ops per call x {per_op['us']:.3g} us per op (measured: "
                         f"{per_op['source']}) = {100 * share:.0f}% of the call's {m.t_ms:.4g} ms")
        w = blocks.wait_share()
        notes.append("CPU times are net of the run-queue wait (hwlab.core.hostwait): " + (
            f"in its busiest block the timing thread waited for a CPU {100 * w:.0f}% of the wall time (host "
            "load, taken out)" if w is not None else "not reported by this system, so the times are wall clock"))
    notes.append("multi-GPU behaviour is not examined (one function, one device): K (rank tail) is not "
                 "asked of one process; for a rank tail, record per-rank step times (Lab 3)")
    if alts:
        notes.append(f"the whole function's walk is BORDERLINE: a re-run may land on {' or '.join(alts)} instead of "
                     f"{diag.leaf_id or 'no leaf'} (its {N_REPEATS} repeats, or its metrics at the ends of their spread)")
    if parts.headline is not None and parts.headline.leaf_id != diag.leaf_id:
        notes.append(f"the whole function's aggregate walk lands on {diag.leaf_id or 'no leaf'}; the part with "
                     f"the largest expected gain ({parts.headline.name}) lands on {parts.headline.leaf_id}, "
                     "which is the headline")
    inc = _draft_incident(name, m, c, diag, dev, parts.headline, parts.headline_alternatives)
    return Examination(name=name, on_gpu=gpu, measurement=m, counts=counts, profile=prof,
                       ceilings={**c.to_dict(), "label": c.label}, evidence=ev,
                       evidence_sources=sources, diagnosis=diag, incident=inc, ncu=ncu, notes=notes,
                       parts=parts, whole_alternatives=alts,
                       whole_repeat_leaves=rep_leaves)


def _walk_all(m: Measurement, c, peak: str | None, counts: dict[str, Any], prof, traffic, blocks: Blocks, ncu,
              gpu: bool, dtype_peak: str | None, dev, per_op: dict[str, Any] | None = None) -> tuple:
    """The whole function and its parts walked on the pooled run and on each repeat (one timing
    block, one profiled call each): the repeats' ranges are the spreads, and a leaf they differ on
    is BORDERLINE (:mod:`hwlab.examine.repeats`)."""
    cache_b = counts["cache_bytes"]
    band = ceiling_band(c.bands, ("copy",) + ((f"gemm {peak}",) if peak else ()), blocks.ceiling_rates,
                        {"copy": c.copy_gbps, **({f"gemm {peak}": c.gemm(peak)} if peak else {})})
    ratio = (traffic_ratio(counts["moved_bytes"], counts["n_bytes"], cache_b, counts["n_ops"])
             if counts["moved_bytes_source"].startswith("estimated") else None)
    bf16: dict[str, tuple[bool, str]] = {}

    def bf16_ok() -> tuple[bool, str]:  # measured once, only when a GEMM part lands on I
        if "v" not in bf16:
            bf16["v"] = ceilings_mod.bf16_gain(c, dev)
        return bf16["v"]

    native = ceilings_mod.bf16_support(dev)[0]

    def gemm_ceiling_for(dt: str | None) -> tuple[float | None, str | None, str | None]:
        return gemm_ceiling(dt, c, gpu, dtype_peak, bf16_native=native, fallback=peak)

    def gemm_tflops_for(dt: str | None) -> float | None:
        return gemm_ceiling_for(dt)[0]

    def walk_one(mr: Measurement, chunks: list[float], call_index: int | None, repeats: list | None,
                 whole_spreads: dict[str, Any] | None):
        ev, sources = build_evidence(mr, moved=counts["moved_bytes"], amp=counts["sector_amplification_estimated"],
                                     prof=prof, wall_chunks_ms=chunks, flop_bound=flop_bound(mr), ncu=ncu,
                                     on_gpu=gpu, traffic_ratio=ratio)
        ev["n_ranks"] = 1  # one function on one device: K (rank tail) does not apply
        sources["n_ranks"] = "one function examined in one process on one device"
        if whole_spreads:
            ev["metric_spreads"] = merge_spreads(whole_spreads, ev.get("metric_spreads"))
        diag = diagnose({**ev, "metric_sources": sources})  # the walk prints what measured each answer
        slow = ev.get("slowdown_vs_floor")
        try:
            parts = build_parts(prof=prof, traffic=traffic, t_ms=mr.t_ms, gpu=gpu, copy_gbps=c.copy_gbps,
                                gemm_tflops_for=gemm_tflops_for, whole_floor_ms=mr.t_ms / slow if slow else None,
                                whole_slowdown=slow, e2e_slowdown=ev.get("e2e_slowdown"),
                                e2e_spread=(ev.get("metric_spreads") or {}).get("e2e_slowdown"),
                                out_keys=traffic.out_keys, ncu=ncu, lab_for=leaf_lab, cache_bytes=cache_b,
                                whole_leaf=diag.leaf_id, call_index=call_index, repeats=repeats, bf16_ok=bf16_ok,
                                gemm_ceiling_for=gemm_ceiling_for, per_op=per_op,
                                ceiling_band=band if repeats is not None else None)
        except Exception as e:  # the whole-function walk stands; the parts say why they are missing
            parts = Parts([], mr.t_ms, "", None, error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
        return ev, sources, diag, parts

    reps = []
    for r, (samples, chunks) in enumerate(zip(blocks.samples_ms, blocks.chunks_ms)):
        mr = dataclasses.replace(m, t_ms=statistics.median(samples), t_p10_ms=min(samples), t_p90_ms=max(samples))
        reps.append(walk_one(mr, chunks, r, None, None))
    ev0 = walk_one(m, blocks.pooled_chunks_ms, None, None, None)[0]
    sp = spreads_over([x[0] for x in reps], ev0, band)
    ev, sources, diag, parts = walk_one(m, blocks.pooled_chunks_ms, None, [x[3] for x in reps], sp)
    rep_leaves = [leaf_name(x[2].leaf_id, x[2].undecided.id if x[2].undecided else None) for x in reps]
    alts = alternatives({**ev, "metric_sources": sources}, diag, rep_leaves)
    return ev, sources, diag, parts, alts, rep_leaves


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
    from hwlab.core import hostwait

    per_chunk = max(1, min(20, int(chunk_ms / max(t_ms, 1e-3))))
    chunks = []
    k = 0
    net = getattr(dev, "type", "cpu") != "cuda"  # as the single calls: net of the run-queue wait
    for _ in range(n_chunks):
        synchronize(dev)
        w0 = hostwait.wait_ns() if net else None
        t1 = time.perf_counter()
        for _ in range(per_chunk):
            call(*arg_sets[k % len(arg_sets)])
            k += 1
        synchronize(dev)
        wall_ms = (time.perf_counter() - t1) * 1e3
        w1 = hostwait.wait_ns() if w0 is not None else None
        chunks.append(hostwait.net_ms(wall_ms, (w1 - w0) / 1e6 if w1 is not None else None) / per_chunk)
    return chunks


def _draft_incident(name: str, m: Measurement, c, diag: Diagnosis, dev, headline: Part | None = None,
                    alternatives: list[str] | None = None) -> incident_mod.Incident:
    """The draft incident: its fix is the headline part's (the part with the largest expected gain,
    on its own leaf and the actions that fit it) where a part heads, else the whole function's walk;
    a BORDERLINE headline says which leaves a re-run may land on."""
    rec = Evidence(kind="examine", machine=machine_info(dev), results=[m], ceilings=c.to_dict(),
                   versions=versions())
    leaf = diag.leaf
    if headline is not None and headline.leaf_id:
        hl = LEAVES[headline.leaf_id]
        action = headline.actions[0] if headline.actions else hl.actions[0]
        fix = (f"proposed (headline part {headline.name}, {headline.share_pct:.0f}% of the time, leaf {hl.id}, "
               f"{hl.title}): {action}")
    elif leaf:
        fix = f"proposed (leaf {leaf.id}, {leaf.title}): {leaf.actions[0]}"
    else:
        fix = "undecided: " + diag.explain().splitlines()[-1]
    if alternatives:
        fix += (f"; BORDERLINE: a re-run may land on {' or '.join(alternatives)}: re-run with more repeats "
                "before acting")
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
