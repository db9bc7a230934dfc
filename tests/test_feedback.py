"""Every exercise check's feedback teaches without telling (issue 49, item 3), on the inputs the exercises
and notebook 09 grade: a wrong answer's message prints none of what the check's own reference
(:class:`hwlab.course.tries.Reference`, recomputed from the same evidence) says a passing answer is: the
right leaf or its title, the value, count, groups or names, the accepted range's ends, the measured
figure. After three wrong tries the answer may be revealed, and the class record marks it revealed
(`hwlab class summary` counts it).

The checks are enumerated from the index the exercises import (:mod:`hwlab.course.exercise_checks`) and
from :mod:`hwlab.course.reading_checks` and :mod:`hwlab.course.exercise`: a new check without a case here fails
:func:`test_every_check_has_a_reference_and_wrong_answers_here`."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hwlab.core import evidence, topology
from hwlab.course import classroom, exercise as X, exercise_checks as E, reading_checks as R, reading_facts as F, tries
from hwlab.diagnosis import flowchart

TRACES = evidence.TRACES_DIR
TOPO = evidence.RECORDED_DIR / "topology"
ROWS, COLS = 96, 160
DEVICES = [0, 5, 1, 4, 2, 3]


@pytest.fixture(autouse=True)
def fresh_tries(monkeypatch):
    """Each test starts at its first try, with no class folder unless it sets one."""
    monkeypatch.setattr(tries, "_wrong", {})
    monkeypatch.setattr(tries, "_pending", {})
    monkeypatch.setattr(tries, "_revealed", set())
    monkeypatch.delenv(classroom.ENV_DIR, raising=False)


def _dgx1():
    return topology.parse_topo_matrix((TOPO / "dgx1_v100_hybrid_cube_mesh.txt").read_text())


def _far(x: float) -> list[float]:
    """Readings well outside any band around ``x``, one each way."""
    return [round(x * 3 + 7, 2), round(x / 4 - 3, 2)]


# ---- the wrong answers: per check, (args, kwargs) calls built from the check's own reference -------------

def _bytes():
    m = E.bytes_reference(None, ROWS, COLS).answer["bytes moved / bytes required (access meter)"]
    return [((r, ROWS, COLS), {}) for r in _far(m)]


def _transposed():
    from hwlab.labs.bandwidth import transposed
    return [((transposed.eager, [], ROWS, COLS, torch.float16), {})]       # torch computes, no kernel of yours


def _own():
    from hwlab.labs.bandwidth import transposed
    mk = lambda: transposed.make_inputs(ROWS, COLS, torch.float16)  # noqa: E731
    return [(("own kernel", transposed.eager, [], transposed.reference, mk), {"tol": 1e-2, "n_bytes": 1})]


def _kernel():
    mk = lambda: (torch.randn(64),)  # noqa: E731
    return [(("double", lambda x: x * 3, lambda x: x + x, mk), {"tol": 1e-6, "n_bytes": 512})]


def _value():
    return [(("flowchart leaf", w, "G", "the chain is bound by its DRAM traffic"), {}) for w in ("J", "I")]


def _limiter():
    from hwlab.labs.registers import TileConfig
    cfg = TileConfig(64, 64, 32, 4, 3)
    ref = E.limiter_reference(cfg).answer
    wrong = [k for k in ("registers", "shared memory", "warps", "spills")
             if k.replace(" ", "_") not in ref["the limit that binds"]]
    return [((cfg, w, "it is the limit"), {}) for w in wrong]


def _occupancy():
    ref = E.occupancy_reference(256, 1).answer
    n, binds = ref["blocks per SM"], ref["the limit that binds"]
    wrong_limit = next(k for k in ("registers", "shared memory", "warps", "block slots") if k not in binds)
    return [((256, 1, n + 3, binds), {}), ((256, 1, max(1, n - 1), binds), {}), ((256, 1, n, wrong_limit), {})]


def _warps():
    best = E.warps_reference(4096).answer["warps"]
    best = best if isinstance(best, list) else [best]
    return [((4096, w), {}) for w in E.SOFTMAX_WARPS if w not in best]


def _crossing():
    ref = E.crossing_reference(_dgx1(), DEVICES, 2).answer
    groups, cells = ref["CROSSING"], ref["EVIDENCE"]
    calls = [((_dgx1(), DEVICES, 2, groups, cells, leaf), {}) for leaf in flowchart.LEAVES if leaf != ref["LEAF"]]
    calls.append(((_dgx1(), DEVICES, 2, groups[:1], dict(list(cells.items())[:1]), ref["LEAF"]), {}))
    return calls


def _mapping():
    from hwlab.core import mapping
    return [((_dgx1(), DEVICES, g, 2), {}) for g in (mapping.naive_groups(_dgx1(), 2), [[0, 5], [1, 4], [2, 3]])]


def _fallback():
    ref = E.fallback_reference().answer
    rows, _ = E.fallback_buckets()
    other = next(r["ctx"] for r in rows if r["ctx"] != ref["MY_BUCKET"])
    return [((other, ref["MY_MODULE"]), {}), ((ref["MY_BUCKET"], "qkv"), {})]


def _fp8_path():
    ref = E.fp8_path_reference().answer["MY_PATH"]
    rows, _ = E.kv_buckets()
    wrong_kv = min(r["ctx"] for r in rows) if ref["kv_fp8_from_ctx"] != min(r["ctx"] for r in rows) else None
    return [(({**ref, "head": "fp8_static"},), {}), (({**ref, "kv_fp8_from_ctx": wrong_kv},), {})]


def _case_fallback():
    buckets = E.case_buckets()
    ref = E.case_fallback_reference(buckets=buckets).answer
    quiet = next(b["ctx"] for b in buckets if not b["fell_back"])
    b, i, o = ref["MY_SHAPE"]
    right = (ref["MY_BUCKET"], ref["MY_MODULE"], ref["MY_DEQUANTS"], ref["MY_SHAPE"])
    return [((quiet, *right[1:], buckets), {}), ((right[0], "qkv", *right[2:], buckets), {}),
            ((*right[:2], ref["MY_DEQUANTS"] + 3, right[3], buckets), {}),
            ((*right[:3], (b + 1, o, i), buckets), {})]


def _case_batches():
    from hwlab.labs.fp8 import bucket_case as case

    fix = E.case_batches_reference().answer["MY_BATCHES"]
    grown = next(c for c in fix if fix[c] != dict(case.CASE_BUCKETS)[c])
    today = dict(case.CASE_BUCKETS)
    return [(({**today, grown: today[grown] - 1},), {}), ((today,), {}), (({**fix, grown: fix[grown] + 4},), {})]


GPU_TRACE = next((TRACES / "h200_nccl_one_rank").glob("*.pt.trace.json.gz"))
RANKS = TRACES / "slow_link_tbf"
RANK0 = sorted(RANKS.glob("*.pt.trace.json.gz"))[0]
NCCL_LOG = evidence.RECORDED_DIR / "runs" / "straggler_nccl_h200" / "vm" / "nccl.764.log"
RAW_CASES, RAW_TILES = ("lab01_fused",), ("lab02_64x64x32x4x3", "lab02_256x256x64x4x2")


def _gpu_trace():
    ref = R.gpu_trace_reference(GPU_TRACE).answer
    row, sync = ref["row"][0], ref["sync_call"][0]
    f = F.gpu_trace_facts(GPU_TRACE)
    host_row = next((r for r in f.get("host_rows", []) if r not in ref["row"]), "host thread 1")
    return [((GPU_TRACE, {"gap_us": g, "row": row, "sync_call": sync}), {}) for g in _far(ref[next(iter(ref))])] + \
        [((GPU_TRACE, {"gap_us": ref[next(iter(ref))], "row": host_row, "sync_call": "cudaLaunchKernel"}), {})]


def _rank_wait():
    ref = R.rank_wait_reference(RANKS).answer
    span = ref["span"][0]
    ranks = F.rank_wait_facts(RANKS)["ranks"]
    late = ref["late_rank"]
    wrong_late = next(r for r in ranks if r != late) if late != R.NO_LATE_RANK else ranks[0]
    wait = ref["wait_ms (median)"]
    return [((RANKS, {"late_rank": late, "wait_ms": w, "span": span}), {}) for w in _far(wait)] + \
        [((RANKS, {"late_rank": wrong_late, "wait_ms": wait, "span": "c10d::allreduce_"}), {})]


def _host_gap():
    return [((RANK0, {"gap_ms": g}), {}) for g in _far(R.host_gap_reference(RANK0).answer["gap_ms (median)"])]


def _ncu01():
    ref = R.ncu_lab01_reference("strided").answer
    keys = ("dram_pct", "sector_amplification", "estimate_pct_of_peak")
    right = {k: ref[k] for k in keys}
    return [(("strided", {**right, k: _far(right[k])[i % 2]}), {}) for i, k in enumerate(keys)]


def _ncu02():
    cfg = "256x256x64 w4 s2"
    ref = R.ncu_lab02_reference(cfg).answer
    keys = ("registers", "spills", "achieved_occupancy_pct")
    right = {**{k: ref[k] for k in keys}, "binding_metric": ref["binding_metric"][0]}
    limits = F.ncu_lab02(cfg)["limits"]
    loose = next("launch__occupancy_limit_" + k for k in limits if "launch__occupancy_limit_" + k not in ref["binding_metric"])
    return [((cfg, {**right, k: _far(right[k])[0]}), {}) for k in keys] + [((cfg, {**right, "binding_metric": loose}), {})]


def _ncu_raw():
    ref = R.ncu_raw_reference(RAW_CASES, RAW_TILES).answer
    spr = {c: ref[f"sectors_per_request[{c}]"] for c in RAW_CASES}
    right = {"sectors_per_request": spr, "spilling_tile": ref["spilling_tile"], "local_sectors": ref["local_sectors"]}
    other = next(t for t in RAW_TILES if t != ref["spilling_tile"])
    return [((RAW_CASES, RAW_TILES, {**right, "local_sectors": _far(ref["local_sectors"])[1] * -1}), {}),
            ((RAW_CASES, RAW_TILES, {**right, "spilling_tile": other}), {}),
            ((RAW_CASES, RAW_TILES, {**right, "sectors_per_request": {c: _far(v)[0] for c, v in spr.items()}}), {})]


def _slow_pairs():
    text, group = (TOPO / "pcie4_2socket_pix_sys.txt").read_text(), [1, 2, 3]
    ref = R.slow_pairs_reference(text, group).answer
    f = F.slow_pairs(text, group)
    fast = [p for p in f["links"] if p not in ref["pairs"]]
    other = next(c for c in ("PIX", "PXB", "PHB", "NODE", "SYS") if c != ref["link"])
    return [((text, group, {"pairs": fast or ref["pairs"][:1], "link": other}), {}),
            ((text, group, {"pairs": ref["pairs"][:1], "link": ref["link"]}), {})]


def _nccl():
    log = NCCL_LOG.read_text()
    ref = R.nccl_path_reference(log).answer
    paths = [p for p in F.nccl_paths(log) if p["src"].startswith("GPU/") and p["type"] != "LOC"]
    faster = max(paths, key=lambda p: p["gbps"])
    return [((log, {"gbps": faster["gbps"], "type": faster["type"]}), {}), ((log, {"gbps": 7.0, "type": "LOC"}), {})]


#: the limits' names, which the questions themselves print (exercise 02)
LIMIT_WORDS = {"registers", "shared memory", "shared mem", "warps", "block slots", "blocks", "spills"}
SLOW = pytest.mark.slow
#: check -> (its module, its wrong calls, slow or not)
CASES = {
    "check_bytes_prediction": (E, _bytes, ()), "check_transposed_kernel": (E, _transposed, ()),
    "check_own_kernel": (E, _own, ()), "check_kernel": (X, _kernel, ()), "check_value": (X, _value, ()),
    "check_limiter": (E, _limiter, (SLOW,)), "check_occupancy_prediction": (E, _occupancy, (SLOW,)),
    "check_warps_choice": (E, _warps, (SLOW,)), "check_crossing": (E, _crossing, ()),
    "check_job_mapping": (E, _mapping, ()), "check_fallback_bucket": (E, _fallback, ()),
    "check_fp8_path": (E, _fp8_path, ()), "check_case_fallback": (E, _case_fallback, (SLOW,)),
    "check_case_batches": (E, _case_batches, (SLOW,)),
    "check_gpu_trace": (R, _gpu_trace, ()), "check_rank_wait": (R, _rank_wait, ()),
    "check_host_gap": (R, _host_gap, ()), "check_ncu_lab01": (R, _ncu01, ()), "check_ncu_lab02": (R, _ncu02, ()),
    "check_ncu_raw": (R, _ncu_raw, ()), "check_slow_pairs": (R, _slow_pairs, ()), "check_nccl_path": (R, _nccl, ()),
}
PARAMS = [pytest.param(name, marks=marks, id=name) for name, (_, _, marks) in CASES.items()]


def _checks(mod) -> set[str]:
    """The checks a module offers: its functions named check_* defined on the course floor."""
    return {n for n in dir(mod) if n.startswith("check_") and callable(getattr(mod, n))
            and getattr(getattr(mod, n), "__module__", "").startswith("hwlab.course.")}


def test_every_check_has_a_reference_and_wrong_answers_here():
    index = _checks(E) | _checks(R) | _checks(X)
    assert index == set(CASES), f"checks without a case here: {index - set(CASES)}; gone: {set(CASES) - index}"
    for name, (mod, _, _) in CASES.items():
        assert callable(getattr(getattr(mod, name), "reference", None)), f"{name} is not declared with tries.graded"


# ---- what a wrong message must not print --------------------------------------------------------------

def _number_forms(x: float) -> set[str]:
    x = float(x)
    forms = {f"{x:.3g}", f"{x:.2f}", f"{x:.1f}", f"{x:g}", f"{x:.0f}", f"{x:,.0f}"}
    return {f for f in forms if len(f.strip("-0.,")) >= 2}  # "1" or "0.0" are in any text


def _secrets(v, key: str = "") -> list[tuple[str, str]]:
    """(regex, what) for each way value ``v`` of the reference could be printed."""
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, (int, float)):
        out = [(rf"(?<![\d.]){re.escape(f)}(?![\d])", f) for f in _number_forms(v)]
        if isinstance(v, int) or float(v).is_integer():  # a small count: as a count of something
            out.append((rf"(?<![\w.,(-]){int(v)} (per SM|blocks?\b|warps?\b|weights?\b|dequant)", f"{int(v)} as a count"))
        return out
    if isinstance(v, str):
        if v.replace("_", " ") in LIMIT_WORDS or all(w in LIMIT_WORDS for w in v.split(" and ")):
            # a limit's name is the question's own vocabulary (the compile report prints "registers/thread"):
            # what must not be printed is that it binds
            names = "|".join(re.escape(w) for w in v.replace("_", " ").split(" and "))
            return [(rf"(?i)(bound by|binding:?|limit that binds is|limiter is) ({names})|({names}) binds?",
                     f"{v} binds")]
        if v in flowchart.LEAVES:
            return [(rf"\b{v}\b", f"leaf {v}"), (re.escape(flowchart.LEAVES[v].title), "the leaf's title")]
        return [(rf"(?i)(?<![\w]){re.escape(v)}(?![\w])", v)] if len(v) >= 3 else []
    if isinstance(v, dict):
        return [s for k, x in v.items() for s in _secrets(k, key) + _secrets(x, key)]
    if isinstance(v, (list, tuple)):
        out = [(re.escape(str(v)), str(v))] if v else []
        if len(v) == 2 and all(isinstance(x, int) for x in v):
            out.append((rf"GPU{v[0]}-GPU{v[1]}\b", f"GPU{v[0]}-GPU{v[1]}"))
        return out + [s for x in v if not isinstance(x, (int, float)) for s in _secrets(x, key)]
    return []


def _own_text(args, kwargs) -> set[str]:
    """The learner's own answer as the feedback may quote it back."""
    out: set[str] = set()

    def add(x):
        if isinstance(x, bool) or x is None:
            return
        if isinstance(x, (int, float)):
            out.update({f"{x:g}", f"{x:.2f}", f"{float(x):.2f}x", str(x)})
        elif isinstance(x, str) and len(x) < 60:
            out.update({x, repr(x)})
        elif isinstance(x, dict):
            out.add(repr(x))
            for k, y in x.items():
                add(k)
                add(y)
        elif isinstance(x, (list, tuple)):
            out.add(str(x))
            for y in x:
                add(y)
    for a in (*args, *kwargs.values()):
        add(a)
    return out


