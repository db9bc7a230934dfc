"""The seed's diagnosis flowchart as data, and :func:`diagnose` that walks it on evidence.

::

    A 性能异常 -> B slow in a single-GPU microbenchmark?
       B yes -> F memory path saturated? -> yes: G bandwidth / layout / fusion
                                         -> no : H Tensor-Core use low? -> yes: I tile / dtype / MMA path
                                                                       -> no : J launch / occupancy / registers
       B no  -> D slow only multi-GPU or in service? -> yes: K rank tail? -> yes: L NCCL / NVLink / NUMA / rank mapping
                                                                         -> no : M shape bucket / cache / fallback
                                                    -> no : OK nothing to fix at this level

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
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

from .roofline import evidence_from_measurement  # noqa: F401  (re-exported: built on the core floor)


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
        probe="the kernel's own probe (hwlab.measure.bench) against this machine's ceilings",
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
        Criterion("sector_amplification", ">=", 2.0, "x sectors per request over ideal",
                  "uncoalesced access: each warp request touches more 32-byte sectors than "
                  "the bytes it needs (ideal 4 for 4-byte lanes); >= 2x means half or more of "
                  "the memory transactions are waste: a layout problem."),),
        probe="ncu --metrics dram__throughput...,l1tex__t_sectors/requests (or the lab's traffic model)",
        yes="G", no="H"),
    Question("H", "Is Tensor-Core use low?", (
        Criterion("tensor_pct_of_peak", "<", 50.0, "% of this machine's measured GEMM rate",
                  "a matmul-heavy kernel under half the rate cuBLAS reaches on this card at "
                  "its dtype is missing the MMA path (wrong dtype, fp32 without TF32, "
                  "unaligned shapes, a tile the compiler cannot map to wgmma/mma)."),
        Criterion("tensor_pipe_pct", "<", 50.0, "% tensor pipe active (counted)",
                  "Nsight Compute's sm__pipe_tensor_op_*_cycles_active: under half busy."),),
        probe="hwlab.probes.gemm at the kernel's dtype, or ncu tensor-pipe metric",
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
                  "slowest rank's median step over the median rank's: a tail of 10% or more "
                  "means one rank's link, NUMA placement or card holds all others at the "
                  "collective."),),
        probe="per-rank step-time distribution (the cross-link TP lab)",
        yes="L", no="M", bool_metric="rank_tail"),
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
        "rule 3c, did the overlap really happen: overlap_hidden_pct (measured share of the "
        "communication hidden under compute) under 50% leaves the collective on the critical path; "
        "a link whose all-reduce outlasts the compute cannot be hidden, so move the traffic off it"),
        "03_cross_link_tp"),
    Leaf("M", "shape bucket / cache / fallback", (
        "benchmark the real shape mix, not one tuned shape; split prefill and decode",
        "count fallback / dequant kernels per step (kernel hit rate)",
        "check caches (KV, autotune, compile) hit in service"), "04_fp8_dequant_fallback"),
    Leaf("OK", "nothing to fix at this level", (
        "the kernel is within 1.5x of its floor and nothing is slow at scale",
        "re-check the symptom: compare with the node baseline"), ""),
]}

START = "B"


#: how a question was answered: from a metric a probe measured, or by a person
MEASURED, BY_HAND = "measured", "by hand"
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
    #: "measured" (a numeric metric a probe produced) or "by hand" (a yes/no someone typed)
    how: str = MEASURED
    #: what measured it, from the evidence's ``metric_sources`` (None: not stated)
    source: str | None = None
    #: ranks the rank-tail figure was measured over (the K question), when the evidence says
    n_ranks: int | None = None

    @property
    def by_hand(self) -> bool:
        return self.how == BY_HAND

    def provenance(self) -> str:
        if self.by_hand:
            return "[BY HAND: not measured]"
        extra = [self.source] if self.source else []
        if self.n_ranks is not None:
            extra.append(f"over {self.n_ranks} rank{'s' if self.n_ranks != 1 else ''}")
        return "[measured" + (": " + "; ".join(extra) if extra else "") + "]"

    def __str__(self) -> str:
        if self.answer == NOT_APPLICABLE:
            return (f"{self.question}. {self.text} -> NOT APPLICABLE, takes the NO branch ({self.metric} = "
                    f"{_fmt(self.value)}; rule {self.criterion}): {self.reason} {self.provenance()}")
        if self.overridden:
            return (f"{self.question}. {self.text} -> takes the NO branch: {self.metric} = "
                    f"{_fmt(self.value)} ({self.criterion}) explains it first: {self.reason} "
                    f"{self.provenance()}")
        return (f"{self.question}. {self.text} -> {self.answer.upper()} "
                f"({self.metric} = {_fmt(self.value)}; rule {self.criterion}) {self.provenance()}")


@dataclass
class Diagnosis:
    steps: list[Step] = field(default_factory=list)
    leaf: Leaf | None = None
    undecided: Question | None = None

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

    def explain(self) -> str:
        lines = [str(s) for s in self.steps]
        if self.leaf:
            lines.append(f"=> {self.leaf.id}: {self.leaf.title}")
            lines += [f"   next: {a}" for a in self.leaf.actions]
        elif self.undecided:
            q = self.undecided
            need = ", ".join(c.metric for c in q.criteria)
            lines.append(f"=> cannot decide at {q.id} ({q.text}): evidence lacks {need}; "
                         f"run {q.probe}")
        if self.by_hand:
            qs = ", ".join(f"{s.question} ({s.metric})" for s in self.by_hand)
            lines.append(f"NOTE: answered by hand, not measured, at {qs}: this walk is only as good "
                         "as those answers; run the probes named above to measure them.")
        elif self.steps:
            lines.append("every answer on this walk was measured")
        return "\n".join(lines)

    __str__ = explain

    def mermaid(self) -> str:
        return render_mermaid(self.path)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else repr(v)


#: evidence keys that are not metrics: where each metric came from, and over how many ranks
META_KEYS = ("metric_sources", "n_ranks")


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
    n_ranks = evidence.get("n_ranks")

    def step(q: Question, ans: str, c: Criterion, v: Any, overridden: bool = False) -> Step:
        return Step(q.id, q.text, ans, c.metric, v, c.describe(), c.reason, overridden=overridden,
                    source=sources.get(c.metric),
                    n_ranks=n_ranks if c.metric == "rank_tail_pct" else None)

    d = Diagnosis()
    node = START
    for _ in range(len(QUESTIONS) + 1):
        if node in LEAVES:
            d.leaf = LEAVES[node]
            return d
        q = QUESTIONS[node]
        present = [(c, evidence[c.metric]) for c in q.criteria
                   if evidence.get(c.metric) is not None]
        forced = [(c, evidence[c.metric]) for c in q.overrides_no
                  if evidence.get(c.metric) is not None and c.holds(float(evidence[c.metric]))]
        na = [(c, evidence.get(c.metric)) for c in q.not_applicable]
        if na and all(v is not None and c.holds(float(v)) for c, v in na):
            c, v = na[0]
            d.steps.append(Step(q.id, q.text, NOT_APPLICABLE, c.metric, v,
                                " and ".join(f"{c2.describe()} (= {_fmt(v2)})" for c2, v2 in na),
                                " ".join(c2.reason for c2, _ in na), source=sources.get(c.metric)))
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
            d.steps.append(step(q, ans, c, v))
        elif q.bool_metric and evidence.get(q.bool_metric) is not None:
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
