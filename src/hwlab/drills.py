"""Diagnosis drills: a hidden fault, the flowchart, and a graded answer.

A drill draws one fault from the kit's scenarios (or none), seals the choice, and hands the
learner only what the probes show. The learner walks the flowchart and submits a leaf with
the evidence behind it; :func:`grade` checks three things:

1. the leaf is the fault's leaf;
2. the submitted evidence supports it: it agrees with what the drill's probes showed
   (same metrics, values within ``EVIDENCE_TOL_PCT``) and the flowchart walked on it
   reaches the submitted leaf;
3. the fix hwlab applies for that leaf removes the slowdown when re-measured (the fault's
   fixed run leaves the leaf).

Sealing: the drill file stores ``sha256(salt + fault)``, not the fault, so a learner does
not read it by accident; the choice is reproducible from the seed. Observations come from
the kit's own runs: live where this machine can produce them (the slow link needs root; the
FP8 profile runs anywhere), otherwise the recorded H200/CPU evidence, labelled as such.
"""
from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from . import flowchart
from .evidence import recorded
from .store import write_json_atomic

EVIDENCE_TOL_PCT = 1.0


Observer = Callable[[], tuple[dict[str, Any], str]]  # -> (flowchart evidence, source label)


@dataclass(frozen=True)
class Fault:
    name: str
    leaf: str
    workload: str
    observe: Observer
    fixed: Observer
    #: the same scenario measured live on this GPU (None: no one-GPU live form)
    live_observe: Observer | None = None
    live_fixed: Observer | None = None


def _rec(kind: str, device: str, path: list[str]) -> Callable[[], tuple[dict[str, Any], str]]:
    def get():
        ev = recorded(kind, device)
        node: Any = ev.extra
        for key in path:
            node = node[key]
        return dict(node), ev.label
    return get


def _fp8_profile(path_name: str) -> Observer:
    def get():
        import torch

        from .labs import fp8
        from .nb import live_label

        cfg = fp8.H200_SIZE if torch.cuda.is_available() else fp8.TINY  # the lab's decoder, GPU-sized on a GPU
        prof = fp8.decode_profile(fp8.Decoder(cfg, path_name))
        # the service is slow, single-GPU GEMM microbenchmarks are not, no rank tail: the chart's
        # by-hand answers for this fault; the profile is the evidence that names the fallback
        slow = prof["fallback_gemms"] > 0
        return ({"single_gpu_slow": False, "multi_gpu_or_service_slow": slow, "rank_tail": False,
                 "fp8_fallback_rate_pct": prof["fallback_rate_pct"], "fp8_hit_rate_pct": prof["hit_rate_pct"]},
                live_label())
    return get


def _live(scenario: str, case: str) -> Observer:
    """Run the scenario now on this GPU and return the flowchart evidence of one case."""
    def get():
        import torch

        from .nb import live_label

        if not torch.cuda.is_available():
            raise RuntimeError("a live drill needs a GPU; without one, drills use recorded evidence")
        if scenario == "lab01":
            from .labs import bandwidth
            ev = bandwidth.run(cases=(case,)).evidence[case]
        elif scenario == "tile":
            from .labs import registers
            cfg = next(c for c in registers.SWEEP if c.label == case)
            cublas = registers.cublas_bf16().tflops
            r = registers.sweep([cfg], ceiling_tflops=cublas)[0]
            ev = registers.config_evidence(r, _copy_gbps())
        elif scenario == "launch":
            from .labs import registers
            lr = registers.launch_bound()
            ev = (registers.launch_evidence(lr, _copy_gbps()) if case == "eager" else
                  {"slowdown_vs_floor": 1.0, "multi_gpu_or_service_slow": False,
                   "graph_step_ms": lr.graph.t_ms, "eager_step_ms": lr.eager.t_ms})
        elif scenario == "dtype":
            from .labs import scenarios
            ev = scenarios.dtype_path(copy_gbps=_copy_gbps())["flowchart_evidence"][case]
        elif scenario == "workload":
            from .labs import scenarios
            ev = scenarios.workload_mix()["flowchart_evidence"][case]
        else:
            raise ValueError(f"no live scenario {scenario!r}")
        return dict(ev), live_label()
    return get


def _copy_gbps() -> float:
    from .probes import hbm_copy
    return hbm_copy(size_mib=1024, impl="torch").gbps


FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("unfused_chain", "G", "a fused-op pipeline (bias+GELU+residual+scale)",
          _rec("lab01_bandwidth", "h200", ["flowchart_evidence", "unfused"]),
          _rec("lab01_bandwidth", "h200", ["flowchart_evidence", "fused"]),
          _live("lab01", "unfused"), _live("lab01", "fused")),
    Fault("strided_layout", "G", "a fused-op pipeline reading a transposed tensor",
          _rec("lab01_bandwidth", "h200", ["flowchart_evidence", "strided"]),
          _rec("lab01_bandwidth", "h200", ["flowchart_evidence", "coalesced"]),
          _live("lab01", "strided"), _live("lab01", "coalesced")),
    Fault("oversized_tile", "J", "a custom Triton GEMM",
          _rec("lab02_registers", "h200", ["flowchart_evidence", "256x256x64 w4 s2"]),
          _rec("lab02_registers", "h200", ["flowchart_evidence", "128x256x64 w8 s3"]),
          _live("tile", "256x256x64 w4 s2"), _live("tile", "128x256x64 w8 s3")),
    Fault("launch_bound", "J", "a small-batch decode step",
          _rec("lab02_registers", "h200", ["flowchart_evidence", "launch-bound step"]),
          lambda: ({"slowdown_vs_floor": 1.0, "multi_gpu_or_service_slow": False},
                   recorded("lab02_registers").label + " (graph replay at its own floor)"),
          _live("launch", "eager"), _live("launch", "graph")),
    Fault("dtype_mma_miss", "I", "a GEMM-heavy layer",
          _rec("scenarios", "h200", ["dtype_path", "flowchart_evidence", "fp32"]),
          _rec("scenarios", "h200", ["dtype_path", "flowchart_evidence", "bf16"]),
          _live("dtype", "fp32"), _live("dtype", "bf16")),
    Fault("slow_link_rank", "L", "a tensor-parallel block on six ranks",
          _rec("lab03_slowlink", "cpu", ["experiment", "naive", "flowchart_evidence"]),
          _rec("lab03_slowlink", "cpu", ["experiment", "aware", "flowchart_evidence"])),
    Fault("fp8_fallback", "M", "an FP8 decoder in service", _fp8_profile("mixed"), _fp8_profile("fixed"),
          _fp8_profile("mixed"), _fp8_profile("fixed")),
    Fault("untuned_bucket", "M", "a serving step of decode and prefill GEMMs",
          _rec("scenarios", "h200", ["workload", "flowchart_evidence", "tuned-shape prediction"]),
          _rec("scenarios", "h200", ["workload", "flowchart_evidence", "bucketed prediction"]),
          _live("workload", "tuned-shape prediction"), _live("workload", "bucketed prediction")),
    Fault("none", "OK", "a fused-op pipeline",
          _rec("lab01_bandwidth", "h200", ["flowchart_evidence", "fused"]),
          _rec("lab01_bandwidth", "h200", ["flowchart_evidence", "fused"]),
          _live("lab01", "fused"), _live("lab01", "fused")),
]}


def _seal(salt: str, fault: str) -> str:
    return hashlib.sha256(f"{salt}:{fault}".encode()).hexdigest()


