"""Diagnosis drills: a hidden fault, the flowchart, and a graded answer.

A drill draws one fault from the kit's scenarios (or none), seals the choice, and hands the
learner only what the probes show. The learner walks the flowchart and submits a leaf with
the evidence behind it; :func:`grade` checks three things:

1. the leaf is the fault's leaf;
2. the submitted evidence supports it: it agrees with what the drill's probes showed
   (same metrics, values within ``EVIDENCE_TOL_PCT``) and the flowchart walked on it
   reaches the submitted leaf;
3. the fix hwlab applies for that leaf removes the slowdown: the fault's *fixed*
   configuration is run again (live where the drill was live, else its recorded run) and every
   metric is recomputed; the fix works when that walk leaves the fault's leaf.

Observations come from running the fault's scenario (:mod:`hwlab.labs.drillruns`), which is
given the scenario and the case to run and never the fault's name or leaf: nothing the learner
sees, and nothing the fix check uses, is derived from the label. Every answer on the walk is
measured (B, D and K included; a one-process workload reports its one rank, measured).

Sealing (what it protects against, and what not): a drill file carries an HMAC-SHA256, keyed
by a secret that is not in the file, over the canonical JSON of the whole drill (observations,
source, seed, salt, seal, dates). :meth:`Drill.load` refuses a file whose HMAC does not match:
an edited observation, a swapped seal or a copied-in fault is detected. The fault itself is
stored only as ``HMAC(key, salt:fault)``, so the short list of fault names cannot be tried
against it without the key. The key lives in ``~/.config/hwlab/drill.key`` (created 0600 on
first use) or the file ``HWLAB_DRILL_KEY_FILE`` names (an instructor's key shared with the
grader). It does NOT protect against anyone who can read the key file: a learner grading
drills under their own account can read it, re-seal an edited drill and open the seal; for an
exam, keep the key (and grading) on an account the learner cannot read. Nor does it hide the
observations, which are the point of the drill.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import secrets
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hwlab.diagnosis import flowchart
from hwlab.course.tries import recheck_own_path
from hwlab.errors import UserInputError
from hwlab.core.store import read_user_json, write_json_atomic
from hwlab.core.store import check_input_file

EVIDENCE_TOL_PCT = 1.0
#: what a refused drill file should have been
DRILL_HINT = "pass a drill-*.json written by `hwlab drill new`"


@dataclass(frozen=True)
class Fault:
    name: str
    leaf: str
    workload: str
    #: the scenario that reproduces it and the case to run: faulty, and with the fix applied
    scenario: str
    case: str
    fixed_case: str
    #: for a fault the chart's walk cannot leave (its leaf is OK: the code is fine), the measured
    #: metric its fix must bring to zero (the bad card: hardware deviations from the node baseline)
    fix_metric: str | None = None

    def observe(self, live: bool = False, device=None) -> tuple[dict[str, Any], str]:
        """Run (or read the recorded run of) the faulty configuration."""
        from hwlab.labs import drillruns  # runs torch kernels: loaded only to observe

        return drillruns.observe(self.scenario, self.case, live=live, device=device)

    def fixed(self, live: bool = False, device=None) -> tuple[dict[str, Any], str]:
        """Run (or read the recorded run of) the configuration with the fix applied."""
        from hwlab.labs import drillruns  # runs torch kernels: loaded only to observe

        return drillruns.observe(self.scenario, self.fixed_case, live=live, device=device)

    def can_run_live(self, device=None) -> bool:
        from hwlab.labs import drillruns

        return drillruns.can_run_live(self.scenario, device)


#: the workload a learner is told: what runs, never what is wrong with it (the chain's faults and its
#: healthy run are the same pipeline, so the text tells them apart no more than the name would)
PIPELINE = "an elementwise pipeline after a linear layer (bias, GELU, residual, scale)"

FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("unfused_chain", "G", PIPELINE, "chain", "unfused", "fused"),
    Fault("strided_layout", "G", PIPELINE, "chain", "strided", "coalesced"),
    Fault("oversized_tile", "J", "a custom Triton GEMM", "tile", "256x256x64 w4 s2", "128x256x64 w8 s3"),
    Fault("launch_bound", "J", "a small-batch decode step", "launch", "eager", "graph"),
    Fault("dtype_mma_miss", "I", "a GEMM-heavy layer", "dtype", "fp32", "bf16"),
    Fault("slow_link_rank", "L", "a tensor-parallel block on six ranks", "slowlink", "naive", "aware"),
    Fault("fp8_fallback", "M", "an FP8 decoder in service", "fp8", "mixed", "fixed"),
    Fault("untuned_bucket", "M", "a serving step of decode and prefill GEMMs", "workload",
          "tuned-shape prediction", "bucketed prediction"),
    Fault("sync_point", "J", "a small training step (forward, backward, optimizer step, loss logged)", "syncpoint",
          "item", "async"),
    Fault("bad_card", "OK", "a node whose step times became erratic", "badcard", "throttled", "healthy",
          fix_metric="hw_deviations_vs_baseline"),
    Fault("none", "OK", PIPELINE, "chain", "fused", "fused"),
]}


# ---------------------------------------------------------------- the key and the seal
def key_path() -> Path:
    return Path(os.environ.get("HWLAB_DRILL_KEY_FILE") or Path.home() / ".config" / "hwlab" / "drill.key")


def drill_key() -> bytes:
    """This user's drill key (32 random bytes), created 0600 on first use."""
    p = key_path()
    if os.path.lexists(p):  # a FIFO or a device named by HWLAB_DRILL_KEY_FILE is refused unopened
        check_input_file(p, "drill key", "remove it to make a new one (drills sealed with the old key "
                         "will no longer open)", max_bytes=4096)
    try:
        return bytes.fromhex(p.read_text().strip())
    except FileNotFoundError:
        pass
    except ValueError:
        raise UserInputError(f"drill key {p} is not a hex key: remove it to make a new one "
                             "(drills sealed with the old key will no longer open)") from None
    p.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return bytes.fromhex(p.read_text().strip())
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


