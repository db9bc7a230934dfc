"""The seed's diagnosis flowchart as data, and :func:`diagnose` that walks it on evidence.

::

    A 性能异常 -> B slow in a single-GPU microbenchmark?
       B yes -> F memory path saturated? -> yes: G bandwidth / layout / fusion
                                         -> no : H Tensor-Core use low? -> yes: I tile / dtype / MMA path
                                                                       -> no : J launch / occupancy / registers
       B no  -> D slow only multi-GPU or in service? -> yes: K rank tail? -> yes: L NCCL / NVLink / NUMA / rank mapping
                                                                         -> no : M shape bucket / cache / fallback
                                                    -> no : OK nothing to fix at this level

K asks about ranks, so it applies only where ranks were measured: evidence whose ``n_ranks`` is
under 2 (one process, one device) answers K "not applicable" and the walk takes M.

Every question names the metric that answers it, its unit, its threshold and the reason
for that threshold, and the probe that measures it. Evidence is a plain dict of metric ->
value; a question whose metrics are all missing stops the walk with "cannot decide: run
<probe>". Thresholds are heuristics: the docstrings say why, so you can disagree knowingly.

Every step of a walk records how it was answered (:attr:`Step.how`): ``"measured"`` from a
numeric metric a probe produced (with what measured it, from the evidence's optional
``metric_sources``, and ``n_ranks`` behind a rank tail), or ``"by hand"`` from a yes/no a person
typed (the questions' ``bool_metric``, used only when no metric is present). Printed walks
show it per step, and a walk with a by-hand answer ends in a NOTE saying so
(:attr:`Diagnosis.by_hand`, :attr:`Diagnosis.fully_measured`).

Three checks sit beside each measured answer (:mod:`hwlab.diagnosis.flowchart_checks` holds the rules):

* **validity first**: each metric has a physical range (:data:`PHYSICAL_RANGES`, e.g. a DRAM share
  at most 100% of the reachable copy rate, a sector amplification at least 1); a value outside it
  is not evidence: the walk names it, says why and what to re-measure, and decides on the
  question's other metrics or stops there (:attr:`Diagnosis.invalid`);
* **borderline**: with the evidence's optional ``metric_spreads`` (metric -> ``[lo, hi]``: the
  p10-p90 or the repeats' range), a threshold inside the spread marks the step borderline: it
  names the other branch and what to re-run; a metric without a spread says "spread not
  recorded" rather than inventing one (:attr:`Step.borderline`);
* **estimated, not measured**: a metric from a model of bytes or FLOPs over a measured time
  (``*_estimated``, or listed in the evidence's ``metric_estimated``) is shown as estimated, and
  a walk that used one never says "every answer was measured".

After the leaf, lenses add what the leaf alone hides (:func:`hwlab.diagnosis.flowchart_checks.lenses`): the
overlap a slow link allowed, and the floor of lower-byte alternatives near a step's own floor.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

from hwlab.core.roofline import evidence_from_measurement  # noqa: F401  (re-exported: built on the core floor)
from hwlab.diagnosis import flowchart_checks as checks
from hwlab.diagnosis.flowchart_checks import PHYSICAL_RANGES  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Criterion:
    metric: str
    op: str  # ">=", ">", "<", "<="
    threshold: float
    unit: str
    reason: str

    def holds(self, value: float) -> bool:
        return {">=": operator.ge, ">": operator.gt, "<": operator.lt,
                "<=": operator.le}[self.op](value, self.threshold)

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g} {self.unit}"


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    criteria: tuple[Criterion, ...]  # answer is "yes" if ANY present criterion holds
    probe: str
    yes: str
    no: str
    bool_metric: str | None = None  # a by-hand yes/no answer, e.g. from the learner
    #: evidence that answers "no" outright, checked first (see the Tensor-Core question)
    overrides_no: tuple[Criterion, ...] = ()
    #: evidence that makes the question not apply: when every one of these is present and
    #: holds, the step is answered "not applicable" (measured) and the walk takes ``no``
    not_applicable: tuple[Criterion, ...] = ()


@dataclass(frozen=True)
class Leaf:
    id: str
    title: str
    actions: tuple[str, ...]
    lab: str = ""


QUESTIONS: dict[str, Question] = {q.id: q for q in [
    Question("B", "Slow even in a single-GPU microbenchmark?", (
        Criterion("slowdown_vs_floor", ">=", 1.5, "x",
                  "time over the roofline floor (required bytes / measured copy bandwidth, "
                  "FLOPs / measured GEMM rate, whichever is larger). Within 1.5x of the floor "
                  "a kernel has little left to win; beyond it, the kernel itself is slow."),),
        probe="the kernel's own probe (hwlab.core.measure.bench) against this machine's ceilings",
        yes="F", no="D", bool_metric="single_gpu_slow"),
    Question("F", "Is the memory path saturated (DRAM near peak, or wasted traffic)?", (
        Criterion("dram_pct_of_peak", ">=", 50.0, "% of theoretical peak (counted by Nsight Compute)",
                  "dram__throughput as % of the theoretical peak. Even a large copy stays "
                  "below the peak (the measured copy ceiling is the reachable part), and short "
                  "kernels lose more to ramp-up, so half the peak already means DRAM is the "
                  "limiter; the fix is fewer bytes (fusion, dtype, layout), not more compute."),
        Criterion("dram_pct_estimated", ">=", 60.0, "% of measured copy bandwidth (estimated)",
                  "bytes the kernel moves by the lab's traffic model over time, against the "
                  "copy bandwidth this machine measured; used where counters are absent."),
        Criterion("dram_pct_required_estimated", ">=", 60.0,
                  "% of measured copy bandwidth, required bytes only (estimated)",
                  "the bytes the work must move (each input and output once) over its time: DRAM "
                  "traffic it cannot avoid. It decides where the moved-bytes estimate is invalid "
                  "(over 100% of the copy rate: the re-read bytes came from a cache, not DRAM)."),
        Criterion("sector_amplification", ">=", 2.0, "x sectors per request over ideal",
                  "uncoalesced access: each warp request touches more 32-byte sectors than "
                  "the bytes it needs (ideal 4 for 4-byte lanes); >= 2x means half or more of "
                  "the memory transactions are waste: a layout problem."),
        Criterion("traffic_ratio_estimated", ">=", 2.0, "x DRAM bytes at least, over required bytes (estimated)",
                  "a lower bound on DRAM bytes over the bytes the work requires: DRAM bytes >= moved - "
                  "cache x op boundaries (at each op boundary a last-level cache can hand at most its own "
                  "size of what earlier ops left to the next op; every other moved byte crosses DRAM). "
                  ">= 2x means half or more of the DRAM traffic re-reads intermediates, wasted as uncoalesced "
                  "sectors are: fuse the chain so each byte crosses DRAM once."),),
        probe="ncu --metrics dram__throughput...,l1tex__t_sectors/requests (or the lab's traffic model)",
        yes="G", no="H"),
    Question("H", "Is Tensor-Core use low?", (
        Criterion("tensor_pct_of_peak", "<", 50.0, "% of this machine's measured GEMM rate",
                  "a matmul-heavy kernel under half the rate cuBLAS reaches on this card at "
                  "its dtype is missing the MMA path (wrong dtype, fp32 without TF32, "
                  "unaligned shapes, a tile the compiler cannot map to wgmma/mma)."),
        Criterion("tensor_pipe_pct", "<", 50.0, "% tensor pipe active (counted)",
                  "Nsight Compute's sm__pipe_tensor_op_*_cycles_active: under half busy."),),
        probe="hwlab.core.probes.gemm at the kernel's dtype, or ncu tensor-pipe metric",
        yes="I", no="J",
        overrides_no=(
            Criterion("n_spills", ">", 0, "4-byte local-memory slots (compiler report)",
                      "a spilling kernel starves its tensor cores on local-memory traffic: low "
                      "Tensor-Core use is the symptom, registers are the cause, so the walk "
                      "goes to the registers leaf, not to the MMA path."),
            Criterion("launch_gap_pct", ">=", 50.0, "% of the step the GPU sits idle",
                      "when the GPU idles between launches for half the step or more, no kernel "
                      "change helps: the launch path is the limiter."),
        ),
        not_applicable=(
            Criterion("matmul_flops", "<=", 0, "FLOPs of matmul-family ops (counted)",
                      "Tensor-Core use is a question about matmul work; with none counted there is "
                      "nothing for the tensor cores to do (a gather, a sort, an elementwise pass)."),
            Criterion("tensor_core_kernels", "<=", 0, "tensor-core kernels per call (profiler names)",
                      "and no tensor-core kernel ran, so no matmul hid from the counter: the walk "
                      "goes on to launch, occupancy, registers and latency."),
        )),
    Question("D", "Slow only on several GPUs or in service?", (
        Criterion("e2e_slowdown", ">=", 1.2, "x",
                  "end-to-end step or TPOT over what the single-GPU probes predict; 20% is "
                  "beyond run-to-run noise of a serving benchmark."),),
        probe="the service's step time / TPOT against the single-GPU prediction",
        yes="K", no="OK", bool_metric="multi_gpu_or_service_slow"),
    Question("K", "Do some ranks finish late (a rank tail)?", (
        Criterion("rank_tail_pct", ">=", 10.0, "% of median step time",
                  "the slowest rank's time minus the on-time ranks' median, over the median step "
                  "(hwlab.core.tails.tail_pct_of_step): a tail of 10% or more means one rank's link, "
                  "NUMA placement or card holds all others at the collective."),
        Criterion("collective_floor_pct", ">=", 25.0, "% of the median step",
                  "time the collective takes once every rank has arrived (the last arriver's "
                  "time inside it), summed per step: when even the last rank to arrive spends a "
                  "quarter of the step inside collectives, the link holds every rank, with no rank "
                  "to blame: a slow or saturated link, which L's actions address, not M's."),),
        probe="per-rank step-time distribution (the cross-link TP lab); per-collective arrival from profiler traces",
        yes="L", no="M", bool_metric="rank_tail",
        not_applicable=(
            Criterion("n_ranks", "<", 2, "ranks measured",
                      "a rank tail needs at least two ranks to compare; a single process (one function "
                      "examined on one device, a one-process service) has none, so a slowdown in "
                      "service is its own: shapes, caches or fallbacks, not a late rank."),)),
]}

LEAVES: dict[str, Leaf] = {l.id: l for l in [
    Leaf("G", "bandwidth / layout / fusion", (
        "count bytes moved vs bytes required; fuse the chain so each byte crosses DRAM once",
        "make the fastest-moving index contiguous (coalesced), or transpose through shared memory",
        "move fewer bytes: a smaller dtype for activations / KV cache"), "01_bandwidth_bound"),
    Leaf("I", "tile / dtype / MMA path", (
        "run the matmul in bf16/fp16/fp8 or enable TF32 for fp32",
        "pad shapes to multiples of 16 (bf16) / 32 (fp8) so the MMA path is taken",
        "check the tile maps onto wgmma/mma (BLOCK_K >= 16, warps matching the tile)"), ""),
    Leaf("J", "launch / occupancy / registers", (
        "read registers, spills and occupancy from the compiler report",
        "shrink the tile or split an over-fused kernel until spills are gone",
        "capture many small launches in a CUDA graph, or fuse them"), "02_registers_occupancy"),
    Leaf("L", "NCCL / NVLink / NUMA / rank mapping", (
        "save nvidia-smi topo -m and the rank-to-device map; find pairs crossing SYS/PCIe",
        "regroup TP ranks onto NVLink-adjacent GPUs; bind processes to the GPU's NUMA node",
        "log NCCL's chosen route (NCCL_DEBUG=INFO) and per-rank step times",
        "rule 3c, did the overlap really happen: overlap_hidden_pct (time saved over what could hide, "
        "min(comm alone, compute alone)) under 50% leaves it on the critical path; at 50% or more, "
        "a link whose all-reduce outlasts the compute is the limiter: move the traffic off it"),
        "03_cross_link_tp"),
    Leaf("M", "shape bucket / cache / fallback", (
        "benchmark the real shape mix, not one tuned shape; split prefill and decode",
        "count fallback / dequant kernels per step (kernel hit rate)",
        "check caches (KV, autotune, compile) hit in service"), "04_fp8_dequant_fallback"),
    Leaf("OK", "nothing to fix at this level", (
        "the kernel is within 1.5x of its floor and nothing is slow at scale",
        "re-check the symptom: compare with the node baseline"), ""),
]}

#: a leaf's actions for the workload kind the evidence states (``evidence["workload"]``, e.g. from
#: the backward ops and optimizer steps a profiler trace holds); the seed's M actions are a
#: service's (prefill/decode, KV cache), a training job's shape, compile and input questions differ
LEAF_VARIANTS: dict[tuple[str, str], Leaf] = {
    ("M", "training"): Leaf("M", "shape bucket / cache / fallback (training job)", (
        "benchmark the real batch / sequence-length mix; pad or bucket shapes so compiled graphs and "
        "autotuned kernels are reused (count recompiles: TORCH_LOGS=recompiles)",
        "count fallback / dequant kernels per step in forward and backward (kernel hit rate)",
        "check the input pipeline between steps: dataloader workers, pinned memory, host-to-device copies",
        "check caches (autotune, compile) hit across steps, not only in the first"), "04_fp8_dequant_fallback"),
}

START = "B"


#: how a question was answered: from a metric a probe measured, or by a person
MEASURED, BY_HAND = "measured", "by hand"
#: a number a person typed (an observations file, listed in the evidence's ``metric_given``): not
#: measured by hwlab, so shown as given and never counted as measured
GIVEN = "given"
#: the answer of a question whose ``not_applicable`` evidence all holds (walk takes ``no``)
NOT_APPLICABLE = "not applicable"


@dataclass
class Step:
    question: str
    text: str
    answer: str  # "yes" | "no" | "not applicable" (NOT_APPLICABLE: the walk takes "no")
    metric: str
    value: Any
    criterion: str
    reason: str
    overridden: bool = False
    #: "measured" (a numeric metric a probe produced), "by hand" (a yes/no someone typed) or
    #: "given" (a number someone typed)
    how: str = MEASURED
    #: what measured it, from the evidence's ``metric_sources`` (None: not stated)
    source: str | None = None
    #: ranks the rank-tail figure was measured over (the K question), when the evidence says
    n_ranks: int | None = None
    #: the metric's measured spread ``(lo, hi)`` and what it is (p10-p90, repeats), None: not recorded
    spread: tuple[float, float] | None = None
    spread_what: str = ""
    #: the threshold lies inside the spread: a re-run may take ``other_branch``
    borderline: bool = False
    other_branch: str = ""
    #: the metric is a model's estimate (bytes or FLOPs by a model over a measured time)
    estimated: bool = False

    @property
    def by_hand(self) -> bool:
        """Answered by a person (a yes/no, or a number they typed), not by a measurement."""
        return self.how in (BY_HAND, GIVEN)

    def provenance(self) -> str:
        if self.how == GIVEN:
            return "[GIVEN by the user, not measured by hwlab" + (f": {self.source}" if self.source else "") + "]"
        if self.by_hand:
            return "[BY HAND: not measured]"
        extra = [self.source] if self.source else []
        if self.n_ranks is not None:
            extra.append(f"over {self.n_ranks} rank{'s' if self.n_ranks != 1 else ''}")
        head = "[ESTIMATED by a model over measured times" if self.estimated else "[measured"
        return head + (": " + "; ".join(extra) if extra else "") + "]"

    def spread_text(self) -> str:
        """The spread beside the value, and BORDERLINE with what to re-run when the threshold is inside it."""
        if self.by_hand:
            return ""
        if self.spread is None:
            return " (spread not recorded)"
        lo, hi = self.spread
        what = f", {self.spread_what}" if self.spread_what else ""
        if not self.borderline:
            return f" (spread {_fmt(lo)}-{_fmt(hi)}{what})"
        return (f" BORDERLINE: spread {_fmt(lo)}-{_fmt(hi)}{what} contains the threshold; one re-run may "
                f"take the other branch ({self.other_branch}): re-run with more repeats or a longer input "
                "before acting on this answer")

    def __str__(self) -> str:
        if self.answer == NOT_APPLICABLE:
            return (f"{self.question}. {self.text} -> NOT APPLICABLE, takes the NO branch ({self.metric} = "
                    f"{_fmt(self.value)}; rule {self.criterion}): {self.reason} {self.provenance()}")
        if self.overridden:
            return (f"{self.question}. {self.text} -> takes the NO branch: {self.metric} = "
                    f"{_fmt(self.value)} ({self.criterion}) explains it first: {self.reason} "
                    f"{self.provenance()}{self.spread_text()}")
        return (f"{self.question}. {self.text} -> {self.answer.upper()} "
                f"({self.metric} = {_fmt(self.value)}; rule {self.criterion}) {self.provenance()}"
                f"{self.spread_text()}")

    def compact(self) -> str:
        """The step in a few characters: ``F YES 60.8%``, ``H NO (n_spills 178)``, ``H N/A``."""
        if self.answer == NOT_APPLICABLE:
            return f"{self.question} N/A"
        if self.by_hand:
            return f"{self.question} {self.answer.upper()} (by hand)"
        unit = self.criterion.split(" ", 3)[3] if self.criterion.count(" ") >= 3 else ""
        unit = "x" if unit.startswith("x") else "%" if unit.startswith("%") else ""
        val = ("~" if self.estimated else "") + _fmt(self.value) + unit
        head = (f"{self.question} NO ({self.metric} {val})" if self.overridden
                else f"{self.question} {self.answer.upper()} {val}" if unit
                else f"{self.question} {self.answer.upper()} ({self.metric} {val})")
        return head + (" BORDERLINE" if self.borderline else "")

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "metric": self.metric,
                "value": self.value, "rule": self.criterion, "overridden": self.overridden,
                "how": "estimated" if self.estimated and not self.by_hand else self.how,
                "source": self.source, "n_ranks": self.n_ranks,
                "spread": list(self.spread) if self.spread else None,
                "spread_what": self.spread_what or None, "borderline": self.borderline,
                "other_branch": self.other_branch or None}


@dataclass
class Diagnosis:
    steps: list[Step] = field(default_factory=list)
    leaf: Leaf | None = None
    undecided: Question | None = None
    #: metrics present but outside their physical range: not used as evidence (:class:`~hwlab.diagnosis.flowchart_checks.Invalid`)
    invalid: list = field(default_factory=list)
    #: lines the lenses add after the leaf (overlap against what could hide, fewer bytes)
    lens_notes: list[str] = field(default_factory=list)
    #: the evidence was measured on a SHARED GPU (``evidence["gpu_shared"]``, :func:`hwlab.core.gpu_share.judge`):
    #: every answer says so, since another process's kernels may have moved each figure
    shared: dict | None = None

    def _shared_tag(self) -> str:
        return " [SHARED GPU: may differ from a quiet run]" if self.shared else ""

    @property
    def leaf_id(self) -> str | None:
        return self.leaf.id if self.leaf else None

    @property
    def path(self) -> list[str]:
        ids = [s.question for s in self.steps]
        if self.leaf:
            ids.append(self.leaf.id)
        elif self.undecided:
            ids.append(self.undecided.id)
        return ids

    @property
    def by_hand(self) -> list[Step]:
        """The steps answered by a person, not by a measured metric."""
        return [s for s in self.steps if s.by_hand]

    @property
    def fully_measured(self) -> bool:
        """True when the walk reached a leaf and every answer on it came from a measured metric."""
        return self.leaf is not None and not self.by_hand

    def measured(self) -> dict[str, Any]:
        """metric -> value of every measured answer on the walk (what decided it)."""
        return {s.metric: s.value for s in self.steps if not s.by_hand}

    @property
    def estimated(self) -> list[Step]:
        """The steps answered by an estimated metric (a model over a measured time)."""
        return [s for s in self.steps if s.estimated and not s.by_hand]

    @property
    def borderline(self) -> list[Step]:
        """The steps whose metric's measured spread contains the threshold."""
        return [s for s in self.steps if s.borderline]

    def explain(self) -> str:
        lines = []
        for s in self.steps:
            lines += [str(iv) for iv in self.invalid if iv.question == s.question]
            lines.append(str(s) + self._shared_tag())
        if self.leaf:
            lines.append(f"=> {self.leaf.id}: {self.leaf.title}{self._shared_tag()}")
            lines += [f"   next: {a}" for a in self.leaf.actions]
        elif self.undecided:
            q = self.undecided
            bad = [iv for iv in self.invalid if iv.question == q.id]
            lines += [str(iv) for iv in bad]
            if bad:
                lines.append(f"=> cannot decide at {q.id} ({q.text}): its only metrics here are outside their "
                             f"physical range, so they are not evidence; re-measure as said above, or run {q.probe}")
            else:
                need = ", ".join(c.metric for c in q.criteria)
                lines.append(f"=> cannot decide at {q.id} ({q.text}): evidence lacks {need}; "
                             f"run {q.probe}")
        lines += self.lens_notes
        if self.borderline:
            qs = ", ".join(f"{s.question} ({s.metric})" for s in self.borderline)
            lines.append(f"BORDERLINE at {qs}: the measured spread contains the threshold, so this leaf is one "
                         "re-run from the other branch; re-run with more repeats or a longer input before acting")
        given = [s for s in self.by_hand if s.how == GIVEN]
        if given:
            qs = ", ".join(f"{s.question} ({s.metric})" for s in given)
            lines.append(f"NOTE: given by the user, not measured by hwlab, at {qs}: this walk is only as "
                         "good as those numbers; run the probes named above to measure them.")
        if len(given) < len(self.by_hand):
            qs = ", ".join(f"{s.question} ({s.metric})" for s in self.by_hand if s.how != GIVEN)
            lines.append(f"NOTE: answered by hand, not measured, at {qs}: this walk is only as good "
                         "as those answers; run the probes named above to measure them.")
        if self.by_hand:  # said above: no claim that the walk was measured
            pass
        elif self.estimated:
            qs = ", ".join(f"{s.question} ({s.metric})" for s in self.estimated)
            lines.append(f"every answer on this walk was measured except the estimate at {qs}: a model's "
                         "bytes or FLOPs over a measured time; counters (ncu) would measure it")
        elif self.steps:
            lines.append("every answer on this walk was measured")
        if self.shared:
            from hwlab.core.gpu_share import note
            lines.append(note(self.shared) + "; re-measure on a quiet GPU before acting on this walk")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The walk as strict-JSON data: steps with spread, borderline and how each was answered."""
        return {"path": self.path, "leaf": self.leaf_id,
                "undecided_at": self.undecided.id if self.undecided else None,
                "steps": [s.to_dict() for s in self.steps],
                "invalid": [iv.to_dict() for iv in self.invalid],
                "borderline": [s.question for s in self.borderline],
                "estimated": [s.question for s in self.estimated],
                "lens_notes": list(self.lens_notes), "explain": self.explain(),
                "shared": self.shared}

    __str__ = explain

    def compact(self) -> str:
        """The walk on one line, e.g. ``B YES 4.23x -> F YES 60.8% -> G``: per step its answer and the
        value that decided it (``~`` an estimate, ``by hand`` a typed answer), ``BORDERLINE`` where the
        measured spread contains the threshold, ``INVALID`` where a metric was outside its physical
        range; ``explain()`` (or ``render(full=True)``) gives the full text."""
        parts = []
        for s in self.steps:
            bad = [iv.metric for iv in self.invalid if iv.question == s.question]
            parts.append(s.compact() + (f" (INVALID {', '.join(bad)})" if bad else "") + (" SHARED" if self.shared else ""))
        if self.leaf:
            parts.append(self.leaf.id)
        elif self.undecided:
            bad = [iv.metric for iv in self.invalid if iv.question == self.undecided.id]
            parts.append(f"? at {self.undecided.id} (" + (f"INVALID {', '.join(bad)}" if bad else "not measured") + ")")
        return " -> ".join(parts)

    def render(self, full: bool = False) -> str:
        """One line (:meth:`compact`), or with ``full`` the whole walk (:meth:`explain`)."""
        return self.explain() if full else self.compact()

    def mermaid(self) -> str:
        return render_mermaid(self.path)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else repr(v)


#: evidence keys that are not metrics: where each metric came from, over how many ranks, each
#: metric's measured spread, which metrics are estimates, the lower-byte alternatives' floors
META_KEYS = ("metric_sources", "n_ranks", "metric_spreads", "metric_estimated", "alt_floors_us", "metric_given",
             "gpu_shared")


def metric_names() -> list[str]:
    """Every name the chart reads from evidence: the questions' metrics and by-hand answers, the
    metrics with a physical range, the lenses' inputs and the keys that describe the others."""
    names = set(PHYSICAL_RANGES) | set(checks.LENS_METRICS) | set(META_KEYS)
    for q in QUESTIONS.values():
        names |= {c.metric for c in (*q.criteria, *q.overrides_no, *q.not_applicable)}
        names |= {q.bool_metric} if q.bool_metric else set()
    return sorted(names)


