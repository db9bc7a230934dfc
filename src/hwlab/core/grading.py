"""The result of grading a learner's answer: a plain type every floor's graders build.

Lab graders (Lab 2's tile, Lab 3's straggler and mapping, Lab 4's FP8 path) and the
checkers in :mod:`hwlab.course.exercise` all return an :class:`ExerciseResult`. It lives in the core
so that a lab can build one without importing the floor that consumes it.

Keeping the instructor's copy: every result built is handed to each function registered with
:func:`on_graded` (the class recorder skips "not done yet", which is not an attempt). The core cannot
import :mod:`hwlab.course.classroom` (it reads the flowchart, a floor above), so the package's
top (``hwlab/__init__.py``) registers the class-folder recorder once, for results from any
floor. A recorder that fails with ``OSError``/``ValueError`` (an unwritable class folder, a
malformed ``HWLAB_CLASS_DIR``) prints one line and the learner's grade stands.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # annotation only: the result carries a Measurement, it does not build one
    from hwlab.core.measure import Measurement

_RECORDERS: list[Callable[["ExerciseResult"], Any]] = []


def on_graded(recorder: Callable[["ExerciseResult"], Any]) -> None:
    """Call ``recorder(result)`` on every result built from now on (registered once)."""
    if recorder not in _RECORDERS:
        _RECORDERS.append(recorder)


@dataclass
class ExerciseResult:
    name: str
    #: "not done yet" | "wrong" | "too slow" | "passed" | "passed (correctness only)" |
    #: "environment problem" (the toolchain, not the answer: see hwlab.course.exercise_checks)
    status: str
    message: str
    measurement: Measurement | None = None
    answer: Any = None    # a short answer's value (check_value), kept in the class result
    expected: Any = None

    def __post_init__(self) -> None:
        for record in _RECORDERS:
            try:
                record(self)
            except (OSError, ValueError) as e:  # the learner's grade stands; the instructor's copy is what failed
                print(f"hwlab: could not record this result in the class folder ({e})")

    @property
    def passed(self) -> bool:
        return self.status.startswith("passed")

    def __str__(self) -> str:
        mark = {"not done yet": "[ ]", "wrong": "[x]", "too slow": "[~]",
                "environment problem": "[!]"}.get(self.status, "[v]")
        return f"{mark} {self.name}: {self.status}. {self.message}"

    def _repr_markdown_(self) -> str:
        return f"**{self.name}: {self.status}.** {self.message}"


def not_done(name: str, hint: str = "") -> ExerciseResult:
    return ExerciseResult(name, "not done yet",
                          "Fill in the cell marked `# YOUR CODE HERE` and run it again. " + hint)
