"""Exercise checkers that grade what each exercise is about, and tell a broken toolchain apart
from a wrong answer. Each exercise works on an instance of its lab's failure that no notebook
shows, and each checker recomputes its answer from that instance's own evidence; a wrong answer
is told the evidence that contradicts it, never the right answer.

* **01 (the transposed chain, :mod:`hwlab.labs.bandwidth.transposed`)**: the learner predicts the
  bytes the eager version moves over the floor (:func:`check_bytes_prediction`, against the access
  meter's count, :mod:`hwlab.core.access_meter`), then writes the kernel
  (:func:`check_transposed_kernel`): it must run *the learner's* Triton kernel. The checker watches
  the call: every Triton kernel launched (``JITFunction.run`` / the interpreter's
  ``InterpretedFunction.run``) and every torch compute op dispatched (``TorchDispatchMode``). It
  refuses an answer that launches a kernel defined in hwlab, torch or triton, that launches none
  of the learner's kernels, or whose arithmetic ran as torch ops. Allocation and copies (``empty``,
  ``empty_like``, ``copy_``, ``clone``) are allowed, and then counted: in the interpreter the bytes
  the call moves must be within :data:`TRANSPOSED_MAX_BYTES_X` of the floor and its warp requests
  must use :data:`TRANSPOSED_MIN_SECTOR_USE` of the sectors they touch; on a GPU, the speed band.
* **02 (the row softmax's occupancy)**: blocks per SM and the binding limit of Lab 2's row softmax
  at a short row (:func:`check_occupancy_prediction`), and the warps count that fills the SM at a
  long one (:func:`check_warps_choice`), both from the static sm_90a ``ptxas -v`` report and
  :mod:`hwlab.labs.registers.occupancy`.
* **03 (a job's rank map)**: on a recorded capture, the rank groups whose GPUs are not linked by
  NVLink, the matrix cells that show it and the leaf (:func:`check_crossing`), and better groups
  over the job's own GPUs (:func:`check_job_mapping`).
* **04 (another layer falls back, :mod:`hwlab.labs.fp8.bucket_case`)**: the bucket, layer kind,
  dequant count and GEMM shape, from a live profile of each bucket (:func:`check_case_fallback`),
  and a bucket mix with no fallback (:func:`check_case_batches`), re-profiled.

The first versions' checkers stay (:func:`check_own_kernel`, :func:`check_limiter`,
:func:`check_fp8_path`, :func:`check_fallback_bucket`): the head-precision and per-bucket FP8 KV
rules of :func:`check_fp8_path` are graded on Lab 4's recorded H200 bytes.

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
from hwlab.course.exercise import ExerciseResult, check_kernel, not_done

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
    (and no kit or torch computation), then :func:`hwlab.course.exercise.check_kernel`."""
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


# ---------------------------------------------------------------- 01: the transposed chain
#: the fused kernel's bytes moved may exceed the floor by this factor (edge sectors of a tile,
#: the bias read per tile); the eager chain moves several times the floor
TRANSPOSED_MAX_BYTES_X = 1.1
#: the share of every fetched sector's bytes the kernel must use: a tile whose rows span at least
#: one sector uses all of them; lanes striding down a column use 2 bytes of 32 (fp16)
TRANSPOSED_MIN_SECTOR_USE = 0.8
#: a predicted bytes ratio passes within this relative distance of the measured one: counting
#: passes gives the ratio to a few %, the bias vector being the only part that does not scale
PREDICTION_REL_TOL = 0.1
#: GPU pass band of the transposed chain, % of the measured copy bandwidth: below Lab 1's chain's
#: 70% because a transpose goes through shared memory; a band set from the kit's reasoning, not yet
#: from an H200 run of a learner's kernel
TRANSPOSED_MIN_PCT = 60.0


def _traffic_lines(tr) -> str:
    parts = []
    for row in tr.per_launch():
        if "kernel" in row:
            lu, su = row["load_sector_use"], row["store_sector_use"]
            parts.append(f"kernel {row['kernel']}: {row['dram_bytes']:,} B, loads use "
                         f"{'-' if lu is None else f'{100 * lu:.0f}%'} and stores "
                         f"{'-' if su is None else f'{100 * su:.0f}%'} of their sectors' bytes")
        else:
            parts.append(f"torch op aten::{row['torch_op']}: {row['dram_bytes']:,} B")
    return "; ".join(parts)