def diagnose(evidence: dict[str, Any]) -> Diagnosis:
    """Walk the chart from the start on ``evidence`` (metric -> value).

    At each question the first present criterion decides unless another present one says
    "yes" (a question is "yes" if any of its measured criteria holds). A by-hand boolean
    (``bool_metric``) is used only when no numeric metric is present, and its step is marked
    ``how="by hand"`` (:attr:`Diagnosis.by_hand`); every other step is ``"measured"``.
    ``evidence["metric_sources"]`` (metric -> what measured it) and ``evidence["n_ranks"]``
    (the ranks behind ``rank_tail_pct``) are shown beside the steps they answer.
    """
    sources = evidence.get("metric_sources") or {}
    given = set(evidence.get("metric_given") or ())
    n_ranks = evidence.get("n_ranks")
    spreads = checks.spreads_of(evidence)
    estimated = checks.estimated_metrics(evidence)

    def step(q: Question, ans: str, c: Criterion, v: Any, overridden: bool = False,
             others: tuple = ()) -> Step:
        sp, what = spreads.get(c.metric, (None, ""))
        other = q.no if ans == "yes" else q.yes
        border = checks.straddles(c, sp)
        if not border and ans == "no" and not overridden:  # another present criterion may flip it to yes
            border = any(checks.straddles(o, spreads.get(o.metric, (None, ""))[0]) for o, _ in others)
        return Step(q.id, q.text, ans, c.metric, v, c.describe(), c.reason, overridden=overridden,
                    source=sources.get(c.metric),
                    n_ranks=n_ranks if c.metric == "rank_tail_pct" else None,
                    spread=sp, spread_what=what, borderline=border,
                    other_branch=f"{'NO' if ans == 'yes' else 'YES'} -> {other}",
                    estimated=c.metric in estimated, how=GIVEN if c.metric in given else MEASURED)

    def valid(q: Question, crits: tuple[Criterion, ...]) -> list[tuple[Criterion, Any]]:
        out = []
        for c in crits:
            v = evidence.get(c.metric)
            if v is None:
                continue
            bad = checks.check_range(q.id, c.metric, v)
            if bad is not None:
                if all(iv.metric != c.metric for iv in d.invalid):
                    d.invalid.append(bad)
                continue
            out.append((c, v))
        return out

    shared = evidence.get("gpu_shared")
    d = Diagnosis(shared=shared if isinstance(shared, dict) and shared.get("shared") else None)
    node = START
    for _ in range(len(QUESTIONS) + 1):
        if node in LEAVES:
            d.leaf = LEAF_VARIANTS.get((node, str(evidence.get("workload"))), LEAVES[node])
            d.lens_notes = checks.lenses(d, evidence)
            return d
        q = QUESTIONS[node]
        present = valid(q, q.criteria)
        forced = [(c, v) for c, v in valid(q, q.overrides_no) if c.holds(float(v))]
        na = [(c, evidence.get(c.metric)) for c in q.not_applicable]
        if na and all(v is not None and c.holds(float(v)) for c, v in na):
            c, v = na[0]
            d.steps.append(Step(q.id, q.text, NOT_APPLICABLE, c.metric, v,
                                " and ".join(f"{c2.describe()} (= {_fmt(v2)})" for c2, v2 in na),
                                " ".join(c2.reason for c2, _ in na), source=sources.get(c.metric),
                                how=GIVEN if c.metric in given else MEASURED))
            node = q.no
            continue
        if forced:
            c, v = forced[0]
            ans = "no"
            d.steps.append(step(q, ans, c, v, overridden=True))
        elif present:
            hits = [(c, v) for c, v in present if c.holds(float(v))]
            c, v = hits[0] if hits else present[0]
            ans = "yes" if hits else "no"
            d.steps.append(step(q, ans, c, v, others=tuple((o, w) for o, w in present if o is not c)))
        elif q.bool_metric and evidence.get(q.bool_metric) is not None and not any(
                iv.question == q.id for iv in d.invalid):
            ans = "yes" if evidence[q.bool_metric] else "no"
            d.steps.append(Step(q.id, q.text, ans, q.bool_metric, evidence[q.bool_metric],
                                "answered by hand", "observed by the engineer, not measured",
                                how=BY_HAND, source=sources.get(q.bool_metric)))
        else:
            d.undecided = q
            return d
        node = q.yes if ans == "yes" else q.no
    raise RuntimeError("flowchart has a cycle")  # pragma: no cover