def _strip(text: str, own: set[str]) -> str:
    for s in sorted(own, key=len, reverse=True):
        if len(s) >= 2:
            text = text.replace(s, "")
    return text


@pytest.mark.parametrize("name", PARAMS)
def test_a_wrong_answer_prints_nothing_of_the_checks_reference(name):
    mod, wrongs, _ = CASES[name]
    check = getattr(mod, name)
    calls = wrongs()
    assert calls, name
    for args, kwargs in calls:
        res = check(*args, **kwargs)
        assert res.status == "wrong", (name, args, res)
        ref = check.reference(*args, **kwargs)
        assert ref.answer or ref.how, name
        text = _strip(str(res), _own_text(args, kwargs))
        leaked = [what for key, v in ref.answer.items() for rx, what in _secrets(v, key) if re.search(rx, text)]
        assert not leaked, (name, leaked, str(res))
        assert ", revealed:" not in text and ref.render() not in text


@pytest.mark.parametrize("name", PARAMS)
def test_three_wrong_tries_reveal_the_answer_recorded_as_revealed(name, tmp_path, monkeypatch):
    d = tmp_path / "class"
    monkeypatch.setenv(classroom.ENV_DIR, str(d))
    monkeypatch.setenv(classroom.ENV_LEARNER, "ada")
    mod, wrongs, _ = CASES[name]
    check = getattr(mod, name)
    args, kwargs = wrongs()[0]
    first = check(*args, **kwargs)
    item = first.name
    assert "after 3 tries" in tries.reveal(item) and "nb.reveal" not in first.message
    check(*args, **kwargs)
    third = check(*args, **kwargs)
    assert third.tries == 3 and f"nb.reveal({item!r})" in third.message
    shown = tries.reveal(item)
    assert shown == f"{item}, revealed: {check.reference(*args, **kwargs).render()}"
    assert tries.reveal(item) == shown                       # asked again: recorded once
    results, bad = classroom.load_results(d)
    assert not bad
    mine = [r for r in results if r["item"] == item]
    assert [r["revealed"] for r in mine] == [False, False, False, True] and not any(r["passed"] for r in mine)
    row = classroom.summary(results)["items"][f"exercise: {item}"]
    assert (row["attempts"], row["revealed"], row["passed"]) == (3, 1, 0)
    assert "answer revealed" in classroom.render(classroom.summary(results))


