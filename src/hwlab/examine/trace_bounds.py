"""What a profiler trace's timelines answer by themselves, without recorded shapes or a ceiling
(``hwlab examine --trace``, :mod:`hwlab.examine.from_trace`).

* **Bounds from the device timeline** (:func:`timeline_bounds`): the step's time over its device
  busy time bounds its slowdown over any floor from below (B), and the busy share bounds its
  DRAM share from above (F); each is used only where the bound itself decides the question.
* **The idle part** walks on that bound (its own floor is zero) with the source said
  (:func:`idle_from_timeline`).
* **Sync points** (:func:`sync_points`): host runtime calls that wait for the device inside the
  steps (:data:`hwlab.traces.trace_ops.SYNC_CALL`), named on the idle part's J as its cause.
"""
from __future__ import annotations

from typing import Any, Callable

from hwlab.diagnosis.flowchart import LEAVES, QUESTIONS, diagnose
from hwlab.examine.parts import PART_ACTIONS, WALK_SHARE_PCT, Parts
from hwlab.traces.trace_ops import OpTrace, StepWork

#: the flowchart's B threshold (slowdown over the floor) and F's estimated-DRAM threshold, which the
#: device timeline's bounds are set against (:func:`_timeline_bounds`)
B_THRESHOLD = next(c.threshold for c in QUESTIONS["B"].criteria if c.metric == "slowdown_vs_floor")
F_DRAM_THRESHOLD = next(c.threshold for c in QUESTIONS["F"].criteria if c.metric == "dram_pct_estimated")

def timeline_bounds(ev: dict[str, Any], src: dict[str, str], t_ms: float, busy_ms: float) -> None:
    """What the device timeline alone decides, as bounds (no shapes, no ceiling needed).

    * B: every kernel takes at least its floor, so the step's floor is at most its device busy time
      and ``step / busy`` is a lower bound on its slowdown over any floor. It answers B only where
      the bound itself reaches the threshold (1.5x: the device idles a third of the step or more);
      under it, B stays open (a bound below a threshold decides nothing).
    * F: the device moves no bytes while idle and at most its copy ceiling while busy, so the
      step's DRAM share is at most its busy share. Set only where that bound is under F's 60%
      (the device idles 40% of the step or more) and B was already answered from the bound."""
    if "slowdown_vs_floor" in ev or busy_ms <= 0 or t_ms <= 0:
        return
    lower = t_ms / busy_ms
    if lower < B_THRESHOLD:
        return
    ev["slowdown_vs_floor"] = lower
    src["slowdown_vs_floor"] = ("a lower bound from the device timeline: step time / device busy time (each kernel "
                                "takes at least its floor); needs no shapes and no peak rate")
    upper = 100.0 * busy_ms / t_ms
    if "dram_pct_estimated" not in ev and upper < F_DRAM_THRESHOLD:
        ev["dram_pct_estimated"] = upper
        src["dram_pct_estimated"] = ("an upper bound from the device timeline: the device's busy share of the step "
                                     "(no bytes move while it idles, at most the device's copy rate while busy)")


def idle_from_timeline(parts: Parts, ev: dict[str, Any], src: dict[str, str], lab_for: Callable[[str], str]) -> None:
    """The idle part walks on the step's slowdown (its own floor is zero): where that came from the
    device timeline's bound, re-walk it with that source said."""
    for p in parts.parts:
        if p.name == "gpu idle" and p.share_pct >= WALK_SHARE_PCT and "device timeline" in src["slowdown_vs_floor"]:
            p.evidence["slowdown_vs_floor"] = ev["slowdown_vs_floor"]
            p.sources["slowdown_vs_floor"] = src["slowdown_vs_floor"] + " (the idle part's own floor is zero)"
            p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
            leaf = p.leaf_id
            if leaf:
                fit = next((v for (pre, lf), v in PART_ACTIONS.items() if p.name.startswith(pre) and lf == leaf), ())
                p.actions = list(fit) + list(LEAVES[leaf].actions)
                p.lab = lab_for(leaf)


def sync_points(ot: OpTrace, works: list[StepWork], parts: Parts, notes: list[str]) -> None:
    """Host calls that wait for the device inside the steps (:data:`~hwlab.traces.trace_ops.SYNC_CALL`):
    each drains the device's queue, so the device idles while the host launches again. Named on
    J's idle part as its cause where the trace holds any (source: the host timeline)."""
    if not ot.syncs or not works:
        return
    wins = [(w.ts, w.ts + w.window_us) for w in works]
    inside = [sy for sy in ot.syncs if any(lo <= sy[0] < hi for lo, hi in wins)]
    if not inside:
        return
    names: dict[str, int] = {}
    for _, _, n in inside:
        names[n] = names.get(n, 0) + 1
    per = len(inside) / len(works)
    what = ", ".join(f"{n} x{k}" for n, k in sorted(names.items(), key=lambda kv: -kv[1]))
    notes.append(f"sync points: {per:.3g} host call(s) per step wait for the device ({what}) [host runtime calls "
                 "in the trace]: the device idles while the host launches again after each")
    for p in parts.parts:
        if p.name == "gpu idle" and p.leaf_id == "J":
            p.actions.insert(0, f"remove the sync point(s) from the step ({what} per the host timeline: .item(), "
                                ".cpu(), .tolist() or printing a device tensor, an explicit synchronize)")
            if isinstance(p.j, dict):
                p.j["sync_calls_per_step"] = per


