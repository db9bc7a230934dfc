"""``hwlab examine MODULE:FUNC``: measure a function of your own and walk the flowchart on it.
``hwlab examine --trace FILE_OR_DIR [--rank R] [--step N] [--baseline RECORD]``: the same parts
and walks read from a profiler trace instead (:mod:`hwlab.examine.from_trace`); with ``--out X.json``
the annotated trace goes to ``X.annotated.trace.json.gz``; same exit codes.

Inputs: ``--inputs MODULE:FUNC`` returns the argument tuple (called again for fresh sets to
rotate past L2); without it, a function named ``inputs`` in the target's module is used, and
the report says so. With ``--model`` the target is a factory returning ``(module, inputs)``
(an ``nn.Module`` or a bound method of one, such as a decode step; ``inputs`` an argument tuple
or a function returning one), examined in eval mode under ``torch.no_grad``.
``--out X.json`` also writes the profiler's Chrome trace to ``X.trace.json`` (open it in
Perfetto or chrome://tracing); both destinations are checked before anything is measured.
Progress (import, checked call, timing, back to back, profile, counting, ceilings, parts) goes
to stderr as each phase starts; stdout carries only the report (or strict JSON with --json).
Exit codes: 0 the walk lands on OK, 1 it lands on another leaf (a finding), 2 bad input (one
line, nothing printed or written; also a target that calls ``sys.exit`` on import, and a
``--n-bytes`` or ``--n-flops`` implying a rate no device reaches, refused once the timing shows
it) or an ``--out`` write that failed after measuring (the report is printed, the examination
kept in the rescue folder and its path printed), 4 the walk cannot decide (a question's metric
was not measured: the report says which).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hwlab.errors import EXIT_FINDING, EXIT_OK, EXIT_UNDECIDED, UserInputError
from hwlab.errors import EXIT_USAGE
from hwlab.core.validate import count_arg
from hwlab.cli.console import SUBSTEP as SUBSTEP_PREFIX, trace_mib


def add_parser(sub) -> None:
    e = sub.add_parser("examine", help="your function, model or one profiler trace: where the time goes, "
                       "and the flowchart walk on it",
                       description="Measure MODULE:FUNC (or a model with --model), or read one profiler trace "
                       "(--trace), and walk the flowchart on it; the traces of several ranks of one job are "
                       "compared by hwlab ranks --traces DIR. Exit codes: 0 the "
                       "walk lands on OK, 1 another leaf (a finding), 2 bad input, 3 internal error, "
                       "4 undecided (a question's metric was not measured; the report says which).")
    e.add_argument("target", metavar="MODULE:FUNC", nargs="?",
                   help="a dotted module or a .py path, then :FUNC (or --trace instead)")
    e.add_argument("--trace", metavar="FILE_OR_DIR",
                   help="examine one profiler trace (.json / .json.gz, or its folder) instead of running a "
                   "function: parts, floors and walks from what the trace recorded (needs no torch); to "
                   "compare the traces of several ranks: hwlab ranks --traces DIR")
    e.add_argument("--rank", type=int, metavar="R", help="with --trace on a folder: the rank's trace")
    e.add_argument("--step", type=int, metavar="N", help="with --trace: only ProfilerStep#N")
    e.add_argument("--baseline", metavar="RECORD",
                   help="with --trace: measured ceilings from a doctor, baseline or examine record "
                   "(default: the datasheet of the GPU the trace names)")
    e.add_argument("--inputs", metavar="MODULE:FUNC",
                   help="returns the argument tuple (default: the target module's `inputs`, if any)")
    e.add_argument("--model", action="store_true",
                   help="the target is a factory returning (module, inputs): an nn.Module or a decode step")
    e.add_argument("--json", action="store_true", help="strict JSON on stdout")
    e.add_argument("--ncu", action="store_true", help="add Nsight Compute counters where `ncu` exists")
    e.add_argument("--out", metavar="PATH", help="write the examination (.json) and a draft incident beside it")
    e.add_argument("--force", action="store_true", help="replace --out PATH if it exists (a regular file only; "
                   "never the trace read, a device, a FIFO or a folder)")
    e.add_argument("--max-trace-mib", type=trace_mib, metavar="MIB",
                   help="with --trace: the JSON a trace may expand to (default 2048 MiB, or HWLAB_MAX_TRACE_MIB)")
    e.add_argument("--n-bytes", type=count_arg, help="required bytes, if you know them (else estimated); "
                   "a count implying more than the device can move is refused")
    e.add_argument("--n-flops", type=count_arg, help="FLOPs, if you know them (else estimated); "
                   "a count implying more than the device can compute is refused")
    e.add_argument("--dtype-peak", choices=["fp32", "tf32", "bf16", "fp8"],
                   help="which measured GEMM ceiling is the FLOP floor (default: from the matmul dtype)")
    e.set_defaults(fn=cmd_examine)


def cmd_examine(a) -> int:
    if a.trace is not None or a.target is None:
        return cmd_examine_trace(a)
    for flag in ("rank", "step", "baseline"):
        if getattr(a, flag) is not None:
            raise UserInputError(f"--{flag} goes with --trace: leave it out when examining MODULE:FUNC")
    from hwlab.core.store import check_destination, rescue, write_text_atomic

    from hwlab.cli.console import Steps
    from hwlab.examine import ACCEPTED_PHASE, PHASES

    out = check_destination(a.out, overwrite=a.force) if a.out else None  # before measuring
    if out is not None and out.suffix != ".json":
        raise UserInputError(f"--out {a.out}: give a .json file name")
    trace_out = check_destination(trace_path_for(out), overwrite=a.force) if out is not None else None
    with progress_stream() as err, Steps("hwlab examine", 1 + len(PHASES), file=err, eta=False) as st:
        held = HeldSteps(st.step, ACCEPTED_PHASE, beat_until=PHASES[0])  # progress on stderr: stdout stays JSON
        try:
            with user_output_aside(a.json):
                ex = _examine_model(a, held) if a.model else _examine_function(a, held)
            held.stop(show_held=True)
        except SystemExit as e:  # the user's code ended the process: an error of that code, not a result
            raise UserInputError(f"{a.target} called sys.exit({e.code!r}) while being examined: nothing was "
                                 "measured; return from the function instead of exiting") from None
        finally:
            held.stop()
    save_err = None
    if out is not None:  # checked before measuring; a write that still fails goes to the rescue folder
        try:
            write_text_atomic(out, ex.to_json() + "\n", overwrite=a.force)
            if ex.trace_path and Path(ex.trace_path).is_file():
                write_text_atomic(trace_out, Path(ex.trace_path).read_text(), overwrite=a.force)
            md, _ = ex.save_incident(out.parent if str(out.parent) else Path("."))
            print(f"examination written to {out}" + (f", profiler trace to {trace_out}" if ex.trace_path else "")
                  + f"; draft incident {md}", file=sys.stderr)
        except OSError as e:
            save_err = rescue(json.loads(ex.to_json()), "examination", out, e)
    print(ex.to_json() if a.json else ex.report())
    if save_err:
        print(f"hwlab examine: {save_err}", file=sys.stderr)
        return EXIT_USAGE
    if ex.leaf_id is None:  # the walk stopped at a question it could not answer
        return EXIT_UNDECIDED
    return EXIT_OK if ex.leaf_id == "OK" else EXIT_FINDING


@contextmanager
def user_output_aside(json_out: bool) -> Iterator[None]:
    """With ``--json``, what the user's code prints (Python's ``print`` and writes to file
    descriptor 1 by compiled code) goes to stderr, so stdout holds the JSON alone; without it,
    the prints stay where the user expects them."""
    if not json_out:
        yield
        return
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 (a closed stdout): Python-level prints are still moved
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


@contextmanager
def progress_stream() -> Iterator:
    """Where the progress lines go: a duplicate of file descriptor 2 made now, when stderr is the
    process's own (a command line). The profiler's start and stop point descriptor 2 at a buffer
    for a moment, to drop libkineto's native noise (:class:`hwlab.core.profiling.quiet_profile`),
    and on a GPU that moment lasts seconds: a line written to descriptor 2 then would come out
    only after it. Elsewhere (a test capturing ``sys.stderr``, a notebook) ``None``: the lines go
    to ``sys.stderr`` as it is."""
    try:
        own = sys.stderr is sys.__stderr__ and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a replaced stderr without a descriptor
        own = False
    if not own:
        yield None
        return
    sys.stderr.flush()
    f = os.fdopen(os.dup(2), "w", buffering=1)
    try:
        yield f
    finally:
        with contextlib.suppress(OSError):
            f.close()


#: progress lines wait this long (s), or until the inputs are accepted, whichever comes first. A
#: refusal of bad input found without importing torch (a missing file or name, a target that exits
#: on import) comes within it, alone on its line; a target that imports torch takes longer, and its
#: first line comes at this time, well inside the 5 s an examination may stay silent
#: (examine/progress), so a slow import is never mistaken for a hang
HOLD_S = 1.0


class HeldSteps:
    """Progress steps held back until ``release_at`` is announced (every refusal of bad input,
    which must stay one line, comes before it) or :data:`HOLD_S` have passed (a long examination
    shows where it is even while a slow import, first call or ceiling measurement runs); then the
    held steps are shown in order, and the later ones as they come. Until a step starting with
    ``beat_until`` comes (where the examination's own heartbeat takes over,
    :mod:`hwlab.examine.progress`), the current step is repeated after :data:`HEARTBEAT_S` without a
    line (a target's import or a model's build can take longer)."""

    def __init__(self, step, release_at: str, hold_s: float = HOLD_S, beat_until: str | None = None):
        import threading
        import time

        from hwlab.examine.progress import ESTIMATING, HEARTBEAT_S, SUBSTEP

        self._step, self._release_at = step, release_at
        self._held: list[str] | None = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(hold_s, self._release)
        self._timer.daemon = True
        self._timer.start()
        self._beat_until, self._current, t0 = beat_until, "", time.monotonic()
        self._last = t0
        self._done = threading.Event()

        def beat() -> None:
            while self._beat_until is not None and not self._done.wait(0.25):
                if time.monotonic() - self._last >= HEARTBEAT_S and self._current:
                    self(f"{SUBSTEP}{self._current.split(' (')[0]} ({time.monotonic() - t0:.0f} s in, {ESTIMATING})")

        self._beater = threading.Thread(target=beat, name="hwlab-examine-import-beat", daemon=True)
        if beat_until is not None:
            self._beater.start()

    def _release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
            for label in held or []:
                self._step(label)

    def __call__(self, label: str) -> None:
        import time

        self._last = time.monotonic()
        if not label.startswith(SUBSTEP_PREFIX):
            self._current = label
            if self._beat_until is not None and label.startswith(self._beat_until):
                self._beat_until = None  # the examination's heartbeat from here
        with self._lock:
            # a step's label may carry its time left after the phase's name: the phase is its start
            if self._held is not None and not label.startswith(self._release_at):
                self._held.append(label)
                return
        self._release()
        with self._lock:
            self._step(label)

    def stop(self, show_held: bool = False) -> None:
        """The timer is cancelled; with ``show_held`` (the examination finished) anything still held is
        shown, so an examination shorter than the hold still lists its steps; without it (a refusal)
        the held steps are dropped, and the refusal stays one line."""
        self._timer.cancel()
        self._beat_until = None
        self._done.set()
        if show_held:
            self._release()


def trace_path_for(out: Path) -> Path:
    """``X.json`` -> ``X.trace.json``: the Chrome trace beside the examination."""
    return out.with_name(out.stem + ".trace.json")


def _examine_model(a, step):
    from hwlab.examine import examine
    from hwlab.examine.progress import ESTIMATING
    from hwlab.examine.target import load_model

    step(f"import {a.target} (the model factory) ({ESTIMATING})")
    module, args, make = load_model(a.target)
    if a.inputs:
        raise UserInputError("--model takes its inputs from the factory: leave out --inputs")
    ex = examine(module, *args, make_inputs=make, n_bytes=a.n_bytes, n_flops=a.n_flops, dtype_peak=a.dtype_peak,
                 ncu_target=f"model={a.target}" if a.ncu else None, name=a.target, on_step=step)
    ex.notes.append(f"module and inputs from the factory {a.target}")
    return ex


def _examine_function(a, step):
    from hwlab.examine import examine
    from hwlab.examine.progress import ESTIMATING
    from hwlab.examine.target import load

    step(f"import {a.target} and its inputs ({ESTIMATING})")
    fn, mod = load(a.target)
    if a.inputs:
        make, inputs_spec = load(a.inputs, "input factory")[0], a.inputs
    elif callable(getattr(mod, "inputs", None)) and getattr(mod, "inputs") is not fn:
        make, inputs_spec = mod.inputs, f"{a.target.rsplit(':', 1)[0]}:inputs"
    else:
        raise UserInputError(f"{a.target} needs inputs: pass --inputs MODULE:FUNC returning its argument "
                             "tuple (or define `inputs()` in its module)")
    spec = f"{a.target}@{inputs_spec}"
    ex = examine(fn, make_inputs=make, n_bytes=a.n_bytes, n_flops=a.n_flops, dtype_peak=a.dtype_peak,
                 ncu_target=spec if a.ncu else None, name=a.target, on_step=step)
    ex.notes.append(f"inputs from {inputs_spec}")
    return ex


def cmd_examine_trace(a) -> int:
    """``hwlab examine --trace``: no torch is imported on this path (a laptop without it reads traces)."""
    from hwlab.core.store import check_destination, rescue, write_text_atomic

    if a.trace is None:
        raise UserInputError("give MODULE:FUNC to examine a function, or --trace FILE_OR_DIR to examine a trace")
    if a.target is not None:
        raise UserInputError(f"give either MODULE:FUNC ({a.target}) or --trace, not both")
    for flag in ("inputs", "ncu", "n_bytes", "n_flops", "dtype_peak"):
        if getattr(a, flag):
            raise UserInputError(f"--{flag.replace('_', '-')} needs a function run: leave it out with --trace")
    if a.model:
        raise UserInputError("--model needs a function run: leave it out with --trace")
    from hwlab.traces.trace_ops import find_trace
    from hwlab.traces.trace_stream import describe_progress, text_limit
    from hwlab.examine.from_trace import annotated_path, examine_trace, write_annotated

    if not a.trace.strip():
        raise UserInputError("--trace is empty: give a trace file or the folder that holds it")
    inputs = [x for x in (a.trace, a.baseline) if x]
    out = check_destination(a.out, overwrite=a.force, inputs=inputs) if a.out else None  # before reading
    if out is not None and out.suffix != ".json":
        raise UserInputError(f"--out {a.out}: give a .json file name")
    ann = check_destination(annotated_path(out), overwrite=a.force, inputs=inputs) if out is not None else None
    try:
        path = find_trace(a.trace, a.rank)
    except UserInputError as e:
        raise UserInputError(f"{e}{_ranks_pointer(a.trace)}") from None
    if out is not None:  # the trace found in a folder is an input too: never written over
        for dest in (out, ann):
            check_destination(dest, overwrite=a.force, inputs=[path, *inputs])

    def progress(done: int, total: int) -> None:
        print(f"reading {path.name}: {describe_progress(done, total)}", file=sys.stderr)

    from hwlab.examine.from_trace import NothingToDiagnose
    try:
        with text_limit(a.max_trace_mib):
            ex = examine_trace(path, step=a.step, baseline=a.baseline, progress=progress)
    except NothingToDiagnose as nothing:  # an honest nothing: said, exit 0, no finding
        if a.json:
            from hwlab.core.store import dumps_strict
            print(dumps_strict(nothing.to_dict()))
        else:
            print(f"hwlab examine --trace: {path.name}: nothing to diagnose: {nothing.why}")
        return EXIT_OK
    if a.rank is not None and ex.ot.rank is not None and ex.ot.rank != a.rank:
        raise UserInputError(f"--rank {a.rank}: {path.name} is rank {ex.ot.rank}'s trace; pass its folder or "
                             "the rank's own file")
    save_err = None
    if out is not None:
        try:
            write_annotated(ex, ann, overwrite=a.force)
            write_text_atomic(out, ex.to_json() + "\n", overwrite=a.force)
            print(f"examination written to {out}, annotated trace to {ann}", file=sys.stderr)
        except OSError as e:
            save_err = rescue(json.loads(ex.to_json()), "examination", out, e)
    print(ex.to_json() if a.json else ex.report())
    if save_err:
        print(f"hwlab examine: {save_err}", file=sys.stderr)
        return EXIT_USAGE
    if ex.leaf_id is None:
        return EXIT_UNDECIDED
    return EXIT_OK if ex.leaf_id == "OK" else EXIT_FINDING


def _ranks_pointer(given: str) -> str:
    """What to add to a refusal of ``examine --trace DIR`` when the folder is ``hwlab ranks``'s
    input: several traces (one per rank) or a run directory of step logs."""
    p = Path(given)
    if not p.is_dir():
        return ""
    if any(p.glob("steps-rank-*.jsonl")) or any(p.glob("*/steps-rank-*.jsonl")):
        return f"; a run directory of step logs is read by `hwlab ranks {given}`"
    if len([x for x in p.iterdir() if x.name.endswith((".json", ".json.gz"))]) > 1:
        return f"; to compare the ranks with each other: hwlab ranks --traces {given}"
    return ""