def check_bytes_prediction(ratio, n_rows: int, n_cols: int, dtype=torch.float16) -> ExerciseResult:
    """Exercise 01, part 1: the learner's predicted ratio of the bytes the eager transposed chain
    moves to the floor, against the ratio the access meter counts (:mod:`hwlab.core.access_meter`)
    on this machine, within :data:`PREDICTION_REL_TOL`. The message on a miss names the passes the
    meter saw, never the ratio."""
    from hwlab.core import access_meter
    from hwlab.labs.bandwidth import transposed

    name = "bytes the eager chain moves"
    if ratio is None:
        return not_done(name, "Set MY_BYTES_RATIO to your predicted (bytes moved) / (bytes required).")
    try:
        ratio = float(ratio)
    except (TypeError, ValueError):
        return ExerciseResult(name, "wrong", f"MY_BYTES_RATIO = {ratio!r}: give one number, e.g. 1.5")
    args = transposed.make_inputs(n_rows, n_cols, dtype)
    _, tr = access_meter.meter(transposed.eager, args)
    floor = transposed.traffic(n_rows, n_cols, args[0].element_size())["bytes_required"]
    measured = tr.dram_bytes / floor
    if abs(ratio - measured) <= PREDICTION_REL_TOL * measured:
        return ExerciseResult(name, "passed", f"you predicted {ratio:.2f}x; the eager chain moved {tr.dram_bytes:,} B "
                              f"over a floor of {floor:,} B = {measured:.2f}x ({_traffic_lines(tr)}; counted "
                              "on this machine's CPU by the access meter, an estimate from the tensors each op "
                              "reads and writes).", answer=ratio, expected=round(measured, 3))
    ops = ", ".join("aten::" + o.name for o in tr.torch_ops)
    return ExerciseResult(name, "wrong", f"you predicted {ratio:.2f}x, more than {100 * PREDICTION_REL_TOL:.0f}% "
                          f"off what the meter counted. The eager chain ran {len(tr.torch_ops)} ops ({ops}): "
                          "count, for each, the tensors it reads and the tensor it writes, in elements "
                          "(bias is cols, the rest rows x cols), and divide by what the work must read and write.",
                          answer=ratio)


def check_transposed_kernel(learner_fn, learner_kernels, n_rows: int, n_cols: int, dtype=torch.float16, *,
                            ceiling_gbps: float | None = None, min_pct: float = TRANSPOSED_MIN_PCT,
                            device=None) -> ExerciseResult:
    """Exercise 01, part 2: the learner's own Triton kernel for ``gelu_tanh(x + bias).T``
    (:mod:`hwlab.labs.bandwidth.transposed`): their kernel runs and nothing else computes
    (:func:`check_own_kernel`), the output matches float64 on fresh data, then (interpreter)
    the bytes it moves are within :data:`TRANSPOSED_MAX_BYTES_X` of the floor and its warp
    requests use at least :data:`TRANSPOSED_MIN_SECTOR_USE` of the sectors they touch; on a GPU
    the speed band against this machine's copy bandwidth instead."""
    from hwlab.core import access_meter, tritonenv
    from hwlab.core.measure import TOL_BY_DTYPE
    from hwlab.labs.bandwidth import transposed

    name = "transposed chain"
    itemsize = torch.tensor([], dtype=dtype).element_size()
    floor = transposed.traffic(n_rows, n_cols, itemsize)["bytes_required"]
    res = check_own_kernel(name, learner_fn, learner_kernels, transposed.reference,
                           lambda: transposed.make_inputs(n_rows, n_cols, dtype, device),
                           tol=TOL_BY_DTYPE[str(dtype).replace("torch.", "")], n_bytes=floor,
                           ceiling_gbps=ceiling_gbps, min_pct=min_pct, device=device,
                           hint="y is (cols, rows); compute in fp32 and cast on store.")
    if not res.passed or not tritonenv.INTERPRETED:
        return res
    _, tr = access_meter.meter(learner_fn, transposed.make_inputs(n_rows, n_cols, dtype))
    moved_x, use = tr.dram_bytes / floor, tr.sector_use
    facts = (f"bytes moved {tr.dram_bytes:,} over a floor of {floor:,} = {moved_x:.2f}x; {_traffic_lines(tr)} "
             "[counted in the Triton interpreter on this machine's CPU: an estimate from the addresses]")
    if moved_x > TRANSPOSED_MAX_BYTES_X:
        return ExerciseResult(name, "wrong", f"correct, but it moves too many bytes: {facts}. The band is "
                              f"<= {TRANSPOSED_MAX_BYTES_X:.2f}x: each pass beyond one writes an intermediate "
                              "and reads it back.")
    if use is None or use < TRANSPOSED_MIN_SECTOR_USE:
        return ExerciseResult(name, "wrong", f"correct and one pass, but its warp requests use "
                              f"{0 if use is None else 100 * use:.0f}% of the bytes of the sectors they touch "
                              f"(band >= {100 * TRANSPOSED_MIN_SECTOR_USE:.0f}%): {facts}. A side under the band "
                              "has lanes whose neighbours sit a whole row apart in memory.")
    return ExerciseResult(name, "passed (correctness and traffic)",
                          f"correct on fresh random inputs; {facts}. Speed is graded on a GPU (the "
                          "interpreter is not a performance model).")


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


