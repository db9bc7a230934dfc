"""Whether an answer runs the learner's own Triton kernel (exercise 01): the checker watches the call,
every Triton kernel launched (``JITFunction.run`` / the interpreter's ``InterpretedFunction.run``) and
every torch compute op dispatched (``TorchDispatchMode``). It refuses an answer that launches a kernel
defined in hwlab, torch or triton (listed as the learner's or not: Lab 1's own kernel, re-wrapped or
assigned to the learner's name, is still the kit's), that launches none of the learner's kernels, or
whose arithmetic ran as torch ops."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from torch.utils._python_dispatch import TorchDispatchMode  # the stable hook every op passes through

from hwlab.core import tritonenv  # noqa: F401  (before triton: picks the interpreter without a GPU)
from hwlab.course.exercise import ExerciseResult, check_kernel, not_done
from hwlab.course import toolchain_check as T
from hwlab.course.tries import Reference, graded

#: torch ops that compute (the eager chain's arithmetic); allocation and copies are not here
COMPUTE_OPS = frozenset({"add", "sub", "mul", "div", "gelu", "tanh", "sigmoid", "silu", "relu", "pow", "erf",
                         "exp", "addcmul", "addcdiv", "lerp", "where", "mm", "matmul", "addmm", "bmm", "linear",
                         "mean", "sum", "softmax", "_softmax", "clamp", "rsqrt", "sqrt", "neg", "reciprocal"})
#: modules whose kernels are not the learner's
NOT_YOURS = ("hwlab", "torch", "triton")


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
    # a kernel defined in the kit or a library is not the learner's, even listed as theirs (Lab 1's
    # kernel assigned to the learner's name, or its function re-wrapped in triton.jit)
    foreign = sorted({f"{f.__module__}.{f.__qualname__}" for f in launched
                      if str(getattr(f, "__module__", "")).split(".")[0] in NOT_YOURS})
    your_fns = {f for f in your_fns if str(getattr(f, "__module__", "")).split(".")[0] not in NOT_YOURS}
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


def own_kernel_reference(name: str, *args, **kw) -> Reference:
    """What passes :func:`check_own_kernel`: described (its answer is code)."""
    return Reference(how="a passing answer launches a @triton.jit kernel defined in your notebook (not the kit's, "
                         "torch's or triton's) from your function, with no torch op computing beside it, and its "
                         "output matches the float64 reference on fresh random inputs")


@graded(own_kernel_reference)
def check_own_kernel(name: str, learner_fn: Callable[..., Any], learner_kernels: Sequence[Any],
                     reference: Callable[..., Any], make_inputs: Callable[[], Sequence[Any]], **kw) -> ExerciseResult:
    """Exercise 01's checker: first that ``learner_fn`` runs the learner's own Triton kernel
    (and no kit or torch computation), then :func:`hwlab.course.exercise.check_kernel`."""
    problem = T.toolchain_problem()
    if problem:
        return T.environment_problem(name, problem)
    try:
        out, launched, ops = watch_call(learner_fn, make_inputs())
    except NotImplementedError:
        return not_done(name, kw.get("hint", ""))
    except (ImportError, FileNotFoundError) as e:  # a compiler or its tools went missing mid-call
        return T.environment_problem(name, f"{type(e).__name__}: {e}")
    if out is None:
        return not_done(name, kw.get("hint", ""))
    problem = provenance_problem(launched, ops, learner_kernels)
    if problem:
        return ExerciseResult(name, "wrong", problem)
    return check_kernel(name, learner_fn, reference, make_inputs, **kw)
