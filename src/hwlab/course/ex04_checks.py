"""Exercise 04: the FP8 path's rules (:func:`check_fp8_path`: the head in high precision, FP8 KV per
bucket where its bytes pay, graded on Lab 4's recorded H200 bytes; the bucket that falls back,
:func:`check_fallback_bucket`), and the bucket case (:mod:`hwlab.labs.fp8.bucket_case`): the bucket,
layer kind, dequant count and GEMM shape from a live profile of each bucket (:func:`check_case_fallback`),
and a bucket mix with no fallback (:func:`check_case_batches`), re-profiled. Part 1's pass names what
Part 1 asked, never Part 2's answer."""
from __future__ import annotations

import functools
from typing import Any

import torch

from hwlab.course.exercise import ExerciseResult, not_done
from hwlab.course.toolchain_check import environment_problem, toolchain_problem
from hwlab.course.tries import Reference, graded

#: FP8 KV pays where the KV cache is at least this share of a decode step's bytes: FP8 halves
#: it, so the step moves >= 25% fewer bytes (the issue's gain where bytes dominate); below it the
#: saving is the size of what quantize-on-write and the scales cost
KV_SHARE_PAYS_PCT = 50.0
#: on a GPU the learner's decode TPOT at Lab 4's short bucket must be at most this x bf16's (same
#: run): a path whose trunk and connector run FP8 GEMMs with the head in bf16 moves about a fifth
#: fewer bytes there (the lab's byte model); one that still dequantizes its head or connector moves
#: about as many as bf16
TPOT_BAND = 0.9
HEAD_REASON = ("the seed's fix says 先保留敏感头高精: keep the sensitive output head in high precision "
               "first; its logits decide every token, and an FP8 head is where the error shows")


def kv_buckets() -> tuple[list[dict[str, Any]], str]:
    """Per context bucket of Lab 4's recorded H200 service: the KV cache's share of the bytes one
    decode step moves on the bf16 path (the bucket's full batch at its context, by the lab's byte
    model), and the run's label."""
    from hwlab.core.evidence import recorded
    from hwlab.labs import fp8

    ev = recorded("lab04_fp8")
    run = ev.extra["run"]
    cfg = fp8.ModelConfig(**run["config"])
    rows = []
    for b in run["stream"]["paths"]["bf16"]["buckets"]:
        ctx, n = b["profile"]["ctx"], b["profile"]["batch"]
        step = fp8.step_bytes(cfg, fp8.PATHS["bf16"], n, n * (ctx + 1), False)
        kv = step - fp8.step_bytes(cfg, fp8.PATHS["bf16"], n, 0, False)
        rows.append({"ctx": ctx, "batch": n, "kv_bytes": kv, "decode_bytes": step, "kv_share_pct": 100.0 * kv / step})
    return rows, ev.label


def grade_kv(kv_fp8_from_ctx: int | None) -> tuple[bool, str]:
    """Whether FP8 KV is chosen exactly where it pays (:data:`KV_SHARE_PAYS_PCT`), and what to say: on a
    pass each bucket's KV share; on a miss that a bucket contradicts the rule, not how many, which way
    nor their shares (the share is what the learner computes)."""
    rows, label = kv_buckets()
    bad, lines = [], []
    for r in rows:
        chosen = kv_fp8_from_ctx is not None and r["ctx"] >= kv_fp8_from_ctx
        pays = r["kv_share_pct"] >= KV_SHARE_PAYS_PCT
        lines.append(f"ctx {r['ctx']} x{r['batch']}: KV {r['kv_share_pct']:.0f}% of the step's bytes -> "
                     f"{'FP8 pays' if pays else 'FP8 does not pay'}; you chose {'FP8' if chosen else 'bf16'}")
        if chosen != pays:
            bad.append(r["ctx"])
    if bad:
        # not how many buckets: a count per try would say how far the threshold is from the answer
        return False, (f"your KV choice goes against the rule (FP8 KV where the KV cache is >= "
                       f"{KV_SHARE_PAYS_PCT:.0f}% of a decode step's bytes) in a bucket: work out each bucket's "
                       f"KV share from its batch and context ({label}).")
    head = (f"KV cache per bucket (bytes {label}; FP8 KV pays at >= {KV_SHARE_PAYS_PCT:.0f}% of the step's bytes): "
            + "; ".join(lines))
    return True, head


