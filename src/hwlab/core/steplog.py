"""Per-rank step log for a real training or serving loop: JSONL, no added synchronisation.

::

    log = StepLog(run_dir, n_flops=flops_per_step)        # one per rank
    for i, batch in enumerate(loader):
        with log.step(i):
            loss = model(batch)...
            with log.collective("grad_allreduce"):          # optional: time in a collective
                dist.all_reduce(grad)
    log.close()

Each rank writes ``RUN_DIR/<host>/steps-rank-00003.jsonl``: a header line, then one line per
step with its host-clock start (Unix seconds), its length and the time in each named
collective. Host clocks (``time.perf_counter``) cost nothing and add no synchronisation; on a
GPU the host only sees when work was *queued*, unless the loop itself waits (``loss.item()``,
a blocking collective). ``cuda_events=True`` also records CUDA events around each step and
collective and reads them lazily: an event is read only once ``query()`` says it completed,
so no step ever waits for the GPU (the one wait is at :meth:`close`).

What the report (:mod:`hwlab.diagnosis.ranks`) derives: a rank's *compute* is its step minus all its
collective time (slow card, slow host, NUMA); its *arrival* is the step up to the start of
its last collective (late into the sync point, e.g. because an earlier collective crossed a
slow link). ``n_flops``/``n_bytes`` (the step's work, if you know it) let the report compare
the compute against the capture's probe baseline (flowchart question B).

``nvml_sample_s=0.05`` (opt-in) also samples this rank's GPU through NVML every 50 ms from a
background thread (:mod:`hwlab.core.nvml_sampler`: utilisation, SM activity, PCIe and NVLink
throughput; no CUDA call, so no synchronisation) and writes ``nvml-rank-00003.json`` beside the
log at :meth:`close`; the report shows it per rank.

Lines are buffered and flushed every ``flush_every`` steps; the file is created exclusively
(an existing log is never overwritten); a truncated last line after a crash is skipped by
the reader and reported.
"""
from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

# torch is imported by StepLog (a job's own loop); reading a log (`hwlab ranks`) needs no torch
from hwlab.core.capture import rank_env
from hwlab.errors import UserInputError
from hwlab.core.store import UserJSONError, check_input_file, loads_user_json
from hwlab.core.validate import MAX_COUNT, MAX_RANKS, MAX_T_MS, NumberError, number

#: a step log is read line by line, so it may be far larger than a record; past this it is
#: not a step log (a disk image, a device)
MAX_STEP_LOG_BYTES = 4 * 2**30

SCHEMA = "hwlab.steplog"
SCHEMA_VERSION = 1


def log_path(run_dir: str | os.PathLike, rank: int, host: str | None = None) -> Path:
    return Path(run_dir) / (host or socket.gethostname()) / f"steps-rank-{rank:05d}.jsonl"


