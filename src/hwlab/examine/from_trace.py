"""``hwlab examine --trace``: a profiler trace in, the parts and their walks out, no re-run.

During an incident the engineer holds a trace, not the code and inputs. This module reads one
Kineto / Chrome trace (:mod:`hwlab.traces.trace_ops`, streaming, no torch), rebuilds each step's
op records from the recorded input shapes (:mod:`hwlab.traces.trace_shapes`) and splits the step
with the live examination's own code (:func:`hwlab.examine.parts.build_parts`): the same parts,
floors, walks and expected gains, so one reader serves both reports.

* **Steps.** Every ``ProfilerStep#N`` (or ``--step N`` alone). On a GPU trace a step's time is
  its window (its host range, extended to the end of the last device work it launched) and
  ``gpu idle`` is the window minus the union of its device intervals; on a CPU trace a step's
  time is its host range and ``host outside ops`` is the part of it outside aten ops. The
  headline parts are over all selected steps (per-step means, op records of the first selected
  step, as the live examination floors one call; on a CPU trace the mean shares applied to the
  median step, as live examine applies them to its measured median); each step is also split on
  its own and must add up (:data:`STEP_SUM_TOL_PCT`).
* **Ceilings** (:func:`ceilings_for`): a node record given with ``--baseline`` (measured, said
  so), else the datasheet of the GPU the trace's ``deviceProperties`` names
  (:mod:`hwlab.core.specs`, said to be a datasheet peak: a floor on peaks is lower than on
  measured ceilings, so gains are upper bounds). A CPU trace, or a GPU the datasheet table does
  not know, has no ceiling without ``--baseline``: its parts get shares and no floors.
* **Parts without shapes** (a trace recorded without ``record_shapes``, an op with a tensor
  list): no floor; walked on what the trace measures (:mod:`hwlab.examine.trace_bounds`): the
  device timeline bounds the step's slowdown from below (step / busy) and its DRAM share from
  above (busy share), each used only where the bound decides; the idle part is floored on the
  device's own gaps (host launch times against device start times), so a device waiting on its
  host walks to J (launch or sync) with that source said; host sync points are named. A part
  the bounds cannot decide stops at B,
  and the report names the recording that would decide it (``record_shapes=True``, a doctor
  record of the machine).
* **The annotated copy** (:func:`write_annotated`): the original events, unchanged, plus one
  ``X`` range per part per step on a track of its own (own pid and tid, named by ``M``
  metadata), laid end to end from the step's start, each as long as the part's time; the
  headline part's range is named ``... [headline]``. :func:`read_annotations` reads them back.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hwlab.traces.kineto import TraceError
from hwlab.core.profiling import KIT_CALL_FAULT_KEY, KIT_CALL_WAIT_KEY, KIT_UNPROFILED_MEDIAN_KEY, kernel_class
from hwlab.traces.trace_ops import KIT_CALL_MARK, OpTrace, StepWork, iter_trace, read_ops, step_items
from hwlab.traces.trace_shapes import ShapeModel
from hwlab.diagnosis.flowchart import LEAVES, diagnose
from hwlab.errors import UserInputError
from hwlab.examine.parts import Parts, build_parts, fused_floor_bytes
from hwlab.examine.trace_ceilings import TraceCeilings, ceilings_for  # noqa: F401 (re-exported)
from hwlab.examine.trace_bounds import (gemm_kernel_ms, host_side_gap, idle_split, idle_walk, kernel_names, name_recordings,
                                        sync_points, timeline_bounds)
from hwlab.examine.comm_overlap import comm_overlap
from hwlab.examine.fused_ops import fused_matmul
from hwlab.examine.pageable_copies import pageable_copies
from hwlab.examine.idle_causes import WARMUP_RATIO, apply_causes, idle_causes, warmup_steps, whole_step_gap
from hwlab.examine.trace_enough import MIN_STEP_US, NothingToDiagnose, enough_to_diagnose  # noqa: F401

#: each step's parts must add up to its time within this (the split keeps every item)
STEP_SUM_TOL_PCT = 5.0
#: the input dtype of a matmul -> the GEMM ceiling of its floor (the live examination's
#: PEAK_FOR_DTYPE: fp32 data can take the TF32 path; fp16 runs at the bf16 rate). A datasheet's own
#: fp16 figure, where it keeps one (V100 and T4 have no bf16), is used for fp16 first
PEAK_FOR_DTYPE = {"float32": "tf32", "bfloat16": "bf16", "float16": "bf16",
                  "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}
#: labs that teach a leaf whose flowchart entry names none (the live examination's LAB_FALLBACK)
LAB_FALLBACK = {"I": "06_case_studies (the dtype / MMA-path scenario)"}
#: the annotation track's names and category
TRACK_PROCESS = "hwlab examine: parts"
TRACK_THREAD = "parts per step (headline marked)"
ANNOTATION_CAT = "hwlab_part"
HEADLINE_MARK = " [headline]"


def leaf_lab(leaf_id: str) -> str:
    leaf = LEAVES.get(leaf_id)
    return (leaf.lab if leaf else "") or LAB_FALLBACK.get(leaf_id, "")


@dataclass
class _Profile:
    """What :func:`build_parts` reads of a live profile, from the trace."""
    calls: list
    call_us: list
    busy_ms_per_call: float
    error: str | None = None
    n_spills: int | None = None
    call_wait_us: list = field(default_factory=list)


@dataclass
class _Traffic:
    ops: list


def _records(work: StepWork) -> list:
    """The step's op records in the order their work first appears (so the k-th instance of an
    op name among the items is the k-th record of that name), then ops that launched nothing."""
    model = ShapeModel()
    recs: dict[int, Any] = {}
    for o in work.top_ops:  # shapes in op order: the identity estimate follows program order
        r = model.record(o.name, o.args, ext=id(o))
        if r is not None:
            recs[id(o)] = r
    order: list = []
    seen: set[int] = set()
    for it in sorted(work.items, key=lambda x: x["ts"]):
        top = it.get("top_op")
        if top is not None and id(top) in recs and id(top) not in seen:
            seen.add(id(top))
            order.append(recs[id(top)])
    order += [r for k, r in recs.items() if k not in seen]
    return order


@dataclass
class TraceExamination:
    """The result of :func:`examine_trace` (its ``to_dict`` keeps live examine's keys where the
    meaning is the same)."""
    path: str
    ot: OpTrace
    works: list[StepWork]
    ceilings: TraceCeilings
    parts: Parts
    per_step: list[dict[str, Any]]
    evidence: dict[str, Any]
    evidence_sources: dict[str, str]
    diagnosis: Any
    notes: list[str] = field(default_factory=list)
    annotated: str | None = None

    @property
    def on_gpu(self) -> bool:
        return self.ot.on_gpu

    @property
    def headline(self):
        return self.parts.headline

    @property
    def leaf_id(self) -> str | None:
        h = self.headline
        return h.leaf_id if h is not None else self.diagnosis.leaf_id

    @property
    def label(self) -> str:
        dev = ", ".join(sorted({str(d.get("name")) for d in self.ot.devices if d.get("name")})) or \
            ("a GPU the trace does not name" if self.on_gpu else "a CPU")
        kind = "GPU" if self.on_gpu else ("host ops only: no device kernels recorded" if
                                          self.ot.launches or self.ot.devices else "CPU")
        return (f"read from the profiler trace {Path(self.path).name} (recorded on {dev}; nothing re-run here) "
                f"[{kind}; ceilings: {self.ceilings.source}]")

    def to_dict(self) -> dict[str, Any]:
        d = self.diagnosis
        ot = self.ot
        n_items = sum(len(w.items) for w in self.works)
        return {
            "name": Path(self.path).name, "label": self.label, "on_gpu": self.on_gpu, "source": "trace",
            "trace": {"path": self.path, "n_events": ot.n_events, "rank": ot.rank, "step_source": ot.step_source,
                      "steps": [w.step for w in self.works], "devices": [d.get("name") for d in ot.devices],
                      "record_shapes": ot.record_shapes,
                      "device_events": sum(len(w.items) for w in self.works) if ot.on_gpu else 0,
                      "unlaunched_device_events": sum(w.n_unlaunched for w in self.works),
                      "items": n_items, "annotated": self.annotated},
            "ceilings": {**self.ceilings.to_dict()},
            "evidence": self.evidence, "evidence_sources": self.evidence_sources,
            "walk": {"path": d.path, "leaf": d.leaf_id, "undecided_at": d.undecided.id if d.undecided else None,
                     "steps": [{"question": s.question, "answer": s.answer, "metric": s.metric, "value": s.value,
                                "rule": s.criterion, "overridden": s.overridden, "how": s.how,
                                "source": self.evidence_sources.get(s.metric, "by hand")} for s in d.steps],
                     "explain": d.explain(), "actions": list(d.leaf.actions) if d.leaf else [],
                     "lab": leaf_lab(d.leaf_id) if d.leaf_id else ""},
            "notes": self.notes, "leaf": self.leaf_id, "whole_function_leaf": d.leaf_id,
            "parts": self.parts.to_dict(), "steps": self.per_step,
        }

    def to_json(self) -> str:
        from hwlab.core.store import dumps_strict

        return dumps_strict(self.to_dict())

    def report(self) -> str:
        ot = self.ot
        lines = [f"hwlab examine --trace: {Path(self.path).name}", f"  {self.label}",
                 f"  ceilings: {self.ceilings.label}" + (
                     f": copy {self.ceilings.copy_gbps:,.0f} GB/s, GEMM " + ", ".join(
                         f"{k} {v:,.1f}" for k, v in self.ceilings.gemm_tflops.items()) + " TFLOP/s"
                     if self.ceilings.copy_gbps else ""),
                 f"  steps from {ot.step_source}; {ot.n_events} events read"
                 + (f"; rank {ot.rank}" if ot.rank is not None else ""),
                 "", f"  {'step':>6s} {'ms':>10s} {'parts sum':>9s} {'items':>6s} {'unlaunched':>10s} {'shapes':>7s}"]
        for s in self.per_step:
            lines.append(f"  {s['step']:>6} {s['t_ms']:10.4g} {s['parts_sum_pct']:8.1f}% {s['n_items']:6d} "
                         f"{s['n_unlaunched']:10d} {s['ops_with_shapes_pct']:6.0f}%")
        lines += ["", "evidence of the whole step (source of each)"]
        lines += [f"  {k} = {v:.3g}   [{self.evidence_sources.get(k, '?')}]" if isinstance(v, float) else
                  f"  {k} = {v}   [{self.evidence_sources.get(k, '?')}]" for k, v in self.evidence.items()]
        lines += ["", "walk (the whole step, aggregate metrics)"] + \
            ["  " + s for s in self.diagnosis.explain().splitlines()]
        lines += [""] + self.parts.render()
        if self.leaf_id and leaf_lab(self.leaf_id):
            lines.append(f"  lab that teaches the headline leaf ({self.leaf_id}): notebooks/{leaf_lab(self.leaf_id)}")
        if self.annotated:
            lines.append(f"  annotated trace (parts on their own track, open in Perfetto): {self.annotated}")
        if self.notes:
            lines += ["", "notes"] + [f"  - {n}" for n in self.notes]
        return "\n".join(lines)


def _split(works: list[StepWork], recs: list, gpu: bool, c: TraceCeilings,
           unprofiled_ms: float | None = None,
           call_wait_us: list[float] | None = None) -> tuple[Parts, dict, dict, float | None]:
    """build_parts over ``works`` with ``recs`` (one step's records), and the whole step's
    evidence for the aggregate walk. ``unprofiled_ms``: on a CPU trace, the call's median measured
    without the profiler, where the trace carries it (see :func:`unprofiled_median_ms`);
    ``call_wait_us``: each step's run-queue wait, where the trace carries it (:func:`call_waits_us`),
    for steps that ran different ops (the parts then pool the quiet ones, as the live examination does)."""
    n = len(works)
    t_ms = sum(w.window_us for w in works) / n / 1e3
    if not gpu:  # as live: the shares of the profiled steps applied to the median step (robust to one slow step)
        t_ms = unprofiled_ms or statistics.median(w.window_us for w in works) / 1e3
    prof = _Profile(calls=[w.items for w in works], call_us=[w.host_dur_us for w in works],
                    busy_ms_per_call=sum(w.busy_us for w in works) / n / 1e3, call_wait_us=call_wait_us or [])
    # the whole step's floor: every op as if fused, FLOPs at the ceiling of its matmul dtype
    shaped = all(getattr(r, "shapes", True) for r in recs)
    fused_flops, fused_dt = fused_matmul(prof.calls)  # work inside fused native ops (the encoder fast path)
    flops = sum(r.flops for r in recs) + fused_flops
    mm_dt = next((r.in_dtypes[0] for r in recs if r.kind == "matmul" and r.in_dtypes), fused_dt)

    def gemm_for(dt: str | None) -> float | None:
        key = PEAK_FOR_DTYPE.get(dt or "", "bf16") if gpu else "fp32"
        if gpu and dt == "float16" and "fp16" in c.gemm_tflops:
            key = "fp16"
        return c.gemm_tflops.get(key)

    whole_floor = None
    ev: dict[str, Any] = {}
    src: dict[str, str] = {}
    if shaped and recs and c.copy_gbps:
        floor_b = fused_floor_bytes(recs, recs, set())
        tf = gemm_for(mm_dt) if flops else None
        cand = [floor_b / (c.copy_gbps * 1e6)] + ([flops / (tf * 1e9)] if tf else [])
        whole_floor = max(cand)
        if whole_floor > 0:
            ev["slowdown_vs_floor"] = t_ms / whole_floor
            src["slowdown_vs_floor"] = (f"step time / max(its ops' bytes as if fused / copy ceiling, FLOPs / GEMM "
                                        f"ceiling), from recorded shapes ({c.source} ceilings)")
        moved = sum(r.moved_bytes for r in recs)
        pct = 100.0 * moved / (t_ms * 1e6) / c.copy_gbps if t_ms > 0 else None
        if pct is not None and pct <= 100.0:
            ev["dram_pct_estimated"] = pct
            src["dram_pct_estimated"] = ("each op's recorded input and inferred output bytes / step time vs the "
                                         "copy ceiling")
        mm_flops = sum(r.flops for r in recs if r.kind == "matmul") + fused_flops
        gemm_ms = gemm_kernel_ms(works)
        if mm_flops and tf and gemm_ms and whole_floor and flops / (tf * 1e9) >= floor_b / (c.copy_gbps * 1e6):
            ev["tensor_pct_of_peak"] = 100.0 * mm_flops / (gemm_ms * 1e9) / tf
            src["tensor_pct_of_peak"] = ("matmul FLOPs from shapes / the GEMM-class kernels' own time (not the "
                                         "step's) vs the GEMM ceiling at its dtype")
    if gpu and t_ms > 0:
        ev["launch_gap_pct"] = max(0.0, min(100.0, 100.0 * (1 - prof.busy_ms_per_call / t_ms)))
        src["launch_gap_pct"] = "the step window minus its device busy time (union of kernel intervals), as a share"
        timeline_bounds(ev, src, t_ms, prof.busy_ms_per_call)
    if shaped and recs:
        ev["matmul_flops"] = int(flops)
        src["matmul_flops"] = "torch.utils.flop_counter's formulas over the recorded shapes" + (
            " (with the GEMMs and attention inside fused native ops)" if fused_flops else "")
        n_tc = sum(1 for w in works for it in w.items if it["kernel"] and _tc(it["kernel"])) / n
        ev["tensor_core_kernels"] = n_tc if gpu else 0
        src["tensor_core_kernels"] = ("tensor-core GEMM kernels per step (profiler names)" if gpu else
                                      "CPU: no tensor cores")
    # the idle part walks on the step's slowdown only where shapes floored the step; a bound from the
    # device timeline is the step's, not the idle's (its own floor: trace_bounds.idle_walk)
    from_shapes = "device timeline" not in src.get("slowdown_vs_floor", "")
    parts = build_parts(prof=prof, traffic=_Traffic(recs), t_ms=t_ms, gpu=gpu, copy_gbps=c.copy_gbps,
                        gemm_tflops_for=gemm_for, whole_floor_ms=whole_floor,
                        whole_slowdown=ev.get("slowdown_vs_floor") if from_shapes else None, e2e_slowdown=None,
                        out_keys=set(), lab_for=leaf_lab, cache_bytes=c.cache_bytes)
    if c.source == "datasheet":
        _relabel(parts, src)
    return parts, ev, src, whole_floor



#: GEMM dtypes the libraries run on tensor cores / MFMA only (a part in one of them is on the MMA path)
MMA_ONLY_DTYPES = ("bfloat16", "float16", "float8", "fp4")


def _datasheet_mma_rate(p) -> None:
    """An attention part under H's line against a **datasheet** peak does not answer H either (the
    note says why). A GEMM part at a dtype the libraries run on tensor cores / MFMA only, whose rate is under
    H's line against a **datasheet** peak, does not answer H: the MMA path is already taken (its
    kernels' dtype), and dense datasheet peaks are above what measured GEMMs reach on the same
    GPU, so a low share of one is no evidence of a wrong tile, dtype or path. The share moves to a
    note naming the measurement that decides H (this machine's GEMM rate at the dtype)."""
    pct = p.evidence.get("tensor_pct_of_peak")
    if p.name == "attention" and pct is not None and pct < 50.0:
        del p.evidence["tensor_pct_of_peak"]
        p.sources.pop("tensor_pct_of_peak", None)
        p.notes.append(f"its attention kernels run at {pct:.0f}% of the datasheet GEMM peak: attention (softmax, "
                       "masking, the KV reads of decoding) does not reach a dense GEMM's datasheet rate on any GPU, "
                       "so H (tensor-core use low) is not decided against it; pass --baseline with this machine's "
                       "measured record, or time the same shapes with SDPA / FlashAttention on it, to decide H")
        return
    dt = p.name.split(" ", 1)[1] if p.name.startswith("gemm ") else ""
    slow = p.evidence.get("slowdown_vs_floor")
    if pct is not None and dt.startswith(MMA_ONLY_DTYPES) and pct >= 50.0 and slow is not None and slow < 2.0:
        # at half the datasheet peak or more, its slowdown over a datasheet floor is within what measured
        # GEMMs fall short of the datasheet by: B is not decided against it either
        del p.evidence["slowdown_vs_floor"]
        p.sources.pop("slowdown_vs_floor", None)
        p.notes.append(f"its GEMMs run at {dt} at {pct:.0f}% of the datasheet {dt} peak ({slow:.3g}x its floor there): "
                       "measured GEMMs fall short of a datasheet peak by that much, so B (slow against the floor?) "
                       "is not decided against it; pass --baseline with this machine's measured GEMM rate "
                       "(hwlab doctor --out FILE on that machine) to decide B")
        return
    if pct is None or not dt.startswith(MMA_ONLY_DTYPES) or pct >= 50.0:
        return
    del p.evidence["tensor_pct_of_peak"]
    p.sources.pop("tensor_pct_of_peak", None)
    p.notes.append(f"its GEMMs run at {dt} (tensor cores / MFMA: the libraries run that dtype on nothing else) at "
                   f"{pct:.0f}% of the datasheet {dt} peak: a datasheet peak is above what measured GEMMs reach on "
                   "the same GPU, so H (tensor-core use low) is not decided against it; pass --baseline with this "
                   "machine's measured GEMM rate (hwlab doctor --out FILE on that machine) to decide H")


def _relabel(parts: Parts, src: dict[str, str]) -> None:
    """Datasheet ceilings are not measured: every floor and rate that used them says so (the
    walks are re-run with the corrected sources; sources never change an answer)."""
    tag = " (datasheet peak, not measured)"
    for p in parts.parts:
        _datasheet_mma_rate(p)
        if "ceiling" in p.floor_source:
            p.floor_source = p.floor_source.replace("the measured ", "the datasheet ") + tag
        for k, v in list(p.sources.items()):
            if "ceiling" in v and not v.endswith(tag):
                p.sources[k] = v.replace("the measured ", "the datasheet ") + tag
        if p.walk is not None:
            p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
    for k, v in list(src.items()):
        if "ceiling" in v and not v.endswith(tag):
            src[k] = v + tag


def _tc(name: str) -> bool:
    cls, tc = kernel_class(name)
    return bool(tc) and cls in ("gemm", "fp8-gemm")


def call_waits_us(ot: OpTrace, works: list[StepWork]) -> list[float] | None:
    """Each of ``works``' disturbance in us, from a trace ``hwlab examine`` wrote on a CPU: its run-queue
    wait (:data:`~hwlab.core.profiling.KIT_CALL_WAIT_KEY`, one per profiled call, in order), plus its
    page-fault time beyond the unprofiled calls' (:data:`~hwlab.core.profiling.KIT_CALL_FAULT_KEY`)
    where the trace carries that too, where every call is among ``works``; else None (each step then
    counts, as for any other trace). The parts rank the calls by it as the live examination did."""
    def valid(v: Any) -> list[float] | None:
        if not isinstance(v, list) or len(v) != len(works):
            return None
        ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in v)
        return [float(x) for x in v] if ok else None

    if KIT_CALL_MARK not in ot.step_source:
        return None
    waits, faults = valid(ot.meta.get(KIT_CALL_WAIT_KEY)), valid(ot.meta.get(KIT_CALL_FAULT_KEY))
    if waits is None:
        return None
    return [w + f for w, f in zip(waits, faults)] if faults is not None else waits