def fallback_buckets() -> tuple[list[dict[str, Any]], str]:
    """Per context bucket of Lab 4's recorded H200 service, the ``mixed`` path's profiled decode
    step: FP8 hit rate, the layer kinds that fell back (``out``, ``head``...: the module names
    without their layer index) and TPOT p50/p99 change against bf16; and the run's label.
    Exercise 04's second part prints these."""
    from hwlab.core.evidence import recorded
    from hwlab.labs import fp8

    ev = recorded("lab04_fp8")
    rep = fp8.performance_report(ev.extra["run"]["stream"], "mixed")
    rows = []
    for r, b in zip(rep["buckets"], ev.extra["run"]["stream"]["paths"]["mixed"]["buckets"]):
        kinds = sorted({n.split(".")[-1] for n in b["profile"]["fallback_modules"]})
        rows.append({"ctx": r["ctx"], "batch": r["batch"], "fp8_hit_pct": r["fp8_hit_pct"], "fell_back": kinds,
                     "tpot_p50_change_pct": r["tpot_p50_change_pct"], "tpot_p99_change_pct": r["tpot_p99_change_pct"]})
    return rows, ev.label


def fallback_reference(ctx=None, module=None) -> Reference:
    """What passes :func:`check_fallback_bucket`: the bucket that hits FP8 least and what falls back only there."""
    rows, label = fallback_buckets()
    low = min(rows, key=lambda r: r["fp8_hit_pct"])
    only = sorted(set(low["fell_back"]).difference(*[r["fell_back"] for r in rows if r is not low]))
    return Reference({"MY_BUCKET": low["ctx"], "MY_MODULE": only[0] if len(only) == 1 else only,
                      "its FP8 hit %": low["fp8_hit_pct"]}, how=f"from {label}")


@graded(fallback_reference)
def check_fallback_bucket(ctx, module) -> ExerciseResult:
    """Exercise 04, part 2: ``ctx`` must be the context of the bucket where the recorded ``mixed``
    path hits FP8 least, and ``module`` the layer kind that falls back there and in no other bucket
    (both recomputed from the record's profiles, not from a label)."""
    name = "the bucket that falls back"
    if ctx is None or module is None:
        return not_done(name, "Set MY_BUCKET to a context length and MY_MODULE to a layer kind, as printed above.")
    rows, label = fallback_buckets()
    by_ctx = {r["ctx"]: r for r in rows}
    if ctx not in by_ctx:
        return ExerciseResult(name, "wrong", f"no bucket at context {ctx!r}: pick one of {sorted(by_ctx)}")
    low = min(rows, key=lambda r: r["fp8_hit_pct"])
    only = set(low["fell_back"]).difference(*[r["fell_back"] for r in rows if r is not low])
    if ctx != low["ctx"]:
        return ExerciseResult(name, "wrong", f"ctx {ctx} hits FP8 on {by_ctx[ctx]['fp8_hit_pct']:.0f}% of its GEMMs; "
                              f"another bucket hits less ({label})")
    if module not in only:
        return ExerciseResult(name, "wrong", f"{module!r} is not what falls back only in that bucket: compare the "
                              f"'fell back' lists of the buckets ({label})")
    return ExerciseResult(name, "passed", f"ctx {ctx} x{low['batch']}: FP8 on {low['fp8_hit_pct']:.0f}% of the GEMMs, "
                          f"{module} falls back only there: its FP8 kernel has no shape for that batch ({label})")


