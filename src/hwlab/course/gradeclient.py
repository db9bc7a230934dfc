"""The learner's side of the class's grading service (:mod:`hwlab.cli.gradeservice`).

Where ``HWLAB_GRADER_URL`` is set (the hub sets it in every learner's server,
``deploy/jupyterhub_config.py``), a graded checkpoint answer is sent there with the server's own
hub token (``JUPYTERHUB_API_TOKEN``); the service grades it again and keeps the record, and its
status and try count are the ones shown. A reveal is shown only once the service recorded it.
Nothing is written to a class folder from the learner's kernel then.

A service that cannot be reached is reported in the result (the local grading still shows); it is
never replaced by a local record the learner could edit.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

ENV_URL = "HWLAB_GRADER_URL"
#: seconds to wait for the service: it grades one answer (a walk of one evidence table)
TIMEOUT_S = 30


class GraderUnavailable(OSError):
    """The grading service did not answer or refused the request."""


def url() -> str | None:
    return os.environ.get(ENV_URL) or None


def call(route: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """POST ``body`` (GET without one) to the service's ``route``; the reply's JSON object."""
    base = url()
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not base:
        raise GraderUnavailable(f"{ENV_URL} is not set")
    data = None if body is None else json.dumps(body, default=str).encode()
    req = urllib.request.Request(base.rstrip("/") + "/" + route, data=data, method="GET" if body is None else "POST",
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            d = json.loads(r.read(1 << 20))
    except urllib.error.HTTPError as e:
        try:
            why = json.loads(e.read(4096)).get("error") or e.reason
        except (ValueError, AttributeError):
            why = e.reason
        raise GraderUnavailable(f"the class's grading service refused the answer ({e.code}): {why}") from None
    except (OSError, ValueError) as e:
        raise GraderUnavailable(f"the class's grading service at {base} did not answer: {e}") from None
    if not isinstance(d, dict):
        raise GraderUnavailable("the class's grading service sent no JSON object")
    return d
