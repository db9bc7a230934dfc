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

from hwlab.core import tritonenv  # noqa: E402,F401  (without a GPU: Triton's interpreter, before any kernel)
from hwlab.core import grading  # noqa: E402
from hwlab.diagnosis import classroom  # noqa: E402

# every graded result, whichever floor's grader built it, goes to the class folder when one is
# set (HWLAB_CLASS_DIR); registered here at the top because the core's result type cannot
# import classroom (it reads the flowchart, a floor above)
grading.on_graded(classroom.record_exercise)


def __getattr__(name: str):
    """``hwlab.examine(fn, *args)``: the examine module (callable, see examine/__init__.py) loads on first
    use, deferred on purpose: it pulls in torch's profiler and FLOP counter (~0.6 s, Triton too),
    which commands that never examine need not pay for."""
    if name == "examine":
        import importlib

        return importlib.import_module(".examine", __name__)
    raise AttributeError(f"module 'hwlab' has no attribute {name!r}")