def unprofiled_median_ms(ot: OpTrace) -> float | None:
    """The call's median measured without the profiler, from a trace ``hwlab examine`` wrote
    (:data:`~hwlab.core.profiling.KIT_UNPROFILED_MEDIAN_KEY`, steps from its call ranges); None for
    any other trace, whose step times are all there is (and carry the profiler's own cost)."""
    v = ot.meta.get(KIT_UNPROFILED_MEDIAN_KEY)
    if KIT_CALL_MARK not in ot.step_source or isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) and v > 0 else None


def examine_trace(path: str | os.PathLike, *, step: int | None = None, baseline: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> TraceExamination:
    """Read one trace and split its steps into parts (module doc)."""
    ot = read_ops(path, progress)
    works = step_items(ot)
    if step is not None:
        works = [w for w in works if w.step == step]
        if not works:
            raise UserInputError(f"--step {step}: the trace has steps {', '.join(str(s['step']) for s in ot.steps)}; "
                                 "pass one of them")
    works = [w for w in works if w.window_us > 0]
    if not works:
        raise UserInputError(f"{path}: no step with any time in it: pass a trace of a profiled run")
    c = ceilings_for(ot, baseline)
    gpu = ot.on_gpu
    notes = [f"steps from {ot.step_source}"]
    per_step, only = [], None  # only: the one step's split, reused as the whole (the same arguments)
    for w in works:
        recs = _records(w)
        if w.items:
            whole = _split([w], recs, gpu, c)
            p1, only = whole[0], (w, recs, whole) if len(works) == 1 and gpu else None
            split = {p.name: {"t_ms": p.t_ms, "share_pct": p.share_pct} for p in p1.parts}
            head = p1.headline.name if p1.headline else None
        else:  # no timed work: the whole step is the rest part
            split = {"gpu idle" if gpu else "host outside ops": {"t_ms": w.window_us / 1e3, "share_pct": 100.0}}
            head = None
        n_top = len(recs)
        n_shaped = sum(1 for r in recs if r.shapes)
        total = sum(v["t_ms"] for v in split.values())
        per_step.append({"step": w.step, "t_ms": w.window_us / 1e3, "host_ms": w.host_dur_us / 1e3,
                         "busy_ms": w.busy_us / 1e3 if gpu else None, "n_items": len(w.items),
                         "n_unlaunched": w.n_unlaunched, "ops": n_top,
                         "ops_with_shapes_pct": 100.0 * n_shaped / n_top if n_top else 0.0,
                         "parts_sum_ms": total, "parts_sum_pct": 100.0 * total * 1e3 / w.window_us,
                         "parts": split, "headline": head})
    busy = [w for w in works if w.items]
    if not busy:
        raise UserInputError(f"{path}: the selected step(s) hold no device kernel and no host op on the step's "
                             "thread (work on other threads only, e.g. gloo workers: read those with hwlab ranks "
                             "--traces); pass another --step or a trace of the step's own work")
    if len(busy) < len(works):
        notes.append(f"step(s) {', '.join(str(w.step) for w in works if not w.items)} ran no timed work (all "
                     "idle): in the per-step table, left out of the means")
    enough_to_diagnose(path, ot, busy, gpu)
    warm = warmup_steps(busy) if gpu else []
    if warm:  # first-call steps: left out of the parts and their gains (idle_causes module doc)
        busy = [w for w in busy if w.step not in warm]
        notes.append(f"step(s) {', '.join(map(str, warm))} ran over {WARMUP_RATIO:g}x the later steps' median: warm-up "
                     "(first calls: init, autotune, compile), left out of the parts and their gains")
    only = only if only is not None and busy == [only[0]] else None
    recs0 = only[1] if only else _records(busy[0])
    unprofiled = None if gpu else unprofiled_median_ms(ot)
    parts, ev, src, _ = only[2] if only else _split(busy, recs0, gpu, c, unprofiled, call_waits_us(ot, busy))
    if unprofiled is not None:
        notes.append(f"the call's median measured without the profiler ({unprofiled:.4g} ms), which the live "
                     "examination wrote into this trace, is the step time the parts share (as live)")
    parts.notes = [n if not n.startswith("CPU: part times are shares") else
                   f"CPU trace: part times are the steps' shares of aten op self time applied to the median step "
                   f"({parts.t_ms:.4g} ms)" for n in parts.notes]
    works_all, works = works, busy
    if len(works) > 1:
        notes.append(f"parts are means over {len(works)} steps; floors from the ops of step {works[0].step} "
                     "(as a live examination floors one call)")
    dims_only = any(o.args.get("Input Dims") and not o.args.get("Input type") for o in busy[0].top_ops)
    if not any(r.shapes for r in recs0) and dims_only:
        notes.append("this trace records input dims but no dtypes (PyTorch 1.8 wrote 'Input type' empty): no bytes, "
                     "no floors, so B (slow against the floor?) stays undecided unless the device timeline decides "
                     "it; record with a PyTorch >= 1.9 profiler and record_shapes=True to floor each part")
    elif not any(r.shapes for r in recs0):
        notes.append("no input shapes in this trace: no floors, so B (slow against the floor?) stays undecided "
                     "unless the device timeline decides it; record with torch.profiler(record_shapes=True) to "
                     "floor each part")
    elif not all(r.shapes for r in recs0):
        notes.append(f"{sum(1 for r in recs0 if not r.shapes)} of {len(recs0)} ops have no usable shapes (tensor "
                     "lists, unknown types): the parts holding them are not floored")
    if any(r.shapes for r in recs0) and c.copy_gbps:
        notes.append(f"wasted traffic (F) judged against a last-level cache of {c.cache_bytes / 2**20:,.4g} MiB "
                     f"({c.cache_source})" if c.cache_bytes else
                     "the recording machine's last-level cache is not in this trace: F's wasted-traffic bound "
                     "(DRAM bytes >= moved - cache x op boundaries) is not computed, so F is answered on the "
                     "DRAM share alone; pass --baseline with that machine's hwlab examine record to use its cache")
    if any(r.shapes for r in recs0):
        notes.append("tensor identity is not in a trace: an op's input is taken to be the latest earlier output of "
                     "the same element count and dtype (the fused floors are estimates)")
    n_un = sum(w.n_unlaunched for w in works)
    if n_un:
        notes.append(f"{n_un} device events have no launch record in the trace: kept, classed by kernel name "
                     "and counted in the step whose window holds their start")
    if c.source == "datasheet":
        notes.append("ceilings are datasheet peaks, not measured: each floor is lower than on measured ceilings, "
                     "each gain an upper bound; pass --baseline with the node's measured record")
    elif c.source == "none":
        notes.append(c.label)
    if not gpu and (ot.launches or any(d.get("name") for d in ot.devices)):
        notes.append("the trace names a GPU (or holds its runtime calls) but recorded no device kernels: these parts "
                     "are host op times, not GPU time; record with ProfilerActivity.CUDA for the device's parts")
    if not gpu:
        notes.append("CPU trace: aten op self times; no GPU kernels, no launch-gap figure; the walk is indicative. "
                     "They include the profiler's own per-op cost (recording shapes adds to it): ops of a few "
                     "microseconds read slower than they run unprofiled (a GPU trace's kernel times do not)")
    if gpu:
        splits, skew_us = idle_split(works, ot.syncs)
        idle_walk(parts, splits, skew_us, notes, leaf_lab)
        host_side_gap(ev, src, splits, parts.t_ms)
    sync_points(ot, works, parts, notes)
    if gpu:
        ic = idle_causes(ot, works)
        apply_causes(parts, ic, notes)
        whole_step_gap(ev, src, ic, parts.t_ms)
        kernel_names(works, parts, notes)
        comm_overlap(works, parts)
        pageable_copies(works, parts, notes)
    name_recordings(parts, c.copy_gbps is not None)
    if ot.n_bad_times:
        notes.append(f"{ot.n_bad_times} event(s) with a NaN, infinite or negative time were left out (a NaN would "
                     "shift every share)")
    diag = diagnose({**ev, "metric_sources": src})
    return TraceExamination(path=str(path), ot=ot, works=works_all, ceilings=c, parts=parts, per_step=per_step,
                            evidence=ev, evidence_sources=src, diagnosis=diag, notes=notes)



# ------------------------------------------------------------------ the annotated copy
def annotation_events(ex: TraceExamination) -> list[dict[str, Any]]:
    """The added events: track metadata, then one X range per part per step (module doc)."""
    pids = [k[0] for k in ex.ot.host if isinstance(k[0], int)] + \
        [d.device for d in ex.ot.device if isinstance(d.device, int)]
    pid = max(pids + [0]) + 1  # a process id no original event uses: the track is its own
    evs: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": TRACK_PROCESS}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": TRACK_THREAD}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}}]
    by_step = {s["step"]: s for s in ex.per_step}
    agg = {p.name: p for p in ex.parts.parts}
    head = ex.parts.headline.name if ex.parts.headline else None
    for w in ex.works:
        s = by_step[w.step]
        t = w.ts
        for name, v in sorted(s["parts"].items(), key=lambda kv: -kv[1]["t_ms"]):
            if v["t_ms"] <= 0:
                continue
            p = agg.get(name)
            dur = v["t_ms"] * 1e3
            evs.append({"ph": "X", "cat": ANNOTATION_CAT, "name": name + (HEADLINE_MARK if name == head else ""),
                        "pid": pid, "tid": 0, "ts": t, "dur": dur,
                        "args": {"part": name, "step": w.step, "share_pct": round(v["share_pct"], 3),
                                 "t_ms": v["t_ms"], "headline": name == head,
                                 "leaf": p.leaf_id if p else None,
                                 "floor_ms": p.floor_ms if p else None,
                                 "expected_gain_ms": p.saved_ms if p else None}})
            t += dur
    return evs