class StepLog:
    """Records step start/end and collective time for one rank (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike, *, rank: int | None = None, n_flops: int = 0,
                 n_bytes: int = 0, cuda_events: bool = False, flush_every: int = 20,
                 nvml_sample_s: float | None = None):
        import torch
        self.rank = rank_env()["rank"] if rank is None else rank
        self.path = log_path(run_dir, self.rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._f = open(self.path, "x", encoding="utf-8")  # exclusive: never overwrite a log
        except FileExistsError:
            raise UserInputError(f"{self.path} already exists: give each run its own run directory") from None
        cuda_events = bool(cuda_events and torch.cuda.is_available())
        self._torch = torch if cuda_events else None
        self._t0_perf, self._t0_unix = time.perf_counter(), time.time()
        self._flush_every = max(1, flush_every)
        self._buf: list[str] = []
        self._pending: list[tuple[dict[str, Any], list[Any]]] = []
        self._cur: dict[str, Any] | None = None
        self._cur_events: list[Any] = []
        self._n = 0
        self._write({"kind": "header", "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "rank": self.rank,
                     "host": socket.gethostname(), "pid": os.getpid(), "t0_unix_s": self._t0_unix,
                     "clock": "host time.perf_counter, offset to Unix time at start",
                     "cuda_events": bool(cuda_events), "n_flops_per_step": int(n_flops),
                     "n_bytes_per_step": int(n_bytes)})
        self._f.flush()
        self._sampler = None
        if nvml_sample_s:  # opt-in: NVML only, no CUDA call (hwlab.core.nvml_sampler)
            from hwlab.core.nvml_sampler import NvmlSampler
            dev = [torch.cuda.current_device()] if torch.cuda.is_available() else None
            self._sampler = NvmlSampler(interval_s=nvml_sample_s, devices=dev).start()

    def _now(self) -> float:
        return self._t0_unix + (time.perf_counter() - self._t0_perf)

    def _event(self):
        e = self._torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    @contextmanager
    def step(self, step: int | None = None) -> Iterator[None]:
        """Time one step of the loop (host clock; CUDA events too if asked)."""
        if self._cur is not None:
            raise RuntimeError("steps do not nest: close the previous `with log.step()` first")
        self._cur = {"step": self._n if step is None else int(step), "colls": []}
        self._cur_events = [self._event()] if self._torch else []
        t = time.perf_counter()
        self._cur["t_start_s"] = self._now()
        try:
            yield
        finally:
            self._cur["step_ms"] = (time.perf_counter() - t) * 1e3
            if self._torch:
                self._cur_events.append(self._event())
                self._pending.append((self._cur, self._cur_events))
                self._drain()
            else:
                self._emit(self._cur)
            self._cur, self._n = None, self._n + 1

    @contextmanager
    def collective(self, name: str = "collective") -> Iterator[None]:
        """Time spent in a collective (or any wait) inside the current step."""
        if self._cur is None:
            raise RuntimeError("log.collective() goes inside `with log.step()`")
        ev = [self._event()] if self._torch else []
        t = time.perf_counter()
        try:
            yield
        finally:
            self._cur["colls"].append([name, (time.perf_counter() - t) * 1e3])
            if self._torch:
                ev.append(self._event())
                self._cur_events.extend(ev)

    def _drain(self, wait: bool = False) -> None:
        """Resolve steps whose last event has completed; never waits unless ``wait``."""
        while self._pending:
            rec, ev = self._pending[0]
            if wait:
                ev[-1].synchronize()
            elif not ev[-1].query():
                return
            self._pending.pop(0)
            rec["gpu_step_ms"] = ev[0].elapsed_time(ev[-1])
            rec["gpu_colls"] = [[name, ev[1 + 2 * i].elapsed_time(ev[2 + 2 * i])]
                                for i, (name, _) in enumerate(rec["colls"])]
            self._emit(rec)

    def _emit(self, rec: dict[str, Any]) -> None:
        self._write(rec)
        if len(self._buf) >= self._flush_every:
            self.flush()

    def _write(self, rec: dict[str, Any]) -> None:
        self._buf.append(json.dumps(rec, allow_nan=False) + "\n")

    def flush(self) -> None:
        self._f.write("".join(self._buf))
        self._f.flush()
        self._buf.clear()

    def close(self) -> None:
        """Resolve the remaining CUDA events (the one wait), write everything, close the file."""
        if self._f.closed:
            return
        self._drain(wait=True)
        self.flush()
        self._f.close()
        if self._sampler is not None:
            from hwlab.core.store import write_json_atomic
            res = self._sampler.stop()
            write_json_atomic(self.path.with_name(f"nvml-rank-{self.rank:05d}.json"), {"rank": self.rank, **res},
                              overwrite=True)

    def __enter__(self) -> "StepLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_log(path: str | os.PathLike) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    """(header, step records, problems): malformed lines are reported and skipped."""
    header, steps, problems = None, [], []
    try:  # a FIFO or a device named like a step log is refused unopened (it would block / never end)
        check_input_file(path, "step log", "remove it from the run directory", max_bytes=MAX_STEP_LOG_BYTES)
    except UserInputError as e:
        return None, [], [str(e)]
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = loads_user_json(line)
            except UserJSONError as e:
                problems.append(f"{path}:{i}: {e}, skipped")
                continue
            if not isinstance(d, dict):
                problems.append(f"{path}:{i}: not a step record, skipped")
            elif d.get("kind") == "header":
                why = header_problem(d)
                if why:
                    problems.append(f"{path}:{i}: header {why}, skipped")
                else:
                    header = d
            elif isinstance(d.get("step_ms"), (int, float)) and isinstance(d.get("colls"), list):
                why = step_problem(d)
                if why:
                    problems.append(f"{path}:{i}: {why}, skipped")
                else:
                    steps.append(d)
            else:
                problems.append(f"{path}:{i}: not a step record, skipped")
    if header is None:
        problems.append(f"{path}: no header line (not written by hwlab.core.steplog?)")
    return header, steps, problems


def header_problem(d: dict[str, Any]) -> str | None:
    """Why header ``d`` cannot be used, or None: ``rank`` a whole number 0..MAX_RANKS-1, the
    step's declared work (``n_flops_per_step``, ``n_bytes_per_step``) whole numbers >= 0 that a
    counter holds (null: not declared)."""
    try:
        number(d.get("rank"), "rank", lo=0.0, hi=MAX_RANKS - 1, whole=True)
        for k in ("n_flops_per_step", "n_bytes_per_step"):
            if d.get(k) is not None:
                number(d[k], k, lo=0.0, hi=MAX_COUNT, whole=True)
    except NumberError as e:
        return str(e)
    return None


def step_problem(d: dict[str, Any]) -> str | None:
    """Why step record ``d`` cannot be used, or None. A step's times (``step_ms``,
    ``gpu_step_ms``) are finite, > 0 and at most :data:`MAX_T_MS` (a zero or negative
    length is no measurement, and NaN would poison every median); each collective is a
    ``[name, ms]`` pair with a finite time >= 0; ``t_start_s`` is finite. The writer
    (:class:`StepLog`) never writes NaN (``allow_nan=False``), so such a line is corrupt."""
    try:
        for k in ("step_ms", "gpu_step_ms"):
            if k in d:
                number(d[k], k, lo=0.0, lo_open=True, hi=MAX_T_MS)
        if "gpu_step_ms" in d and "gpu_colls" not in d:
            return "gpu_step_ms without gpu_colls"
        if "t_start_s" in d:
            number(d["t_start_s"], "t_start_s")
        for k in ("colls", "gpu_colls"):
            if k in d and not isinstance(d[k], list):
                return f"{k} is not a list"
            for c in d.get(k, []):
                if not (isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)):
                    return f"{k} entry {str(c)[:40]} is not a [name, ms] pair"
                number(c[1], f"{k} {c[0][:40]!r}", lo=0.0, hi=MAX_T_MS)
    except NumberError as e:
        return str(e)
    return None
