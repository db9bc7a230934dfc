"""``hwlab class serve GRADEBOOK [--group INSTRUCTORS]``: the class's grading service.

Top floor. A JupyterHub service (``c.JupyterHub.services`` in ``deploy/jupyterhub_config.py``:
the hub starts it with ``user`` set to the class's own account, and gives it its URL, prefix and
API token in the environment). Every request carries the learner's hub token; the hub says whose it
is (``HubAuth``, with the ``access:services!service=NAME`` scope the hub gives the learners' servers),
so a name in the request body is never read. It grades on the server
(:mod:`hwlab.course.gradebook`) and appends the record to the gradebook, a folder only this service's
user writes.

Routes under ``$JUPYTERHUB_SERVICE_PREFIX``:

* ``POST checkpoint``: ``{checkpoint, notebook, evidence, step, prediction, source, answer}`` ->
  ``{status, messages, tries, may_reveal}``;
* ``POST reveal``: ``{checkpoint}`` -> ``{revealed, message}`` (recorded only after the service counted
  the wrong tries);
* ``POST drill/new`` ``{seed?}`` -> ``{drill}`` (sealed with the service's drill key);
  ``POST drill/submit`` ``{drill, leaf, evidence?}`` -> ``{passed, status, explanation}``;
  ``POST drill/reveal`` ``{drill}`` -> the fault and its leaf, recorded as revealed first;
* ``POST exercise`` ``{check, name, status, notebook, args, kwargs}`` -> ``{status, passed, graded_by}``:
  a check of :data:`hwlab.course.gradebook.SERVER_CHECKS` is graded again here on its arguments; any
  other is recorded as learner-reported (never a pass); ``POST exercise/reveal`` ``{name, notebook}`` ->
  ``{revealed, message}`` (recorded only after the service counted the wrong tries);
* ``GET mine``: this learner's own records.

Status codes: 200, 400 (malformed request: one line saying what to send), 403 (no or wrong hub
token), 413 (body over :data:`hwlab.course.gradebook.MAX_REQUEST_BYTES`), 429 (the learner's quota
is full). It runs as whoever starts it: the hub starts it as the class's account (the service's
``user``), never as root or a learner.
"""
from __future__ import annotations

import json
import os
import sys

from hwlab.errors import UserInputError

SERVICE_NAME = "hwlab-grader"


def make_app(folder: str, prefix: str):
    """The tornado application of the service (HubAuth from the environment the hub sets)."""
    from jupyterhub.services.auth import HubAuth, HubAuthenticated
    from tornado import web

    from hwlab.course import gradebook

    auth = HubAuth(api_token=os.environ["JUPYTERHUB_API_TOKEN"], cache_max_age=60)

    class Base(HubAuthenticated, web.RequestHandler):
        hub_auth = auth

        def check_xsrf_cookie(self):  # token in the Authorization header only: no cookie to forge
            return

        def learner(self) -> str:
            m = self.get_current_user()
            if not m or m.get("kind") != "user":
                raise web.HTTPError(403, "send your hub token: Authorization: token $JUPYTERHUB_API_TOKEN")
            return m["name"]

        def body(self) -> dict:
            if len(self.request.body) > gradebook.MAX_REQUEST_BYTES:
                raise web.HTTPError(413)
            try:
                d = json.loads(self.request.body or b"{}")
            except ValueError:
                d = None
            if not isinstance(d, dict):
                self.reply(400, {"error": "send one JSON object"})
                return None
            return d

        def reply(self, code: int, d: dict) -> None:
            self.set_status(code)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(d, allow_nan=False, default=str))

        def run(self, fn) -> None:
            who = self.learner()
            d = self.body()
            if d is None:
                return
            try:
                self.reply(200, fn(folder, who, d))
            except gradebook.QuotaExceeded as e:
                self.reply(429, {"error": str(e)})
            except UserInputError as e:
                self.reply(400, {"error": str(e)})

    class Checkpoint(Base):
        def post(self):
            self.run(gradebook.grade_checkpoint)

    class Exercise(Base):
        def post(self):
            self.run(gradebook.grade_exercise)

    class ExerciseReveal(Base):
        def post(self):
            self.run(gradebook.reveal_exercise)

    class Reveal(Base):
        def post(self):
            self.run(gradebook.reveal_checkpoint)

    class DrillNew(Base):
        def post(self):
            self.run(gradebook.new_drill)

    class DrillSubmit(Base):
        def post(self):
            self.run(gradebook.submit_drill)

    class DrillReveal(Base):
        def post(self):
            self.run(gradebook.reveal_drill)

    class Mine(Base):
        def get(self):
            self.reply(200, {"learner": (who := self.learner()), "records": gradebook.learner_records(folder, who)})

    p = prefix.rstrip("/")
    return web.Application([(f"{p}/checkpoint", Checkpoint), (f"{p}/reveal", Reveal), (f"{p}/exercise", Exercise), (f"{p}/exercise/reveal", ExerciseReveal), (f"{p}/mine", Mine),
                            (f"{p}/drill/new", DrillNew), (f"{p}/drill/submit", DrillSubmit),
                            (f"{p}/drill/reveal", DrillReveal)])


def serve(folder: str, group: str | None) -> int:
    import asyncio
    from urllib.parse import urlparse

    from hwlab.course import gradebook

    os.umask(0o027)  # the records: the service's to write, the instructors' group's to read
    gradebook.make(folder, group)
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{SERVICE_NAME}/")
    if not os.environ.get("JUPYTERHUB_API_TOKEN"):
        raise UserInputError("JUPYTERHUB_API_TOKEN is not set: the hub starts this service "
                             "(c.JupyterHub.services in deploy/jupyterhub_config.py)")

    async def main():
        make_app(folder, prefix).listen(url.port, url.hostname, max_body_size=gradebook.MAX_REQUEST_BYTES)
        print(f"hwlab grading service: {folder} at {url.geturl()}{prefix}", file=sys.stderr, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    return 0