def _mac(data: bytes) -> str:
    return hmac.new(drill_key(), data, hashlib.sha256).hexdigest()


def _seal(salt: str, fault: str) -> str:
    return _mac(f"{salt}:{fault}".encode())


def canonical(d: dict[str, Any]) -> bytes:
    """The bytes the drill's HMAC covers: sorted keys, no whitespace, the ``mac`` left out."""
    return json.dumps({k: v for k, v in d.items() if k != "mac"}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


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
    mac: str = ""

    def fault(self) -> Fault:
        for f in FAULTS.values():
            if hmac.compare_digest(_seal(self.salt, f.name), self.sealed):
                return f
        raise UserInputError("this drill's seal matches no fault of this hwlab version under this "
                             "machine's drill key: was it made with another key (HWLAB_DRILL_KEY_FILE)?")

    def signed(self) -> "Drill":
        self.mac = _mac(canonical(asdict(self)))
        return self

    def verify(self) -> None:
        try:
            body = canonical(asdict(self))
        except ValueError:  # NaN or infinity: a sealed drill is strict JSON, so it was typed in
            body = None
        if not self.mac or body is None or not hmac.compare_digest(self.mac, _mac(body)):
            raise UserInputError("this drill file was edited after it was made (its seal does not match "
                                 "its contents): draw a new drill with `hwlab drill new`")

    def save(self, folder: str | Path, *, overwrite: bool = False) -> Path:
        if not self.mac:
            self.signed()
        return write_json_atomic(drill_path(folder, self.seed), asdict(self), overwrite=overwrite)

    @property
    def label(self) -> str:
        """Where the observations came from, as the file says: a drill whose ``live`` is false
        was not measured here, whatever words its source carries (:func:`source_label`)."""
        return source_label(self.source, self.live)

    @classmethod
    def from_dict(cls, d: Any, what: str = "drill") -> "Drill":
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not {"drill_id", "seed", "salt", "sealed", "observations"} <= set(d):
            raise UserInputError(f"{what} is not an hwlab drill (fields missing): pass a drill-*.json "
                                 "written by `hwlab drill new`")
        if set(d) - names:
            raise UserInputError(f"{what} has fields no drill has ({sorted(set(d) - names)}): it was edited")
        drill = cls(**d)
        drill.verify()
        return drill

    @classmethod
    def load(cls, path: str | Path) -> "Drill":
        """Read and verify a drill file; any edit (observations included) is refused."""
        return cls.from_dict(read_user_json(path, "drill file", DRILL_HINT), str(Path(path)))


def drill_path(folder: str | Path, seed: int) -> Path:
    """Where ``hwlab drill new`` writes the drill of ``seed`` in ``folder``."""
    return Path(folder) / f"drill-{seed:010d}.json"


def source_label(source: str, live: bool) -> str:
    """A drill's source as shown: unchanged for a live drill; for one that is not live, a source
    that reads "measured live on X" (a recorded run's own words on the machine that ran it)
    becomes "recorded on X", so "measured live" is never shown for a drill the file marks
    ``"live": false``."""
    if live or not source.startswith("measured live on "):
        return source
    return "recorded on " + source[len("measured live on "):] + " (a recorded run, not measured here)"


def new(seed: int | None = None, fault: str | None = None, live: bool | None = None, device=None) -> Drill:
    """Draw a fault (or take the instructor's), seal it, and record what the probes show.

    ``live`` (default: when a GPU is here): run the fault's scenario now on this machine (on a
    CPU, the scenarios that run there at small sizes); a scenario this machine cannot run
    (the slow-link rank needs several ranks and a shaped link; a Triton GEMM's speed and
    CUDA graphs need a GPU) comes from the kit's recorded run of it, labelled."""
    seed = secrets.randbelow(2**31) if seed is None else seed
    if fault is not None and fault not in FAULTS:
        raise UserInputError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    name = fault or random.Random(seed).choice(sorted(FAULTS))
    f = FAULTS[name]
    salt = hashlib.sha256(f"hwlab-drill-{seed}".encode()).hexdigest()[:16]
    if live is None:
        import torch
        live = torch.cuda.is_available()
    live = bool(live and f.can_run_live(device))
    obs, src = f.observe(live=live, device=device)
    return Drill(drill_id=f"{seed:010d}", seed=seed, salt=salt, sealed=_seal(salt, name),
                 workload=f.workload, observations=obs, source=src, live=live).signed()


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
        raise UserInputError(f"leaf must be one of {', '.join(flowchart.LEAVES)}")
    drill.verify()
    f = drill.fault()
    evidence = dict(drill.observations if evidence is None else evidence)
    why: list[str] = []
    # 2. the evidence must be what the probes showed, and must lead to the submitted leaf
    mismatch = [k for k, v in evidence.items() if k in drill.observations and isinstance(v, (int, float))
                and not isinstance(v, bool) and isinstance(drill.observations[k], (int, float))
                and abs(v - drill.observations[k]) > abs(drill.observations[k]) * EVIDENCE_TOL_PCT / 100 + 1e-12]
    invented = [k for k in evidence if k not in drill.observations and k not in flowchart.META_KEYS]
    d = flowchart.diagnose(evidence)
    supports = not mismatch and not invented and d.leaf_id == leaf
    if mismatch:
        why.append(f"your evidence differs from what the probes showed for {mismatch}")
    if invented:
        why.append(f"your evidence names metrics the drill's probes did not show: {invented}")
    if d.leaf_id != leaf:  # the walk's own leaf is not named: that stays for `reveal`
        why.append(f"walked on your evidence the chart does not reach {leaf}")
    # 1. the leaf itself: name the measured evidence that contradicts it, never the right leaf
    correct = leaf == f.leaf
    if not correct:
        why.insert(0, contradiction(drill.observations, leaf))
    # 3. apply the fix for the fault's leaf: run the fixed configuration, recompute every metric
    fixed_ev = fixed_src = fixed_leaf = None
    works = None
    if correct:
        fixed_ev, fixed_src = f.fixed(live=drill.live)
        fixed_walk = flowchart.diagnose(fixed_ev)
        fixed_leaf = fixed_walk.leaf_id
        # the fix works only when its re-measure walks to a leaf, and not the fault's: a walk that
        # stops undecided has not shown the slowdown gone (it may still be slow at B)
        works = None if f.leaf == "OK" else fixed_leaf is not None and fixed_leaf != f.leaf
        if f.fix_metric:  # a walk that stays on OK: the fix must clear the fault's own measured signs
            before, after = drill.observations.get(f.fix_metric), fixed_ev.get(f.fix_metric)
            works = isinstance(before, (int, float)) and before > 0 and after == 0
            if not works:
                why.append(f"the fix did not clear {f.fix_metric}: {before} before, {after} after")
        if works is False and fixed_leaf is None:
            why.append(f"the fix for {f.leaf} is not shown to work: its re-measure walks "
                       f"{' -> '.join(fixed_walk.path)} and stops there (evidence lacks a metric "
                       f"for {fixed_walk.undecided.id}); grade again to re-measure")
        elif works is False:
            why.append(f"the fix for {f.leaf} did not remove the slowdown on re-measure "
                       f"(the fixed run still walks to {fixed_leaf})")
    if not why:
        truth = flowchart.diagnose(drill.observations)
        why.append(f"right: {' -> '.join(truth.path)}; after the fix the same probes land on {fixed_leaf}"
                   + (f" and {f.fix_metric} = {fixed_ev.get(f.fix_metric)}" if f.fix_metric else ""))
    if started is None:  # time since the drill was handed out
        started = datetime.fromisoformat(drill.created).timestamp()
    return Grade(learner, drill.drill_id, leaf, correct, supports, works, d.path,
                 "; ".join(why), seconds=time.time() - started, fix_evidence=fixed_ev, fix_source=fixed_src)


def contradiction(observations: dict[str, Any], leaf: str) -> str:
    """Why ``leaf`` is wrong, from the measured evidence alone: the learner's own path to ``leaf``,
    as questions to re-check in order against the rows each reads (:func:`hwlab.course.tries.recheck_own_path`,
    the words :mod:`hwlab.course.checkpoint` answers a wrong leaf with). It is worked out from the chart
    and the submitted leaf alone, so it names neither a value, the branch the evidence takes, where the
    evidence leaves that path, nor any leaf but the one submitted: a learner who switches to the other
    branch of a question it names passes no sooner than one guessing leaves at random."""
    truth = flowchart.diagnose(observations)
    for s in truth.steps:
        q = flowchart.QUESTIONS[s.question]
        taken = q.yes if s.answer == "yes" else q.no
        if leaf not in _reachable(taken):
            return recheck_own_path(leaf)
    if truth.undecided is not None:
        return (f"{leaf} is not shown by this evidence: the walk cannot decide {truth.undecided.id} "
                f"({truth.undecided.text}) from it")
    return f"{leaf} is not it: the measured evidence does not lead there"


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else repr(v)


def _shown(v: Any) -> str:
    """A reading for a reader: floats to three significant digits, inside dicts and lists too."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_shown(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_shown(x) for x in v) + "]"
    if isinstance(v, float) and abs(v) >= 1000:  # whole units read better than 3.42e+03
        return f"{v:.0f}"
    return _fmt(v)


def observations_text(observations: dict[str, Any]) -> list[str]:
    """What the probes show, one line per reading as a learner reads it: numbers to three significant
    digits (the drill file keeps full precision), each reading's spread and source beside it where the
    drill states them."""
    src, spreads = observations.get("metric_sources", {}), observations.get("metric_spreads", {})
    lines = []
    for k, v in observations.items():
        if k in ("metric_sources", "metric_spreads"):
            continue
        sp = spreads.get(k)
        lines.append(f"  {k} = {_shown(v)}"
                     + (f" (spread {_fmt(sp['lo'])}-{_fmt(sp['hi'])}, {sp.get('what', '')})" if sp else "")
                     + (f"   <- {src[k]}" if k in src else ""))
    return lines


def _reachable(node: str) -> set[str]:
    if node in flowchart.LEAVES:
        return {node}
    q = flowchart.QUESTIONS[node]
    return _reachable(q.yes) | _reachable(q.no)


def reveal(drill: Drill) -> dict[str, Any]:
    f = drill.fault()
    return {"fault": f.name, "leaf": f.leaf, "workload": f.workload,
            "path": flowchart.diagnose(drill.observations).path}


def pool_check() -> dict[str, Any]:
    """The instructor's self-check of the drill pool (``hwlab drill pool``; it names every fault's leaf,
    so it is never in a learner's notebook): per fault, the drill the kit's refresh script ran on the
    H200 (faulty and fixed, the right answer graded with the fixed run re-measured), and every fault
    graded once with its leaf and once with a wrong one, from recorded evidence."""
    from hwlab.core import evidence

    rec = evidence.recorded("drills")
    rows = []
    for r in rec.extra["drills"]:
        if "error" in r:
            rows.append({"fault": r["fault"], "error": r["error"]})
            continue
        walk = flowchart.diagnose(r["drill"]["observations"])
        src = r["drill"]["observations"].get("metric_sources", {}).values()
        rows.append({"fault": r["fault"], "live": r["drill"]["live"], "probes_leaf": walk.leaf_id,
                     "by_hand": bool(walk.by_hand), "constructed": any("CONSTRUCTED" in str(v) for v in src),
                     "right_answer_passed": bool(r["right"]["correct_leaf"] and r["right"]["evidence_supports"]),
                     "fixed_leaf": flowchart.diagnose(r["right"]["fix_evidence"]).leaf_id,
                     "wrong": {"leaf": r["wrong"]["submitted_leaf"],
                               "told": contradiction(r["drill"]["observations"], r["wrong"]["submitted_leaf"])}})
    grades = []
    for name, fault in FAULTS.items():
        d = new(seed=1, fault=name, live=False)
        grades.append(grade(d, fault.leaf, learner="reference"))
        grades.append(grade(d, next(x for x in ("G", "J", "L", "OK") if x != fault.leaf), learner="a learner guessing"))
    return {"recorded": {"source": rec.label, "drills": rows}, "graded_once": class_summary(grades),
            "faults": {n: f.leaf for n, f in FAULTS.items()}}


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