def by_hand_keys(evidence: dict[str, Any]) -> list[str]:
    """The by-hand (boolean) answers present in ``evidence``, measured or not on the walk."""
    return [q.bool_metric for q in QUESTIONS.values() if q.bool_metric and q.bool_metric in evidence]


def render_mermaid(path: list[str] | None = None) -> str:
    """Mermaid source of the chart, nodes on ``path`` highlighted (JupyterLab renders it)."""
    lines = ["flowchart TD", '    A["performance anomaly"] --> B']
    for q in QUESTIONS.values():
        lines.append(f'    {q.id}{{"{q.text}"}}')
        lines.append(f'    {q.id} -- "yes" --> {q.yes}')
        lines.append(f'    {q.id} -- "no" --> {q.no}')
    for leaf in LEAVES.values():
        lines.append(f'    {leaf.id}["{leaf.title}"]')
    if path:
        lines.append("    classDef hit fill:#ffd54f,stroke:#e65100,stroke-width:2px")
        lines.append(f"    class {','.join(path)} hit")
    return "\n".join(lines)


def walk_cases(result):
    """Walk the flowchart for every case of a lab's run and fill its ``diagnoses`` (case ->
    :class:`Diagnosis`); returns ``result``. ``result`` is any object with ``evidence`` (case ->
    measured evidence), ``params`` and ``diagnoses`` (Lab 1's ``LabResult``): labs measure,
    this floor walks. No case is walked when ``params["interpreted"]`` is true: interpreted
    Triton timings are NumPy speed, not GPU speed, and a walk from them would be a false verdict."""
    interpreted = bool(result.params.get("interpreted"))
    result.diagnoses = {} if interpreted else {k: diagnose(ev) for k, ev in result.evidence.items()}
    return result
