"""Drills through the class's grading service (:mod:`hwlab.cli.gradeservice`), where one is configured.

Where ``HWLAB_GRADER_URL`` is set (the hub sets it in every learner's server, as for checkpoints:
:mod:`hwlab.course.gradeclient`), ``hwlab drill`` and notebook 07 draw, submit and reveal drills
through the service instead of sealing them with the learner's own key:

* :func:`draw`: the service draws the fault and seals the drill with *its* drill key, which the
  learner's account cannot read; the learner gets the drill (observations, workload, the sealed
  fault) and cannot open the seal, nor re-seal an edited copy;
* :func:`submit`: the service verifies the seal, grades the leaf and records the result in the
  gradebook (a drill whose answer was revealed to this learner is recorded as submitted after the
  reveal, never as passed);
* :func:`reveal`: the service records the reveal first, then sends the fault and its leaf.

A drill drawn by the service is not verified here (the learner has no key to verify it with): the
service verifies it on every submission and reveal, so an edited copy is refused there. A service
that cannot be reached is one line to the learner; nothing is graded or recorded locally instead.
"""
from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from hwlab.course import gradeclient
from hwlab.errors import UserInputError


def served() -> bool:
    """Whether drills go through the class's grading service (``HWLAB_GRADER_URL`` is set)."""
    return gradeclient.url() is not None


def _call(route: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return gradeclient.call(route, body)
    except gradeclient.GraderUnavailable as e:
        raise UserInputError(f"{e}; ask the instructor (drills are graded by the class's service only)") from None


def unverified(d: Any, what: str = "drill"):
    """A :class:`hwlab.course.drills.Drill` from the service's JSON, its seal left to the service."""
    from hwlab.course import drills

    names = {f.name for f in fields(drills.Drill)}
    if not isinstance(d, dict) or not {"drill_id", "seed", "salt", "sealed", "observations"} <= set(d) \
            or set(d) - names or not isinstance(d.get("observations"), dict):
        raise UserInputError(f"{what} is not an hwlab drill: pass a drill-*.json written by `hwlab drill new`")
    return drills.Drill(**d)


def draw(seed: int | None = None):
    """A drill drawn and sealed by the class's service (recorded runs; the fault sealed with its key)."""
    return unverified(_call("drill/new", {"seed": seed})["drill"], "the service's drill")


def submit(drill: Any, leaf: str, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """The service's grade of ``leaf`` for ``drill`` (recorded there): passed, status, explanation."""
    return _call("drill/submit", {"drill": asdict(drill), "leaf": leaf, "evidence": evidence})


def reveal(drill: Any) -> dict[str, Any]:
    """The drill's fault and leaf, sent by the service after it recorded the reveal."""
    return _call("drill/reveal", {"drill": asdict(drill)})