# ---------------------------------------------------------------- 02: the row softmax's occupancy
#: exercise 02's names for the four limits of :func:`hwlab.labs.registers.occupancy.occupancy`
SOFTMAX_LIMITS = {"registers": "registers", "register": "registers", "regs": "registers",
                  "shared memory": "shared_mem", "shared_mem": "shared_mem", "smem": "shared_mem",
                  "shared": "shared_mem", "warps": "warps", "warp": "warps", "threads": "warps",
                  "block slots": "blocks", "blocks": "blocks", "block slot": "blocks", "max blocks": "blocks",
                  "resident blocks": "blocks", "block limit": "blocks"}
_LIMIT_WORDS = {"registers": "registers", "shared_mem": "shared memory", "warps": "warps",
                "blocks": "block slots"}
#: the warps counts exercise 02's second part may pick from (one program per row of the block)
SOFTMAX_WARPS = (1, 2, 4, 8, 16)


def softmax_report(block: int, warps: int):
    """The static sm_90a compile report of Lab 2's row softmax (``wide_block_kernel``) at
    ``block`` elements per program on ``warps`` warps (a time-limited child, cached per process)."""
    from hwlab.labs import registers

    return registers.compile_guarded("wide_block", block=block, warps=warps)


def _report_problem(name: str, rep) -> ExerciseResult | None:
    if rep.skipped:
        if _toolchain_words(rep.skipped):
            return environment_problem(name, f"the sm_90a compile could not run ({rep.skipped})")
        return ExerciseResult(name, "wrong", f"{rep.config} did not compile for sm_90a: {rep.skipped}")
    return None


