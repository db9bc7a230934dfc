"""Exercise checkers that grade what each exercise is about (01, 02, 04), and tell a broken
toolchain apart from a wrong answer.

* **01 (write the fused kernel)**: the answer must run *the learner's* Triton kernel. The
  checker watches the call: every Triton kernel launched (``JITFunction.run`` /
  the interpreter's ``InterpretedFunction.run``) and every torch compute op dispatched
  (``TorchDispatchMode``). It refuses an answer that launches a kernel defined in hwlab,
  torch or triton (the kit's fused kernel, a ``torch.compile`` kernel), that launches none
  of the learner's kernels, or whose arithmetic ran as torch ops (the eager chain the
  exercise replaces): those answers say nothing about whether the learner can fuse.
  Allocation and copies (``empty``, ``empty_like``, ``copy_``; the interpreter's own) are allowed.
* **02 (remove the spill)**: the learner names the limiter (registers, shared memory, warps,
  or spills) and the checker compiles the chosen config for sm_90a (the static ``ptxas -v``
  report of :mod:`hwlab.labs.registers`), computes its occupancy (:mod:`hwlab.labs.registers.occupancy`)
  and compares: the named limiter must be one that binds (a tie names either).
* **04 (fix the FP8 path)**: the head stays high-precision (the seed's fix: 先保留敏感头高精,
  keep the sensitive head in high precision first); the FP8 KV cache is graded per bucket
  (FP8 KV where the KV cache is at least :data:`KV_SHARE_PAYS_PCT` % of the bytes a decode
  step moves, by the bytes the H200 run recorded, and nowhere else); no fallback GEMM, FP8
  hit rate and logit error (Lab 4's own checker); on a GPU, decode TPOT at Lab 4's short bucket
  must be at most :data:`TPOT_BAND` x this machine's bf16 TPOT measured in the same run.
  Its second part (:func:`check_fallback_bucket`): the learner names the bucket where the
  recorded ``mixed`` path hits FP8 least and the layer kind that falls back only there (the
  checker recomputes both from the record's profiles).

A toolchain problem (Triton missing or outside the versions the kit uses, its bundled ptxas
missing or failing) is reported as ``"environment problem"`` with the fix, never as a wrong
answer (:func:`toolchain_problem`).
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # the stable hook every op passes through

from hwlab.core import tritonenv  # noqa: F401  (before triton: picks the interpreter without a GPU)
from hwlab.diagnosis.exercise import ExerciseResult, check_kernel, not_done

#: Triton versions whose private compile API and bundled ptxas the kit uses (pyproject.toml)
TRITON_RANGE = ((3, 6), (3, 9))
FIX = ("run `bash scripts/setup.sh` (it installs the kit's pinned versions), or "
       "`pip install 'triton>=3.6,<3.9'` into this kernel's environment, then restart the kernel")

#: torch ops that compute (the eager chain's arithmetic); allocation and copies are not here
COMPUTE_OPS = frozenset({"add", "sub", "mul", "div", "gelu", "tanh", "sigmoid", "silu", "relu", "pow", "erf",
                         "exp", "addcmul", "addcdiv", "lerp", "where", "mm", "matmul", "addmm", "bmm", "linear",
                         "mean", "sum", "softmax", "_softmax", "clamp", "rsqrt", "sqrt", "neg", "reciprocal"})
#: modules whose kernels are not the learner's
NOT_YOURS = ("hwlab", "torch", "triton")

ENV = "environment problem"


def environment_problem(name: str, what: str) -> ExerciseResult:
    return ExerciseResult(name, ENV, f"not your answer: {what}. Fix: {FIX}.")


def _triton_version() -> tuple[int, int] | None:
    try:
        import triton
    except ImportError:
        return None
    return tuple(int(x) for x in triton.__version__.split(".")[:2])


def _ptxas() -> Path:
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def toolchain_problem(static_compile: bool = False) -> str | None:
    """What is wrong with the Triton toolchain, or None. ``static_compile``: also the bundled
    ptxas the sm_90a report runs (exercise 02 on any machine; every kernel on a GPU)."""
    v = _triton_version()
    if v is None:
        return "Triton is not installed in this environment"
    lo, hi = TRITON_RANGE
    if not lo <= v < hi:
        return (f"Triton {v[0]}.{v[1]} is installed; the kit's compile reports need Triton "
                f">= {lo[0]}.{lo[1]}, < {hi[0]}.{hi[1]}")
    if static_compile or torch.cuda.is_available():
        p = _ptxas()
        if not p.exists():
            return f"Triton's bundled ptxas is missing ({p})"
        try:
            r = subprocess.run([str(p), "--version"], capture_output=True, text=True, timeout=60)
        except OSError as e:
            return f"Triton's bundled ptxas does not run ({e})"
        if r.returncode != 0:
            return f"Triton's bundled ptxas fails ({(r.stderr or r.stdout).strip()[-200:]})"
    return None


# ---------------------------------------------------------------- 01: the learner's own kernel
class _Watch(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _kernel_classes():
    from triton.runtime.jit import JITFunction
    out = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        out.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - every supported Triton has it
        pass
    return out


def watch_call(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, list[Any], list[str]]:
    """Call ``fn(*args)``; return its output, the Triton kernels it launched (the decorated
    Python functions) and the torch ops it dispatched."""
    launched: list[Any] = []
    saved = []
    for cls in _kernel_classes():
        orig = cls.run

        def run(self, *a, __orig=orig, **k):
            launched.append(self.fn)
            return __orig(self, *a, **k)
        saved.append((cls, orig))
        cls.run = run
    try:
        with _Watch() as w:
            out = fn(*args)
    finally:
        for cls, orig in saved:
            cls.run = orig
    return out, launched, w.ops


def provenance_problem(launched: list[Any], ops: list[str], yours: Sequence[Any]) -> str | None:
    """Why the call was not the learner's own kernel, or None."""
    your_fns = set()
    for k in yours:  # an autotuned / heuristics wrapper holds the JITFunction, which holds the function
        while hasattr(k, "fn"):
            k = k.fn
        your_fns.add(k)
    foreign = sorted({f"{f.__module__}.{f.__qualname__}" for f in launched
                      if f not in your_fns and f.__module__.split(".")[0] in NOT_YOURS})
    if foreign:
        return (f"your function launched {', '.join(foreign)}, a kernel that is not yours (the kit's or "
                "a library's): the exercise grades a kernel you wrote, so call your own @triton.jit kernel")
    if not any(f in your_fns for f in launched):
        math = sorted(set(ops) & COMPUTE_OPS)
        how = f"torch ran the arithmetic itself ({', '.join('aten::' + o for o in math)})" if math else \
            "no Triton kernel was launched"
        return (f"{how}: your kernel {', '.join(getattr(k, '__name__', str(k)) for k in yours)} never ran; "
                "launch it as kernel[grid](...) from your function")
    math = sorted(set(ops) & COMPUTE_OPS)
    if math:
        return (f"part of the chain ran as torch ops ({', '.join('aten::' + o for o in math)}) beside your "
                "kernel: each extra op is another pass over DRAM; do all the arithmetic in your kernel")
    return None