@dataclass
class Drill:
    drill_id: str
    seed: int
    salt: str
    sealed: str
    workload: str
    observations: dict[str, Any]
    source: str
    live: bool = False
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def fault(self) -> Fault:
        for f in FAULTS.values():
            if _seal(self.salt, f.name) == self.sealed:
                return f
        raise ValueError("this drill's seal matches no fault of this hwlab version")

    def save(self, folder: str | Path) -> Path:
        return write_json_atomic(Path(folder) / f"drill-{self.drill_id}.json", asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> "Drill":
        return cls(**json.loads(Path(path).read_text()))


def new(seed: int | None = None, fault: str | None = None, live: bool | None = None) -> Drill:
    """Draw a fault (or take the instructor's), seal it, and record what the probes show.

    ``live`` (default: when a GPU is here): run the fault's scenario now on this GPU; faults
    without a one-GPU form (the slow-link rank) and CPU machines use the recorded evidence."""
    seed = secrets.randbelow(2**31) if seed is None else seed
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    name = fault or random.Random(seed).choice(sorted(FAULTS))
    f = FAULTS[name]
    salt = hashlib.sha256(f"hwlab-drill-{seed}".encode()).hexdigest()[:16]
    if live is None:
        import torch
        live = torch.cuda.is_available()
    live = bool(live and f.live_observe is not None)
    obs, src = (f.live_observe if live else f.observe)()
    return Drill(drill_id=f"{seed:010d}", seed=seed, salt=salt, sealed=_seal(salt, name),
                 workload=f.workload, observations=obs, source=src, live=live)


@dataclass
class Grade:
    learner: str
    drill_id: str
    submitted_leaf: str
    correct_leaf: bool
    evidence_supports: bool
    fix_removes_slowdown: bool | None
    path: list[str]
    explanation: str
    seconds: float | None = None
    fix_evidence: dict[str, Any] | None = None  # the re-measured run after hwlab applied the fix
    fix_source: str | None = None
    at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def passed(self) -> bool:
        return self.correct_leaf and self.evidence_supports and self.fix_removes_slowdown is not False


def grade(drill: Drill, leaf: str, evidence: dict[str, Any] | None = None, learner: str = "anonymous",
          started: float | None = None) -> Grade:
    """Grade a submission: right leaf, evidence that supports it, and a fix that works."""
    if leaf not in flowchart.LEAVES:
        raise ValueError(f"leaf must be one of {', '.join(flowchart.LEAVES)}")
    f = drill.fault()
    evidence = dict(drill.observations if evidence is None else evidence)
    why: list[str] = []
    # 2. the evidence must be what the probes showed, and must lead to the submitted leaf
    mismatch = [k for k, v in evidence.items() if k in drill.observations and isinstance(v, (int, float))
                and not isinstance(v, bool) and isinstance(drill.observations[k], (int, float))
                and abs(v - drill.observations[k]) > abs(drill.observations[k]) * EVIDENCE_TOL_PCT / 100 + 1e-12]
    invented = [k for k in evidence if k not in drill.observations]
    d = flowchart.diagnose(evidence)
    supports = not mismatch and not invented and d.leaf_id == leaf
    if mismatch:
        why.append(f"your evidence differs from what the probes showed for {mismatch}")
    if invented:
        why.append(f"your evidence names metrics the drill's probes did not show: {invented}")
    if d.leaf_id != leaf:
        why.append(f"walked on your evidence the chart reaches {d.leaf_id or 'no leaf'} "
                   f"({' -> '.join(d.path)}), not {leaf}")
    # 1. the leaf itself; explain the first question answered differently
    truth = flowchart.diagnose(drill.observations)
    correct = leaf == f.leaf
    if not correct:
        step = next(iter(truth.steps), None)
        for s in truth.steps:
            q = flowchart.QUESTIONS[s.question]
            target = q.yes if s.answer == "yes" else q.no
            if leaf not in _reachable(target):
                step = s
                break
        if step is not None:
            why.insert(0, f"{leaf} is not it: at {step.question} ({step.text}) the evidence says "
                          f"{step.answer.upper()} because {step.metric} = {step.value} ({step.criterion})")
    # 3. apply the fix for the fault's leaf and re-measure (the fault's fixed run)
    fixed_ev, fixed_src = (f.live_fixed if drill.live and f.live_fixed else f.fixed)()
    fixed_leaf = flowchart.diagnose(fixed_ev).leaf_id
    works = None if f.leaf == "OK" else fixed_leaf != f.leaf
    if correct and works is False:
        why.append(f"the fix for {f.leaf} did not remove the slowdown on re-measure")
    if not why:
        why.append(f"right: {' -> '.join(truth.path)}; after the fix the same probe lands on {fixed_leaf}")
    if started is None:  # time since the drill was handed out
        started = datetime.fromisoformat(drill.created).timestamp()
    return Grade(learner, drill.drill_id, leaf, correct, supports, works if correct else None, d.path,
                 "; ".join(why), seconds=time.time() - started, fix_evidence=fixed_ev, fix_source=fixed_src)


def _reachable(node: str) -> set[str]:
    if node in flowchart.LEAVES:
        return {node}
    q = flowchart.QUESTIONS[node]
    return _reachable(q.yes) | _reachable(q.no)


def reveal(drill: Drill) -> dict[str, Any]:
    f = drill.fault()
    return {"fault": f.name, "leaf": f.leaf, "workload": f.workload,
            "path": flowchart.diagnose(drill.observations).path}


def class_summary(grades: list[Grade]) -> dict[str, Any]:
    """Instructor view: per learner, what they diagnosed, how long, and the wrong branches taken."""
    per: dict[str, dict[str, Any]] = {}
    for g in grades:
        p = per.setdefault(g.learner, {"attempts": 0, "passed": 0, "wrong_leaves": [], "seconds": []})
        p["attempts"] += 1
        p["passed"] += int(g.passed)
        if not g.correct_leaf:
            p["wrong_leaves"].append(g.submitted_leaf)
        if g.seconds is not None:
            p["seconds"].append(round(g.seconds))
    wrong: dict[str, int] = {}
    for g in grades:
        if not g.correct_leaf:
            wrong[g.submitted_leaf] = wrong.get(g.submitted_leaf, 0) + 1
    return {"learners": per, "wrong_leaf_counts": wrong, "n": len(grades)}