def check_occupancy_prediction(block: int, warps: int, blocks_per_sm, limiter) -> ExerciseResult:
    """Exercise 02, part 1: the learner's blocks per SM and binding limit for the row softmax at
    (``block``, ``warps``), against the occupancy calculator on the static compile report. A wrong
    count is told which limits the learner's number contradicts (a limit that allows fewer, or
    none that allows exactly it); a wrong limiter is told how many that limit alone allows. Neither
    message names the right count or the limit that binds."""
    name = "blocks per SM and the limit that binds"
    if blocks_per_sm is None or not limiter:
        return not_done(name, "Set MY_BLOCKS_PER_SM (a whole number) and MY_LIMITER (registers, shared "
                              "memory, warps or block slots).")
    key = SOFTMAX_LIMITS.get(str(limiter).strip().lower())
    if key is None:
        return ExerciseResult(name, "wrong", f"MY_LIMITER = {limiter!r}: name one of registers, shared memory, "
                              "warps, block slots")
    try:
        n = int(blocks_per_sm)
    except (TypeError, ValueError):
        return ExerciseResult(name, "wrong", f"MY_BLOCKS_PER_SM = {blocks_per_sm!r}: give a whole number")
    problem = toolchain_problem(static_compile=True)
    if problem:
        return environment_problem(name, problem)
    rep = softmax_report(block, warps)
    bad = _report_problem(name, rep)
    if bad:
        return bad
    occ = rep.occupancy(warps)
    facts = (f"BLOCK={block} on {warps} warp(s): {rep.n_regs} registers/thread, {rep.shared_bytes} B shared "
             "memory per block (static sm_90a compile, ptxas -v)")
    by = occ.blocks_by_limit
    if n != occ.blocks_per_sm:
        lower = [k for k, v in by.items() if v < n]
        why = (f"{len(lower)} of the four limits allow{'s' if len(lower) == 1 else ''} fewer than {n}" if lower
               else f"no limit stops at {n}: each allows more")
        return ExerciseResult(name, "wrong", f"{n} per SM does not follow from {facts}: {why}. Work out all four "
                              "limits (the rules in the markdown above) and take the smallest.", answer=n)
    if key not in occ.binding:
        return ExerciseResult(name, "wrong", f"your count is right, but {_LIMIT_WORDS[key]} alone would allow "
                              f"{by[key]} per SM, more than your count: it is not the limit that binds ({facts}).",
                              answer=limiter)
    return ExerciseResult(name, "passed", f"{facts}: {occ.blocks_per_sm} per SM, bound by "
                          f"{' and '.join(_LIMIT_WORDS[k] for k in occ.binding)} ({occ.occupancy_pct:.0f}% "
                          "occupancy)" + ("; a block this small runs out of slots before the register file fills."
                                          if "blocks" in occ.binding else "."))


def check_warps_choice(block: int, warps) -> ExerciseResult:
    """Exercise 02, part 2: the learner's warps count for the row softmax at ``block`` elements
    per row must compile without spills and reach the highest theoretical occupancy of
    :data:`SOFTMAX_WARPS` (each compiled for sm_90a and put through the occupancy calculator)."""
    from concurrent.futures import ThreadPoolExecutor

    name = "warps for the long row"
    if warps is None:
        return not_done(name, f"Set MY_WARPS to one of {SOFTMAX_WARPS}.")
    if isinstance(warps, bool) or not isinstance(warps, int) or warps not in SOFTMAX_WARPS:
        return ExerciseResult(name, "wrong", f"MY_WARPS = {warps!r}: this kernel's knob is the warps count per "
                              f"program, one of {SOFTMAX_WARPS} (the block stays the row, {block} elements)")
    problem = toolchain_problem(static_compile=True)
    if problem:
        return environment_problem(name, problem)
    with ThreadPoolExecutor(max_workers=2) as pool:
        reps = dict(zip(SOFTMAX_WARPS, pool.map(lambda w: softmax_report(block, w), SOFTMAX_WARPS)))
    for rep in reps.values():
        bad = _report_problem(name, rep)
        if bad:
            return bad
    occ = {w: r.occupancy(w) for w, r in reps.items() if not r.n_spills}
    mine = reps[warps]
    facts = (f"{warps} warp(s): {mine.n_regs} registers/thread, {mine.n_spills} spill slots (static sm_90a "
             "compile, ptxas -v)")
    if mine.n_spills:
        return ExerciseResult(name, "wrong", f"{facts}: it spills, so part of every row lives in local memory.")
    best = max(o.occupancy_pct for o in occ.values())
    o = occ[warps]
    msg = (f"{facts}: {o.blocks_per_sm} per SM bound by {' and '.join(_LIMIT_WORDS[k] for k in o.binding)}, "
           f"{o.active_warps} active warps = {o.occupancy_pct:.0f}% occupancy")
    if o.occupancy_pct < best:
        return ExerciseResult(name, "wrong", f"{msg}; another warps count reaches a higher occupancy. Each thread "
                              f"holds {block // (32 * warps)} elements of the row here: what does that do to "
                              "its registers, and the registers to the blocks that fit?", answer=warps)
    return ExerciseResult(name, "passed", msg + ", the highest of the warps counts tried.", answer=warps)