def _tpot_band(path: dict[str, Any]) -> tuple[bool, str]:
    """bf16 and the learner's path at Lab 4's short bucket on this GPU, same run."""
    from hwlab.labs import fp8

    short = min(fp8.default_streams("cuda"), key=lambda s: s.ctx)
    ctx, batch = short.ctx, short.max_batch
    t = {}
    for label, p in (("bf16", "bf16"), ("yours", path)):
        m = fp8.Decoder(fp8.H200_SIZE, p)
        t[label] = fp8.time_prefill_decode(m, batch, ctx)["tpot_ms"]
        del m
        torch.cuda.empty_cache()
    ratio = t["yours"] / t["bf16"]
    return ratio <= TPOT_BAND, (f"decode TPOT at ctx {ctx} x{batch}: yours {t['yours']:.3f} ms, bf16 "
                                f"{t['bf16']:.3f} ms in this run = {ratio:.2f}x (band <= {TPOT_BAND}x)")


def fp8_path_reference(path=None, device=None) -> Reference:
    """What passes :func:`check_fp8_path`: the head in bf16, FP8 KV from the first bucket where it pays,
    and the lab's fixed path for the rest."""
    from hwlab.labs import fp8

    rows, label = kv_buckets()
    pays = [r["ctx"] for r in rows if r["kv_share_pct"] >= KV_SHARE_PAYS_PCT]
    fixed = {k: fp8.PATHS["fixed"][k] for k in ("main", "connector", "head")}
    return Reference({"MY_PATH": {**fixed, "kv_fp8_from_ctx": min(pays) if pays else None}},
                     how=f"FP8 KV where the KV cache is >= {KV_SHARE_PAYS_PCT:.0f}% of a decode step's bytes ({label})")


@graded(fp8_path_reference)
def check_fp8_path(path: dict | None, device=None) -> ExerciseResult:
    """Exercise 04's checker (see the module docstring for each rule and why)."""
    from hwlab.labs import fp8
    from hwlab.core.measure import device_of

    name = "FP8 path"
    if path is None:
        return not_done(name, "Set MY_PATH to a dict with main/connector/head/kv_fp8_from_ctx.")
    if not isinstance(path, dict) or not {"main", "connector", "head"} <= set(path):
        return ExerciseResult(name, "wrong", "MY_PATH must be a dict with main, connector, head and "
                              "kv_fp8_from_ctx (a context length, or None for a bf16 KV cache)")
    if path["head"] != "bf16":
        return ExerciseResult(name, "wrong", f"head = {path['head']!r}: {HEAD_REASON}.")
    problem = toolchain_problem()
    if problem:
        return environment_problem(name, problem)
    kv_ok, kv_msg = grade_kv(path.get("kv_fp8_from_ctx"))
    if not kv_ok:
        return ExerciseResult(name, "wrong", kv_msg)
    base = fp8.grade_path(path)
    if not base.passed:
        return base
    if device_of(device).type != "cuda":
        return ExerciseResult(name, "passed (correctness only)",
                              f"{base.message} {kv_msg}. TPOT is graded on a GPU against its bf16 TPOT.")
    ok, msg = _tpot_band(path)
    return ExerciseResult(name, "passed" if ok else "too slow", f"{base.message} {kv_msg}. {msg}.")


