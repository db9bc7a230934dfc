"""hwlab: hardware-aware GPU performance troubleshooting.

The package's folders are its floors; nothing imports a floor above its own:
  core/       measurement protocol, machine facts, topology, evidence, profiling, comms probes
  labs/       one package per failure mode: reproduce it, measure it, fix it
  diagnosis/  flowchart, baselines, drills, incident, ranks: consume evidence, give verdicts
  examine/    hwlab.examine(fn, *args): measure your own function and walk the flowchart on it
  cli/        the ``hwlab`` command
At the top: ``errors`` (exit codes, user-input errors) and ``nb`` (notebook helpers).
"""
__version__ = "0.1.0"

import sys as _sys

from hwlab.core import grading  # noqa: E402


def _record_exercise(result, *args, **kwargs):
    """:func:`hwlab.course.classroom.record_exercise`, loaded at the first graded result (the
    class folder reads the flowchart; commands that grade nothing need not load it)."""
    from hwlab.course import classroom

    return classroom.record_exercise(result, *args, **kwargs)


# every graded result, whichever floor's grader built it, goes to the class folder when one is
# set (HWLAB_CLASS_DIR); registered here at the top because the core's result type cannot
# import classroom (it reads the flowchart, a floor above)
grading.on_graded(_record_exercise)


class _TritonFirst:
    """Without a GPU, Triton kernels need its interpreter switched on before ``triton`` loads
    (:mod:`hwlab.core.tritonenv`). That module imports torch (~1 s, ~300 MB), which the commands
    that measure nothing must not pay for, so it is not imported here: this finder runs it the
    moment anything (a lab, a notebook cell, torch.compile) first looks for ``triton``, then
    steps aside and lets the normal import go on."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "triton" and cls in _sys.meta_path:
            _sys.meta_path.remove(cls)  # once: tritonenv's own imports must not come back here
            try:
                from hwlab.core import tritonenv  # noqa: F401
            except ModuleNotFoundError as e:  # no torch here: nothing to decide the interpreter by
                if e.name != "torch":
                    raise
        return None


def _triton_first() -> None:
    if "triton" in _sys.modules or "torch" in _sys.modules:
        from hwlab.core import tritonenv  # noqa: F401  (torch is loaded already: costs nothing)
    else:
        _sys.meta_path.insert(0, _TritonFirst)


_triton_first()


def __getattr__(name: str):
    """``hwlab.examine(fn, *args)``: the examine module (callable, see examine/__init__.py) loads on first
    use, deferred on purpose: it pulls in torch's profiler and FLOP counter (~0.6 s, Triton too),
    which commands that never examine need not pay for."""
    if name == "examine":
        import importlib

        return importlib.import_module(".examine", __name__)
    raise AttributeError(f"module 'hwlab' has no attribute {name!r}")