# ---------------------------------------------------------------- 03: a job's rank map
#: the leaf a TP group that crosses a link other than NVLink answers (rank mapping)
CROSSING_LEAF = "L"


def check_crossing(topo, order: list[int], tp: int, crossing, evidence, leaf) -> ExerciseResult:
    """Exercise 03, part 1: which rank groups of the job cross a link that is not NVLink, the
    matrix cells that show it (``{(gpu_a, gpu_b): "CELL"}``, at least one pair of each crossing
    group, each as the matrix prints it), and the flowchart leaf. Everything is recomputed from
    the capture; a wrong answer is told which evidence contradicts it, never the right groups."""
    from hwlab.core.topology import is_nvlink
    from hwlab.diagnosis import flowchart
    from hwlab.labs.crosslink.grader import crossing_groups

    name = "groups on the slow link"
    if crossing is None or evidence is None or leaf is None:
        return not_done(name, "Set CROSSING (rank groups), EVIDENCE ({(gpu, gpu): 'cell'}) and LEAF.")
    want = crossing_groups(topo, order, tp)
    try:
        mine = [sorted(int(r) for r in g) for g in crossing]
    except TypeError:
        return ExerciseResult(name, "wrong", "CROSSING is a list of rank groups, e.g. [[0, 1]]")
    groups = {tuple(range(i, min(i + tp, len(order)))) for i in range(0, len(order), tp)}
    for g in mine:
        if tuple(g) not in groups:
            return ExerciseResult(name, "wrong", f"ranks {g} are not one of the job's TP groups (consecutive ranks, "
                                  f"{tp} per group)")
    for g in mine:
        if g not in want:
            devs = [order[r] for r in g]
            cells = ", ".join(f"GPU{a}-GPU{b} {topo.link(a, b)}" for j, a in enumerate(devs) for b in devs[j + 1:])
            return ExerciseResult(name, "wrong", f"ranks {g} run on GPUs {devs}: the matrix links them by {cells}, "
                                  "all NVLink. Map each rank to its GPU first (rank r runs on the r-th ordinal of "
                                  "the device list).")
    if len(mine) < len(want):
        return ExerciseResult(name, "wrong", f"you named {len(mine)} group(s); another group's GPUs are linked by a "
                              "path that is not NVLink. Read the matrix cell of every pair in every group.")
    if not isinstance(evidence, dict) or not evidence:
        return ExerciseResult(name, "wrong", "EVIDENCE is a dict {(gpu_a, gpu_b): 'CELL'} of matrix cells")
    covered = set()
    for pair, cell in evidence.items():
        try:
            a, b = (int(x) for x in pair)
        except (TypeError, ValueError):
            return ExerciseResult(name, "wrong", f"EVIDENCE key {pair!r}: give a pair of GPU ordinals, e.g. (0, 1)")
        if not (0 <= a < topo.n_gpus and 0 <= b < topo.n_gpus) or a == b:
            return ExerciseResult(name, "wrong", f"EVIDENCE key {pair!r}: not a pair of this machine's GPUs")
        real = topo.link(a, b)
        if str(cell).strip().upper() != real.upper():
            return ExerciseResult(name, "wrong", f"the matrix does not print {cell!r} for GPU{a}-GPU{b}: read its "
                                  f"row GPU{a}, column GPU{b} again")
        if is_nvlink(real):
            return ExerciseResult(name, "wrong", f"GPU{a}-GPU{b} is {real}, NVLink: it is not what makes a group slow")
        covered |= {tuple(g) for g in want if {a, b} <= {order[r] for r in g}}
    if len(covered) < len(want):
        return ExerciseResult(name, "wrong", "cite at least one pair of each group you named, as GPU ordinals "
                              "(a pair inside the group's devices)")
    leaf_id = str(leaf).strip().upper()
    if leaf_id not in flowchart.LEAVES:
        return ExerciseResult(name, "wrong", f"LEAF = {leaf!r}: give a leaf id of the chart ({', '.join(flowchart.LEAVES)})")
    if leaf_id != CROSSING_LEAF:
        t = flowchart.LEAVES[leaf_id]
        return ExerciseResult(name, "wrong", f"groups and evidence are right; leaf {leaf_id} ({t.title}) fixes what "
                              "one GPU does on its own, and nothing you cited is on one GPU: it is the link between "
                              "the GPUs of one TP group, which its all-reduce crosses every step.")
    cells = "; ".join(f"GPU{int(a)}-GPU{int(b)} {c}" for (a, b), c in evidence.items())
    return ExerciseResult(name, "passed", f"ranks {want} cross a link that is not NVLink ({cells}): leaf "
                          f"{leaf_id}, {flowchart.LEAVES[leaf_id].title}.")