# ---------------------------------------------------------------- 04 (the bucket case): another layer falls back
@functools.lru_cache(maxsize=64)
def bucket_profile(batch: int, ctx: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One decode step of the bucket case at ``batch`` x ``ctx``, profiled live on this machine's CPU
    (:func:`hwlab.labs.fp8.bucket_case.bucket_profile_table`), once per process: the instance's model is
    built once and a step leaves its weights as they were, so the same shape profiles the same. The
    result is shared: read it, do not change it."""
    from hwlab.labs.fp8 import bucket_case as case

    return case.bucket_profile_table(case.case_model("cpu"), batch, ctx)


def case_buckets(batches: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Each bucket of Lab 4's second instance (:mod:`hwlab.labs.fp8.bucket_case`), profiled live
    on this machine's CPU: its profiler rows and the step's own counts (which layers dequantized)."""
    from hwlab.labs.fp8 import bucket_case as case

    out = []
    for ctx, batch in case.CASE_BUCKETS:
        b = (batches or {}).get(ctx, batch)
        rows, hits = bucket_profile(b, ctx)
        out.append({"ctx": ctx, "batch": b, "table": rows, "hits": hits,
                    "fell_back": sorted({n.split(".")[-1] for n in hits["fallback_modules"]})})
    return out


def case_fallback_reference(ctx=None, module=None, n_dequant=None, shape=None, buckets=None) -> Reference:
    """What passes :func:`check_case_fallback`: the bucket, layer kind, dequant count and GEMM shape, from
    each bucket's profile."""
    from hwlab.labs.fp8 import bucket_case as case

    b = next(b for b in (buckets or case_buckets()) if b["fell_back"])
    shapes = case.layer_shapes(case.case_model("cpu"))
    mod = b["fell_back"][0]
    o, i = shapes[mod]
    return Reference({"MY_BUCKET": b["ctx"], "MY_MODULE": mod, "MY_DEQUANTS": b["hits"]["dequant_ranges"],
                      "MY_SHAPE": (b["batch"], i, o)}, how="[profiled live on this machine's CPU]")


@graded(case_fallback_reference)
def check_case_fallback(ctx, module, n_dequant, shape, buckets: list[dict[str, Any]] | None = None) -> ExerciseResult:
    """Exercise 04, part 1: the bucket whose decode step falls back, the layer kind, how many weights
    that step dequantizes and the shape (rows, in_features, out_features) of the bf16 GEMM that reads a
    dequantized copy: all recomputed from a fresh profile of each bucket (the layers that dequantized
    in the step), never from a label. A wrong answer is told what the profile of the bucket or layer it
    named shows."""
    from hwlab.labs.fp8 import bucket_case as case

    name = "the bucket and the layer that fall back"
    if ctx is None or module is None or n_dequant is None or shape is None:
        return not_done(name, "Set MY_BUCKET, MY_MODULE, MY_DEQUANTS and MY_SHAPE.")
    buckets = buckets or case_buckets()
    by_ctx = {b["ctx"]: b for b in buckets}
    if ctx not in by_ctx:
        return ExerciseResult(name, "wrong", f"no bucket at context {ctx!r}: this service's buckets are "
                              f"{sorted(by_ctx)}")
    b = by_ctx[ctx]
    n_deq = b["hits"]["dequant_ranges"]
    if not b["fell_back"]:
        return ExerciseResult(name, "wrong", f"ctx {ctx} x{b['batch']}: its profiled step has {n_deq} "
                              f"{case.DEQUANT_MARK} range(s): no weight is dequantized there.", answer=ctx)
    model = case.case_model("cpu")
    shapes = case.layer_shapes(model)
    mod = str(module).strip().lower()
    if mod not in shapes:
        return ExerciseResult(name, "wrong", f"MY_MODULE = {module!r}: name a layer kind, one of {sorted(shapes)}")
    if mod not in b["fell_back"]:
        o, i = shapes[mod]
        return ExerciseResult(name, "wrong", f"the {mod} layer's GEMM reads a ({o}, {i}) weight; in ctx {ctx}'s profile the "
                              f"rows with that weight shape are as many as in the other buckets. Find the weight "
                              "shape whose bf16 calls grow and whose FP8 row disappears there.", answer=mod)
    if int(n_dequant) != n_deq:
        return ExerciseResult(name, "wrong", f"MY_DEQUANTS = {n_dequant}: count the {case.DEQUANT_MARK} calls in "
                              f"ctx {ctx}'s table again (one per weight dequantized in the step).", answer=n_dequant)
    o, i = shapes[mod]
    want = (b["batch"], i, o)
    try:
        got = tuple(int(x) for x in shape)
    except (TypeError, ValueError):
        return ExerciseResult(name, "wrong", "MY_SHAPE is (rows, in_features, out_features)")
    if got != want:
        return ExerciseResult(name, "wrong", f"MY_SHAPE = {got}: read the input shapes of the aten::linear row that "
                              f"grew: the activation is (rows, 1, in_features) and the weight (out_features, "
                              "in_features).", answer=got)
    return ExerciseResult(name, "passed", f"ctx {ctx} x{b['batch']}: {n_deq} {mod} weights dequantized per step, "
                          f"each read by a bf16 GEMM of {want[0]} rows x {want[1]} -> {want[2]}: its FP8 library has "
                          f"no kernel for {want[0]} rows [profiled live on this machine's CPU].")


def case_batches_reference(batches=None) -> Reference:
    """What passes :func:`check_case_batches`: per bucket, the smallest batch at or above today's whose
    re-profiled step has no fallback."""
    from hwlab.labs.fp8 import bucket_case as case

    fix = {}
    for ctx, batch in case.CASE_BUCKETS:
        b = batch
        while bucket_profile(b, ctx)[1]["fallback_modules"]:
            b += 1
        fix[ctx] = b
    return Reference({"MY_BATCHES": fix}, how="[profiled live on this machine's CPU]")


@graded(case_batches_reference)
def check_case_batches(batches) -> ExerciseResult:
    """Exercise 04, part 2: a batch per bucket (``{ctx: batch}``) that serves at least as many
    rows as before, no fallback in any bucket's re-profiled step, and no bucket padded past the
    smallest row count its profile says has an FP8 kernel (checked by profiling the next smaller
    row count at or above the original batch)."""
    from hwlab.labs.fp8 import bucket_case as case

    name = "a bucket mix with no fallback"
    if batches is None:
        return not_done(name, "Set MY_BATCHES to {ctx: batch} for every bucket.")
    want_ctx = [c for c, _ in case.CASE_BUCKETS]
    if not isinstance(batches, dict) or sorted(batches) != sorted(want_ctx) or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in batches.values()):
        return ExerciseResult(name, "wrong", f"MY_BATCHES maps each bucket's context {want_ctx} to a whole batch size")
    orig = dict(case.CASE_BUCKETS)
    small = [c for c in want_ctx if batches[c] < orig[c]]
    if small:
        return ExerciseResult(name, "wrong", f"ctx {small}: fewer rows than the bucket serves today; the fix must "
                              "keep every bucket's capacity.")
    buckets = case_buckets(batches)
    bad = [b for b in buckets if b["fell_back"]]
    if bad:  # which buckets, not how many ranges: a count per try would be a figure to search on
        return ExerciseResult(name, "wrong", "; ".join(f"ctx {b['ctx']} x{b['batch']}: its profiled step still has "
                                                        f"{case.DEQUANT_MARK} ranges (a weight dequantized)"
                                                        for b in bad))
    for c in want_ctx:
        for smaller in range(orig[c], batches[c]):
            _, hits = bucket_profile(smaller, c)
            if not hits["fallback_modules"]:
                # no count of the rows too many: with it, the answer is one subtraction away
                # and no direction either: what to reconsider and where to read it, not which way to move
                return ExerciseResult(name, "wrong", f"ctx {c} x{batches[c]}: no fallback, but its steps carry "
                                      "padding rows the fix does not need: the fix pads each bucket only as far as the first "
                                      "row count that keeps its capacity and dispatches an FP8 kernel. Re-read the "
                                      "profile of each row count from the bucket's batch today (which of them "
                                      "has an FP8 kernel in its dispatch) and check yours is that first one.")
    hits = ", ".join(f"ctx {b['ctx']} x{b['batch']}: FP8 on {b['hits']['fp8_hits']} of {b['hits']['gemm_calls']} GEMMs"
                     for b in buckets)
    return ExerciseResult(name, "passed", f"no fallback in any bucket ({hits}; the rest bf16 by choice: head and edge "
                          "blocks) [profiled live on this machine's CPU].")