def check_own_kernel(name: str, learner_fn: Callable[..., Any], learner_kernels: Sequence[Any],
                     reference: Callable[..., Any], make_inputs: Callable[[], Sequence[Any]], **kw) -> ExerciseResult:
    """Exercise 01's checker: first that ``learner_fn`` runs the learner's own Triton kernel
    (and no kit or torch computation), then :func:`hwlab.diagnosis.exercise.check_kernel`."""
    problem = toolchain_problem()
    if problem:
        return environment_problem(name, problem)
    try:
        out, launched, ops = watch_call(learner_fn, make_inputs())
    except NotImplementedError:
        return not_done(name, kw.get("hint", ""))
    except (ImportError, FileNotFoundError) as e:  # a compiler or its tools went missing mid-call
        return environment_problem(name, f"{type(e).__name__}: {e}")
    if out is None:
        return not_done(name, kw.get("hint", ""))
    problem = provenance_problem(launched, ops, learner_kernels)
    if problem:
        return ExerciseResult(name, "wrong", problem)
    return check_kernel(name, learner_fn, reference, make_inputs, **kw)


# ---------------------------------------------------------------- 02: the limiter
LIMITERS = {"registers": "registers", "register": "registers", "regs": "registers",
            "shared memory": "shared_mem", "shared_mem": "shared_mem", "smem": "shared_mem", "shared": "shared_mem",
            "warps": "warps", "warp": "warps", "threads": "warps", "spills": "spills", "spill": "spills"}


def _toolchain_words(text: str) -> bool:
    t = text.lower()
    return any(w in t for w in ("ptxas", "no such file", "importerror", "modulenotfounderror",
                                "attributeerror", "ships no", "gputarget", "astsource"))


#: a reason is a sentence, not a list of every figure in the report: at most this many numbers
REASON_MAX_NUMBERS = 6
_RESOURCE_WORDS = {"registers": ("register",), "shared_mem": ("shared",), "warps": ("warp", "thread")}


def reason_figures(key: str, rep, cfg) -> set[float]:
    """The compile report's figures for resource ``key`` that a reason may quote: registers per
    thread; shared memory in B, KiB or KB; warps per block or threads per block."""
    if key == "registers":
        return {float(rep.n_regs)}
    if key == "shared_mem":
        b = float(rep.shared_bytes)
        return {b, round(b / 1024), round(b / 1024, 1), round(b / 1000), round(b / 1000, 1)}
    if key == "warps":
        return {float(cfg.warps), float(cfg.warps * 32)}
    return set()