#: a run of this many elementwise / reduction kernels back to back between two GEMM-class kernels is
#: a fusion candidate: each kernel boundary writes its output to DRAM and the next reads it back, which
#: one fused kernel (torch.compile, a Triton kernel) would not
FUSION_RUN_MIN = 3


def kernel_names(works: list[StepWork], parts: Parts, notes: list[str]) -> None:
    """What the kernel names and their order say, per step (source: the device timeline's names).

    * GEMM kernels on tensor cores or on the CUDA cores (SIMT ``sgemm``): a GEMM part whose kernels
      are all SIMT answers H yes (tensor-core use is nil: I, the dtype / MMA path) once B is
      decided; where the part has no floor, the note says so and names the recording that decides B.
    * FP8 GEMMs beside dequantising copies (M's fallback question).
    * Runs of at least :data:`FUSION_RUN_MIN` elementwise / reduction kernels between GEMM-class
      kernels: fusion candidates, counted with their time per step."""
    from hwlab.core.profiling import DEQUANT_KERNEL_MARKERS, kernel_class, part_class
    busy = [w for w in works if w.items]
    if not busy:
        return
    n_tc = n_simt = n_fp8 = n_deq = 0
    runs, run_us = 0, 0.0
    for w in busy:
        cur_n, cur_us, after_gemm = 0, 0.0, False
        for it in sorted(w.items, key=lambda x: x["ts"]):
            k = it["kernel"] or ""
            cls, tc = kernel_class(k)
            n_tc += tc is True and cls in ("gemm", "fp8-gemm")
            n_simt += tc is False and cls == "gemm"
            n_fp8 += cls == "fp8-gemm"
            n_deq += any(m in k.lower() for m in DEQUANT_KERNEL_MARKERS)
            pc = part_class(it["stack"][0] if it["stack"] else None, k)
            if pc.startswith("gemm"):
                if after_gemm and cur_n >= FUSION_RUN_MIN:
                    runs, run_us = runs + 1, run_us + cur_us
                cur_n, cur_us, after_gemm = 0, 0.0, True
            elif pc == "elementwise/reduction":
                cur_n, cur_us = cur_n + 1, cur_us + it["us"]
    n = len(busy)
    src = "[kernel names on the device timeline]"
    if n_tc or n_simt:
        line = (f"GEMM kernels per step: {n_tc / n:.3g} on tensor cores, {n_simt / n:.3g} SIMT (fp32 on the CUDA "
                f"cores, e.g. sgemm) {src}")
        if n_simt and not n_tc:
            line += ": tensor-core use is nil, so H answers yes (I: run the matmuls in bf16/fp16 or enable TF32) once B is"
            line += " decided"
        notes.append(line)
        for p in parts.parts:
            if p.name.startswith("gemm") and p.walk is not None and p.walk.undecided is not None and n_simt and not n_tc:
                p.notes.append(f"its GEMM kernels are SIMT only (no tensor-core kernel) {src}: at H this is I, "
                               "once B is decided")
    if n_fp8:
        notes.append(f"FP8 GEMM kernels: {n_fp8 / n:.3g} per step, beside {n_deq / n:.3g} dequantising copies {src}")
    if runs:
        notes.append(f"fusion candidates: {runs / n:.3g} run(s) per step of >= {FUSION_RUN_MIN} elementwise kernels "
                     f"between GEMM-class kernels, {run_us / n / 1e3:.4g} ms per step {src}: fused, each run's "
                     "intermediates would not cross DRAM")


def name_recordings(parts: Parts, has_ceiling: bool) -> None:
    """Each walked part that stops at B (no floor) says which recording would floor it: the op
    shapes (``record_shapes=True``) where its ops have none, a measured record of the machine
    where the trace names no datasheet GPU."""
    for p in parts.parts:
        w = p.walk
        if w is None or w.undecided is None or w.undecided.id != "B" or p.name == "host outside ops":
            continue
        if p.name == "gpu idle":
            bound = 1.0 / (1.0 - p.share_pct / 100.0) if p.share_pct < 100.0 else None
            if bound is not None:
                p.notes.append(f"the device timeline bounds the step's slowdown at {bound:.3g}x (step / busy), under "
                               f"B's {B_THRESHOLD:g}x: the step's floor decides B (the other parts' recordings below)")
            continue
        need = []
        if not p.attributable:
            need.append("the ops' shapes: record with torch.profiler(record_shapes=True) (PyTorch >= 1.9 writes "
                        "their dtypes)")
        if not has_ceiling:
            need.append("the machine's ceilings: pass --baseline with a doctor record of that machine "
                        "(hwlab doctor --out FILE on it)")
        if need:
            p.notes.append("to decide B this part needs " + " and ".join(need))
