"""Small helpers the notebooks share: where results come from, and plots in hardware units.

Everything a notebook shows is either *live* (measured now on this machine, GPU or CPU)
or *recorded* (from :mod:`hwlab.evidence`); :func:`banner` prints which, every time.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Iterable

import torch

from hwlab.core.measure import Measurement


def has_gpu() -> bool:
    return torch.cuda.is_available()


def banner(text: str, source: str) -> None:
    """Print a header that says where the numbers below come from."""
    from IPython.display import Markdown, display

    display(Markdown(f"**{text}** — _{source}_"))


def md(text: str) -> None:
    """Show markdown built from a result: a figure in prose is rendered from the run or the
    record, never typed, so it cannot drift from the output beside it."""
    from IPython.display import Markdown, display

    display(Markdown(text))


#: a kernel shown in a notebook fits one screen beside its reference, as Triton's tutorials show
#: theirs; a longer one shows its core loop instead
SHOW_MAX_LINES = 40


def kernel_source(fn, max_lines: int = SHOW_MAX_LINES) -> str:
    """The source of ``fn`` (a ``@triton.jit`` kernel or a plain function), read from the module
    it runs from, so what a notebook shows is what it measures. Raises ``ValueError`` if it is
    longer than ``max_lines``."""
    import inspect
    import textwrap

    src = textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn))).rstrip()
    n_lines = len(src.splitlines())
    if n_lines > max_lines:
        raise ValueError(f"{getattr(fn, '__name__', fn)} is {n_lines} lines; show its core loop "
                         f"(at most {max_lines} lines)")
    return src


def show_kernel(*fns, note: str = "") -> None:
    """Show the source of each function in ``fns`` (the kernel and its torch reference) and a
    line saying what to look at."""
    body = "\n\n".join(kernel_source(f) for f in fns)
    md(f"```python\n{body}\n```" + (f"\n\n{note}" if note else ""))


def live_label() -> str:
    from hwlab.core.measure import device_name, device_of

    dev = device_of()
    kind = "GPU" if dev.type == "cuda" else "CPU (Triton interpreter / torch CPU; not GPU speed)"
    return f"measured live on {device_name(dev)}, {kind}"


def plot_gbps(ms: Iterable[Measurement], ceiling_gbps: float, title: str, source: str,
              moved: dict[str, int] | None = None, ax=None):
    """Bars of achieved GB/s (required bytes, and bytes moved where known) vs the ceiling."""
    import matplotlib.pyplot as plt

    ms = list(ms)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    names = [m.name for m in ms]
    req = [m.gbps for m in ms]
    ax.bar(names, req, label="GB/s of required bytes")
    if moved:
        mv = [moved.get(m.name, m.n_bytes) / (m.t_ms * 1e-3) / 1e9 for m in ms]
        ax.scatter(names, mv, marker="_", s=600, color="k", zorder=3, label="GB/s of bytes moved")
    ax.axhline(ceiling_gbps, ls="--", color="r", label=f"measured copy {ceiling_gbps:,.0f} GB/s")
    ax.set_ylabel("GB/s")
    ax.set_title(f"{title}\n({source})", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def show_mermaid(src: str) -> None:
    """Render Mermaid in JupyterLab 4 (it draws ```mermaid blocks); plain text elsewhere."""
    from IPython.display import Markdown, display

    display(Markdown(f"```mermaid\n{src}\n```"))


def flowchart_walkthrough(evidence: dict | None = None, source: str = ""):
    """An ipywidgets walk through the flowchart: each question with its metric, threshold and
    reason; the learner answers Yes/No. *Hint* reveals one measured answer at a time: for the
    question at hand only, the metric that decides it from ``evidence`` (a probe's output), its
    value against the rule, a borderline or invalid flag, and which way that points; it never
    presses the button, so the walk stays the learner's. Returns the widget (display it)."""
    import ipywidgets as W

    from hwlab.diagnosis import flowchart as F

    state = {"node": F.START, "answers": {}, "how": {}}  # how: question -> "measured" | "by hand"
    title = W.HTML()
    detail = W.HTML()
    trail = W.HTML()
    yes, no, use = W.Button(description="Yes"), W.Button(description="No"), W.Button(description="Hint")
    hint = W.HTML()
    restart = W.Button(description="Start again")

    def render():
        node = state["node"]
        path = " → ".join(f"{q}:{a} ({state['how'].get(q, 'by hand')})" for q, a in state["answers"].items())
        trail.value = f"<small>path: {path or '(start)'}</small>"
        if node in F.LEAVES:
            leaf = F.LEAVES[node]
            title.value = f"<b>Leaf {leaf.id}: {leaf.title}</b>"
            detail.value = "<ul>" + "".join(f"<li>{a}</li>" for a in leaf.actions) + "</ul>" + (
                f"<small>lab: {leaf.lab}</small>" if leaf.lab else "")
            for b in (yes, no, use):
                b.disabled = True
            return
        q = F.QUESTIONS[node]
        title.value = f"<b>{q.id}. {q.text}</b>"
        rules = "".join(f"<li><code>{c.describe()}</code>: {c.reason}</li>" for c in q.criteria)
        over = "".join(f"<li>first: <code>{c.describe()}</code> sends it to NO: {c.reason}</li>" for c in q.overrides_no)
        have = {c.metric: evidence[c.metric] for c in q.criteria + q.overrides_no
                if evidence and evidence.get(c.metric) is not None}
        detail.value = (f"<ul>{over}{rules}</ul><small>probe: {q.probe}</small><br>"
                        + (f"the evidence{(' (' + source + ')') if source else ''} measures "
                           f"{', '.join(have)} here: read it, or ask for a hint" if have else
                           "no evidence for this question: answer by hand or run the probe"))
        hint.value = ""
        yes.disabled = no.disabled = False
        use.disabled = not have

    def answer(ans: str, how: str = F.BY_HAND):
        q = F.QUESTIONS[state["node"]]
        state["answers"][q.id] = ans
        state["how"][q.id] = how
        state["node"] = q.yes if ans == "yes" else q.no
        render()

    def from_evidence(_):
        hint.value = f"<i>{hint_text(evidence or {}, state['node'], state['answers'])}</i>"

    yes.on_click(lambda _: answer("yes"))
    no.on_click(lambda _: answer("no"))
    use.on_click(from_evidence)

    def again(_):
        state["node"], state["answers"], state["how"] = F.START, {}, {}
        render()
    restart.on_click(again)
    render()
    return W.VBox([title, detail, W.HBox([yes, no, use, restart]), hint, trail])


def hint_text(evidence: dict, node: str, answers: dict[str, str] | None = None) -> str:
    """One measured answer: the question ``node`` answered from ``evidence`` alone (its deciding
    metric, value, rule, spread or validity, and the branch it points to), nothing past it."""
    from hwlab.diagnosis import flowchart as F

    q = F.QUESTIONS[node]
    sub = {c.metric: evidence[c.metric] for c in q.criteria + q.overrides_no if evidence.get(c.metric) is not None}
    meta = {k: evidence[k] for k in F.META_KEYS if k in evidence}
    # diagnose one question: route the evidence through the same rule the chart uses
    d = F.diagnose({**_prefix(answers or {}), **sub, **meta})
    step = next((s for s in d.steps if s.question == q.id), None)
    bad = [str(iv) for iv in d.invalid if iv.question == q.id]
    if step is None:
        return " ".join(bad) or f"no measured answer for {q.id} in this evidence: run {q.probe}"
    return " ".join(bad + [f"{step.metric} = {F._fmt(step.value)} against {step.criterion}"
                           f"{step.spread_text()}: that points to {step.answer.upper()} at {q.id}"])


def show_walk(d, source: str = "") -> None:
    """Print a walk with, per step, whether it was measured (and by what) or answered by hand;
    a walk with a by-hand answer ends in a NOTE that says so (:meth:`Diagnosis.explain`)."""
    print((f"[{source}]\n" if source else "") + d.explain())


def _prefix(answers: dict[str, str]) -> dict:
    """Turn earlier by-hand answers back into the by-hand metrics diagnose() understands."""
    from hwlab.diagnosis import flowchart as F

    out = {}
    for qid, ans in answers.items():
        q = F.QUESTIONS[qid]
        if q.bool_metric:
            out[q.bool_metric] = ans == "yes"
        elif q.criteria:  # force the same answer through the first criterion
            c = q.criteria[0]
            hit = c.threshold + (1 if c.op in (">=", ">") else -1)
            miss = c.threshold - (1 if c.op in (">=", ">") else -1)
            out[c.metric] = hit if ans == "yes" else miss
    return out


#: the file of checkpoint answers that executed copies and CI fill in (through the checker); set by
#: tests/test_notebooks.py and tools/execute_notebooks.py, never in a learner's kernel
ENV_CHECKPOINT_ANSWERS = "HWLAB_CHECKPOINT_ANSWERS"


@functools.lru_cache(maxsize=None)
def _filled_answer_type():
    """The answer type of a solutions-file answer (one class, made on first use: the checker's module
    is imported only by notebooks that grade)."""
    from hwlab.course.checkpoint import Answer

    class FilledAnswer(Answer):
        """An answer taken from the solutions file: graded like any other, never kept as a learner's."""

    return FilledAnswer


class ReadOff(str):
    """A solution's value that says "read this metric off the evidence shown" (a live run's value
    differs per machine): :func:`checkpoint` reads it from the same evidence the learner saw."""


def answer(checkpoint_id: str, leaf=None, metric=None, value=None, prediction=None, *, evidence=None):
    """The learner's answer to a checkpoint. Blanks (``None``) stay blanks in a learner's kernel and
    are graded "fill in"; only where ``$HWLAB_CHECKPOINT_ANSWERS`` names a solutions file (CI and the
    executed copies) is an all-blank answer filled from it, and then graded like any other. ``evidence``
    (the evidence shown) lets a solution that names several metrics take the one it holds."""
    import json
    import os

    from hwlab.course.checkpoint import Answer

    given = Answer(leaf, metric, value, prediction)
    path = os.environ.get(ENV_CHECKPOINT_ANSWERS)
    if given != Answer() or not path:
        return given
    sol = json.loads(open(path, encoding="utf-8").read())[checkpoint_id]
    v = sol.get("value")
    print(f"[checkpoint {checkpoint_id}: answer filled from {os.path.basename(path)} (executed copy), graded below]")
    metric = sol.get("metric")
    if isinstance(metric, list):  # the first of the chart's metrics for that rule that this evidence holds
        metric = next((m for m in metric if m in (evidence or {})), metric[0])
    return _filled_answer_type()(sol.get("leaf"), metric, ReadOff(metric) if v == "read off the evidence" else v,
                                 sol.get("prediction"))


def checkpoint(checkpoint_id: str, ans, walk, ev: dict, *, step: str | None = None, prediction=None,
               source: str = ""):
    """Grade ``ans`` against the kit's walk ``walk`` of ``ev`` (computed in this run), print the result
    and return it; ``result.walk()`` shows the walk once the answer passed
    (:mod:`hwlab.course.checkpoint`), and :func:`gated` / :func:`explain` hold back whatever else later
    cells would show of the answer until then. A blank answer prints what to fill in; it raises nothing,
    so Run All goes on through the rest of the notebook."""
    from dataclasses import replace

    from hwlab.course import checkpoint as C

    filled = isinstance(ans, _filled_answer_type())  # from the solutions file: not a learner's answer to keep
    if release not in C.ON_SHOWN:
        C.ON_SHOWN.append(release)
    if isinstance(ans.value, ReadOff):
        ans = replace(ans, value=ev.get(str(ans.value)))
    res = C.check(C.Checkpoint(checkpoint_id, walk, ev, step=step, prediction=prediction, source=source), ans,
                  record=not filled)
    print(res)
    if shows(res):
        release(checkpoint_id)
    return res


def show_evidence(ev: dict, source: str = "") -> None:
    """Print the metrics of ``ev`` the flowchart reads, with spread and source, and no verdict."""
    from hwlab.course.checkpoint import render_evidence

    print(render_evidence(ev, source))


def gate_line(cp, what: str = "this cell's results") -> str:
    """The line a gated cell shows instead of its output while checkpoint ``cp`` has not passed."""
    return (f"[{what} hidden: answer the checkpoint above first (checkpoint {cp.checkpoint}: {cp.status}); "
            "it shows here once the checkpoint passes or is revealed]")


#: per checkpoint id: the held-back outputs of gated cells, each (display handle, HTML, plain text),
#: shown in place by :func:`release` when the checkpoint passes or is revealed
_HELD: dict[str, list[tuple]] = {}


def release(checkpoint_id: str) -> int:
    """Show in place, in the cells that held them back, the outputs gated on ``checkpoint_id``
    (:func:`gated`), without re-running those cells; how many were shown."""
    held = _HELD.pop(checkpoint_id, [])
    for handle, html_text, plain in held:
        handle.update({"text/html": html_text, "text/plain": plain}, raw=True)
    return len(held)


def _held_bundle(captured, pngs: list[bytes]) -> tuple[str, str]:
    """The captured output of a gated block (its stdout, displays and figures) as one HTML block and
    its plain text."""
    import base64
    import html

    parts, plain = [], []
    if captured.stdout:
        parts.append(f"<pre>{html.escape(captured.stdout)}</pre>")
        plain.append(captured.stdout)
    for out in captured.outputs:
        d = out.data
        if "text/html" in d:
            parts.append(d["text/html"])
        elif "image/png" in d:
            parts.append(f'<img src="data:image/png;base64,{d["image/png"]}"/>')
        elif "text/markdown" in d:
            parts.append(_markdown_html(d["text/markdown"]))
        elif "text/plain" in d:
            parts.append(f"<pre>{html.escape(d['text/plain'])}</pre>")
        plain.append(d.get("text/markdown") or d.get("text/plain") or "")
    for png in pngs:
        parts.append(f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}"/>')
    return "\n".join(parts), "\n".join(plain)


def _markdown_html(text: str) -> str:
    import html

    try:
        import mistune
        return mistune.html(text) if hasattr(mistune, "html") else mistune.markdown(text)
    except ImportError:
        return f"<pre>{html.escape(text)}</pre>"


def shows(cp) -> bool:
    """Whether what follows checkpoint ``cp`` may be shown: it passed, its answer was revealed (after
    the tries :meth:`hwlab.course.checkpoint.Result.reveal` asks for), or its walk reaches no leaf
    (nothing to grade; the walk says what to measure). ``None`` (no checkpoint) shows."""
    from hwlab.course.checkpoint import PASSED, REVEALED, UNDECIDED

    return cp is None or cp.status in (PASSED, UNDECIDED, REVEALED)


def reveal(check_name: str) -> str:
    """The answer of an exercise check (by the name its result prints) after its wrong tries, marked as
    revealed in the class record (:func:`hwlab.course.tries.reveal`); before that, the tries left."""
    from hwlab.course import tries

    return tries.reveal(check_name)


@contextlib.contextmanager
def gated(cp, what: str = "this cell's results"):
    """Run the block, but show what it prints, displays or plots only once checkpoint ``cp`` passed
    (:func:`shows`); before that its output is dropped and one line says to answer the checkpoint
    above first. The block still runs, so later cells find its variables (Run All goes on)::

        with nb.gated(CP, "the measured speed-up"):
            print(f"fused over unfused: {speedup:.2f}x")

    Everything a checkpoint asks about (the leaf, the deciding value, the predicted figure) that a
    later cell shows goes through this gate, plots and tables included."""
    if shows(cp):
        yield True
        return
    from IPython.display import display
    from IPython.utils.capture import capture_output

    plt = sys.modules.get("matplotlib.pyplot")
    figs_before = set(plt.get_fignums()) if plt else set()
    pngs: list[bytes] = []
    try:
        with capture_output(stdout=True, stderr=False, display=True) as captured:
            yield False
    finally:
        plt = sys.modules.get("matplotlib.pyplot")
        for n in sorted(set(plt.get_fignums()) - figs_before) if plt else ():
            import io
            buf = io.BytesIO()
            plt.figure(n).savefig(buf, format="png", bbox_inches="tight")
            pngs.append(buf.getvalue())
            plt.close(n)  # a figure left open would be drawn at the cell's end
        from IPython.core.interactiveshell import InteractiveShell

        if InteractiveShell.initialized():  # in a kernel: held back, shown in place when the checkpoint passes
            handle = display({"text/plain": gate_line(cp, what)}, raw=True, display_id=True)
            _HELD.setdefault(cp.checkpoint, []).append((handle, *_held_bundle(captured, pngs)))
        else:
            print(gate_line(cp, what))


def walk(cp, label: str = "", full: bool = False) -> None:
    """Print the kit's walk of checkpoint ``cp`` (one line, or in full), held back like :func:`gated` until
    the checkpoint passes or is revealed, then shown in place."""
    with gated(cp, "the kit's walk"):
        w = getattr(cp, "_walk", None)
        print((f"{label}: " if label else "") + (w.render(full=full) if w is not None else cp.walk(full=full)))


def explain(cp, text: str) -> None:
    """Markdown that explains a checkpoint's answer, shown once ``cp`` passed (:func:`gated`)."""
    with gated(cp, "the explanation of this walk"):
        md(text)