def reason_problem(reason: str, key: str, rep, cfg) -> str | None:
    """What MY_REASON lacks, or None: it must name the limiting resource and quote that resource's
    figure from the compile report (:func:`reason_figures`), in a sentence (at most
    :data:`REASON_MAX_NUMBERS` numbers, so a list of every figure does not pass). The message
    says what is missing, never the figure itself."""
    import re

    text = str(reason).lower()
    nums = [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*(?:\.\d+)?", text)]
    if len(nums) > REASON_MAX_NUMBERS:
        return (f"quotes {len(nums)} numbers: write one sentence with the figure that matters "
                f"(at most {REASON_MAX_NUMBERS} numbers)")
    words = _RESOURCE_WORDS.get(key, ())
    if words and not any(w in text for w in words):
        return "does not name the resource that limits the occupancy"
    figs = reason_figures(key, rep, cfg)
    if figs and not any(any(abs(n - f) < 0.05 for f in figs) for n in nums):
        return ("does not quote that resource's figure from the compile report (the static sm_90a compile "
                "of your config: registers per thread, shared memory per block, or warps per block)")
    return None


def check_limiter(cfg, limiter: str | None, reason: str | None, device=None) -> ExerciseResult:
    """Exercise 02's checker: the config compiles for sm_90a without spills, the learner's
    named limiter is one that binds in its occupancy, and (GPU) it reaches the speed band of
    :func:`hwlab.labs.registers.grade_config`."""
    from hwlab.labs import registers
    from hwlab.core.measure import device_of

    name = "spill-free tile and its limiter"
    if cfg is None or not limiter or not reason:
        return not_done(name, "Set MY_CONFIG, MY_LIMITER (registers / shared memory / warps / spills) "
                              "and MY_REASON.")
    key = LIMITERS.get(str(limiter).strip().lower())
    if key is None:
        return ExerciseResult(name, "wrong", f"MY_LIMITER = {limiter!r}: name one of registers, shared "
                              "memory, warps, spills")
    problem = toolchain_problem(static_compile=True)
    if problem:
        return environment_problem(name, problem)
    rep = registers.compile_guarded("matmul", cfg, static=True)
    if rep.skipped:
        if _toolchain_words(rep.skipped):
            return environment_problem(name, f"the sm_90a compile could not run ({rep.skipped})")
        return ExerciseResult(name, "wrong", f"{cfg.label} did not compile for sm_90a: {rep.skipped}")
    facts = (f"{cfg.label}: {rep.n_regs} registers/thread, {rep.n_spills} spill slots, "
             f"{rep.shared_bytes} B shared memory (static sm_90a compile, ptxas -v)")
    if rep.n_spills:
        return ExerciseResult(name, "wrong", f"{facts}: it still spills; the accumulator alone is "
                              f"{cfg.acc_regs_per_thread:.0f} registers/thread.")
    try:
        occ = rep.occupancy(cfg.warps)
    except ValueError as e:
        return ExerciseResult(name, "wrong", f"{facts}: {e}")
    binds = ", ".join(occ.binding)
    table = ", ".join(f"{k} {v}" for k, v in occ.blocks_by_limit.items())
    bad_reason = reason_problem(reason, key, rep, cfg)
    if key in occ.binding and bad_reason:
        return ExerciseResult(name, "wrong", f"MY_LIMITER matches; MY_REASON {bad_reason}")
    if key == "spills":
        return ExerciseResult(name, "wrong", f"{facts}: nothing spills, so spills do not limit it; blocks per "
                              f"SM by limit: {table}: {binds} bind{'s' if len(occ.binding) == 1 else ''}.")
    if key not in occ.binding:
        return ExerciseResult(name, "wrong", f"you named {key}; {facts}. Blocks per SM by limit: {table}, "
                              f"so {binds} bind{'s' if len(occ.binding) == 1 else ''}, not {key}.")
    if device_of(device).type != "cuda":
        return ExerciseResult(name, "passed (correctness only)",
                              f"{facts}; {occ.blocks_per_sm} block(s)/SM bound by {binds}: your limiter "
                              f"({key}) matches. Speed is graded on a GPU.")
    speed = registers.grade_config(cfg, reason, device=device)
    if speed.status.startswith("wrong") and _toolchain_words(speed.message):
        return environment_problem(name, speed.message)
    speed.name = name
    speed.message = f"limiter {key} matches the compile report ({binds} bind). " + speed.message
    return speed


# ---------------------------------------------------------------- 04: the FP8 path
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
               "first (bf16); its logits decide every token, and an FP8 head is where the error shows")


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
    rows, label = kv_buckets()
    bad, lines = [], []
    for r in rows:
        chosen = kv_fp8_from_ctx is not None and r["ctx"] >= kv_fp8_from_ctx
        pays = r["kv_share_pct"] >= KV_SHARE_PAYS_PCT
        lines.append(f"ctx {r['ctx']} x{r['batch']}: KV {r['kv_share_pct']:.0f}% of the step's bytes -> "
                     f"{'FP8 pays' if pays else 'FP8 does not pay'}; you chose {'FP8' if chosen else 'bf16'}")
        if chosen != pays:
            bad.append(r["ctx"])
    head = (f"KV cache per bucket (bytes {label}; FP8 KV pays at >= {KV_SHARE_PAYS_PCT:.0f}% of the step's bytes): "
            + "; ".join(lines))
    return not bad, head


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