def annotated_path(out: Path) -> Path:
    """``X.json`` -> ``X.annotated.trace.json.gz`` beside it."""
    stem = out.name[:-5] if out.name.endswith(".json") else out.name
    return out.with_name(stem + ".annotated.trace.json.gz")


def write_annotated(ex: TraceExamination, dest: Path, overwrite: bool = False) -> Path:
    """Stream the original trace into ``dest`` (gzip), every event unchanged, plus the added
    ones; atomically (a temporary file in the same folder, then renamed)."""
    from hwlab.core.store import check_destination, publish, temp_beside

    dest = check_destination(dest, overwrite=overwrite, inputs=[ex.path])
    added = annotation_events(ex)
    with temp_beside(dest) as tmp:  # removed on any failure or SIGTERM (core.store)
        with open(tmp, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                meta: list[tuple[str, Any]] = []
                gz.write(b'{"traceEvents":[')
                first = True
                for key, v in iter_trace(ex.path):
                    if key != "event":
                        meta.append((key, v))  # the other top-level keys follow the events
                        continue
                    gz.write((("" if first else ",") + json.dumps(v, separators=(",", ":"))).encode())
                    first = False
                for e in added:
                    gz.write((("" if first else ",") + json.dumps(e, separators=(",", ":"))).encode())
                    first = False
                gz.write(b"]")
                for key, v in meta:
                    gz.write(("," + json.dumps(key) + ":" + json.dumps(v, separators=(",", ":"))).encode())
                gz.write(b"}")
            raw.flush()
            os.fsync(raw.fileno())
        publish(tmp, dest, overwrite=overwrite)  # never over what appeared meanwhile without --force
    ex.annotated = str(dest)
    return dest


def read_annotations(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The ranges :func:`write_annotated` added to a trace (the kit's reader reads them back)."""
    try:
        return [v for k, v in iter_trace(path) if k == "event" and isinstance(v, dict)
                and v.get("cat") == ANNOTATION_CAT and v.get("ph") == "X"]
    except TraceError:
        raise