def check_job_mapping(topo, devices: list[int], groups, tp: int) -> ExerciseResult:
    """Exercise 03, part 2: TP groups over the job's own GPUs (``devices``) whose slowest link is
    the best any partition of those GPUs reaches (Lab 3's :func:`~hwlab.labs.crosslink.grade_mapping`
    on the part of the capture the job sees)."""
    from hwlab.labs.crosslink.grader import grade_mapping, job_topology

    if groups is not None:
        try:
            groups = [[int(str(g).upper().removeprefix("GPU")) for g in grp] for grp in groups]
        except (TypeError, ValueError):
            return ExerciseResult("mapping", "wrong", "MY_GROUPS is a list of groups of GPU ordinals")
        extra = sorted({g for grp in groups for g in grp} - set(devices))
        if extra:
            return ExerciseResult("mapping", "wrong", f"GPU(s) {extra} are not this job's: it was given {devices}")
    return grade_mapping(job_topology(topo, devices), groups, tp)


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


# ---------------------------------------------------------------- 04 (the bucket case): another layer falls back
def case_buckets(batches: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Each bucket of Lab 4's second instance (:mod:`hwlab.labs.fp8.bucket_case`), profiled live
    on this machine's CPU: its profiler rows and the step's own counts (which layers dequantized)."""
    from hwlab.labs.fp8 import bucket_case as case

    m = case.case_model("cpu")
    out = []
    for ctx, batch in case.CASE_BUCKETS:
        b = (batches or {}).get(ctx, batch)
        rows, hits = case.bucket_profile_table(m, b, ctx)
        out.append({"ctx": ctx, "batch": b, "table": rows, "hits": hits,
                    "fell_back": sorted({n.split(".")[-1] for n in hits["fallback_modules"]})})
    return out


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
        return ExerciseResult(name, "wrong", f"a {mod} GEMM reads a ({o}, {i}) weight; in ctx {ctx}'s profile the "
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
    others = [x for x in buckets if x is not b]
    ok_rows = sorted({x["batch"] for x in others if mod not in x["fell_back"]})
    return ExerciseResult(name, "passed", f"ctx {ctx} x{b['batch']}: {n_deq} {mod} weights dequantized per step, "
                          f"each read by a bf16 GEMM of {want[0]} rows x {want[1]} -> {want[2]}; at {ok_rows} rows "
                          f"the same layer runs its FP8 kernel: its library has no kernel for {want[0]} rows "
                          "[profiled live on this machine's CPU].")


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
    if bad:
        return ExerciseResult(name, "wrong", "; ".join(f"ctx {b['ctx']} x{b['batch']}: its profiled step still has "
                                                        f"{b['hits']['dequant_ranges']} {case.DEQUANT_MARK} range(s)"
                                                        for b in bad))
    m = case.case_model("cpu")
    for c in want_ctx:
        for smaller in range(orig[c], batches[c]):
            _, hits = case.bucket_profile_table(m, smaller, c)
            if not hits["fallback_modules"]:
                return ExerciseResult(name, "wrong", f"ctx {c} x{batches[c]}: no fallback, but every step carries "
                                      f"{batches[c] - orig[c]} padding row(s) more than needed: a smaller batch that "
                                      "still keeps the bucket's capacity also profiles with no fallback.")
    hits = ", ".join(f"ctx {b['ctx']} x{b['batch']}: FP8 on {b['hits']['fp8_hits']} of {b['hits']['gemm_calls']} GEMMs"
                     for b in buckets)
    return ExerciseResult(name, "passed", f"no fallback in any bucket ({hits}; the rest bf16 by choice: head and edge "
                          "blocks) [profiled live on this machine's CPU].")