def test_a_blank_or_an_environment_problem_is_not_a_try(monkeypatch):
    from hwlab.course import toolchain_check

    for _ in range(4):
        assert E.check_bytes_prediction(None, ROWS, COLS).status == "not done yet"
    assert "no wrong try" in tries.reveal("bytes the eager chain moves")
    monkeypatch.setattr(toolchain_check, "_triton_version", lambda: None)  # Triton missing: not the learner's
    (args, kwargs), = _transposed()
    for _ in range(4):
        assert E.check_transposed_kernel(*args, **kwargs).status == toolchain_check.ENV
    assert tries._wrong == {}


def test_the_checkpoints_and_the_exercise_checks_count_tries_in_one_place():
    """A checkpoint's wrong tries and an exercise check's are counted by the same mechanism (one dict,
    one threshold), so the reveal rule cannot drift between them."""
    from hwlab.course import checkpoint as C

    assert C.TRIES_BEFORE_REVEAL == tries.TRIES_BEFORE_REVEAL
    ev = evidence.recorded("lab03_slowlink", "cpu").extra["experiment"]["naive"]["flowchart_evidence"]
    cp = C.Checkpoint("03", flowchart.diagnose(ev), ev)
    s = cp.asked()
    C.check(cp, C.Answer("G", s.metric, float(s.value)))
    X.check_value("flowchart leaf", "J", "G", "why")
    assert tries._wrong == {"checkpoint 03": 1, "exercise flowchart leaf": 1}


def test_summary_of_a_class_folder_counts_reveals_apart_from_tries(tmp_path, monkeypatch):
    """`hwlab class summary` (the real CLI) shows the reveal column."""
    import json
    import subprocess
    import sys

    d = tmp_path / "class"
    monkeypatch.setenv(classroom.ENV_DIR, str(d))
    for _ in range(3):
        X.check_value("flowchart leaf", "J", "G", "why")
    tries.reveal("flowchart leaf")
    r = subprocess.run([sys.executable, "-m", "hwlab", "class", "summary", str(d), "--json"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)["items"]["exercise: flowchart leaf"]
    assert (row["attempts"], row["revealed"]) == (3, 1)
