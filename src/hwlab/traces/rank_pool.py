"""Per-rank traces read in parallel: each rank's file is reduced to its summary
(:mod:`hwlab.traces.rank_summary`) in a worker, and only summaries come back.

* **On one node** (``workers`` > 1) a :class:`concurrent.futures.ProcessPoolExecutor` of that many
  processes (``spawn``: a worker never inherits the parent's threads or memory, and its CPU time
  and peak memory are its parent's to account for). At most
  :data:`IN_FLIGHT_PER_WORKER` files per worker are submitted at a time, so a worker that dies
  takes only the files it held with it. A worker reads one file at a time, streaming: its memory
  is bounded by the largest rank's kept events, not by the job.
* **Across nodes** (``scheduler``: a Dask distributed scheduler's address) the same reduction is
  submitted to that cluster with ``distributed.Client.map``; the files are read where they lie
  (a file system every worker mounts) and summaries come back. Dask is an optional extra
  (``pip install 'hwlab[dist]'``), imported only here and only when a scheduler is named. A Slurm
  site starts the cluster with dask-jobqueue (``SLURMCluster(...).scale(jobs=N)``) and passes its
  ``scheduler_address``. No scheduler or socket of the kit's own.
* **Identical output.** Summaries are put back in file order before anything is merged, so the
  report does not depend on which worker finished first or how many there were.
* **Failure at scale.** A file that is not a readable trace (truncated, malformed, gone, not a
  regular file) or larger than ``max_bytes`` is named and left out; a worker that raises or dies
  is retried once, alone (one worker, one file, so a file that kills its worker cannot take
  another file's retry with it), then named and left out; on Dask a task that raises is retried
  once, and a worker that dies is handled by the scheduler's own ``allowed-failures`` rule before
  the file is named. The other ranks are read either way; a rank left out makes the job's answer
  undecided (:mod:`hwlab.diagnosis.ranks_traces`, exit 4).
* **Progress**: ranks and bytes done, with an estimate of the time left from the bytes per
  second so far (:func:`progress_printer`).
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterator

from hwlab.errors import UserInputError
from hwlab.traces import rank_summary

IN_FLIGHT_PER_WORKER = 2  # files queued per worker: one being read, one ready (the pipe never idles)
RETRIES = 1               # a worker that raises or dies: its file is read once more, alone, then named
PROGRESS_EVERY_S = 2.0    # a progress line at most this often
#: with no worker count given, one worker per this many bytes of trace files (at most one per core):
#: starting a worker process costs about as much as reading a few MB of trace, so a small job is
#: read in this process
AUTO_BYTES_PER_WORKER = 4 << 20

Outcome = tuple[str, Any]  # ("ok", ReducedTrace) | ("bad", why) | ("failed", why)


def default_workers() -> int:
    """The cores this process may use (its CPU affinity), the default of ``--workers``."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def reduce_one(path: str, max_bytes: int | None = None) -> Outcome:
    """A worker's job: ("ok", summary) or ("bad", why) for a file that cannot be read as a trace or
    is over ``max_bytes`` (the same answer on every try, so not retried). Anything else raises."""
    try:
        n_bytes = os.stat(path).st_size
    except OSError as e:
        return "bad", f"{path}: cannot be read ({e.strerror}): the file is gone or not readable"
    if max_bytes is not None and n_bytes > max_bytes:
        return "bad", (f"{path}: {n_bytes / 1e9:.3g} GB, over the {max_bytes / 1e9:.3g} GB limit per rank: left out "
                       "(raise the limit, or profile fewer steps)")
    try:
        return "ok", rank_summary.read_reduced(path)
    except UserInputError as e:  # TraceError and a path that is not a regular file
        return "bad", str(e)


def _why(e: BaseException) -> str:
    if isinstance(e, BrokenProcessPool):
        return "its worker process died (killed, out of memory, or crashed)"
    return f"the worker raised {type(e).__name__}: {e}"


def _local(files: list[str], reduce: Callable, max_bytes: int | None) -> Iterator[tuple[int, Outcome]]:
    for i, f in enumerate(files):
        out = None
        for attempt in range(RETRIES + 1):
            try:
                out = reduce(f, max_bytes)
                break
            except Exception as e:  # noqa: BLE001 -- any failure of one rank is named, the others read
                out = ("failed", f"{f}: {_why(e)} (tried {attempt + 1} times), left out")
        yield i, out


def _pool_pass(files: list[str], todo: list[int], workers: int, window: int, reduce: Callable,
               max_bytes: int | None) -> Iterator[tuple[int, Outcome | BaseException]]:
    """One pass over ``todo`` with ``workers`` processes and ``window`` files in flight; a pool that
    breaks is replaced, the files it held come back as their exception."""
    ctx = get_context("spawn")
    queue = list(reversed(todo))
    while queue:
        ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
        try:
            flying: dict[Any, int] = {}
            broken = False
            while (queue or flying) and not broken:
                while queue and len(flying) < window:
                    i = queue.pop()
                    flying[ex.submit(reduce, files[i], max_bytes)] = i
                done, _ = wait(list(flying), return_when=FIRST_COMPLETED)
                for fut in done:
                    i = flying.pop(fut)
                    e = fut.exception()
                    broken = broken or isinstance(e, BrokenProcessPool)
                    yield i, (e if e is not None else fut.result())
            if broken:  # the pool is gone: what it still held failed with it
                for fut, i in flying.items():
                    yield i, BrokenProcessPool("pool broken")
        finally:
            ex.shutdown(wait=True, cancel_futures=True)


def _pool(files: list[str], workers: int, reduce: Callable, max_bytes: int | None
          ) -> Iterator[tuple[int, Outcome]]:
    retry: list[tuple[int, BaseException]] = []
    for i, out in _pool_pass(files, list(range(len(files))), workers, workers * IN_FLIGHT_PER_WORKER, reduce,
                             max_bytes):
        if isinstance(out, BaseException):
            retry.append((i, out))
        else:
            yield i, out
    for i, first in retry:  # alone: one worker, one file in flight
        for _, out in _pool_pass(files, [i], 1, 1, reduce, max_bytes):
            if isinstance(out, BaseException):
                out = ("failed", f"{files[i]}: {_why(out)} (tried {RETRIES + 1} times; first: {_why(first)}), "
                                 "left out")
            yield i, out


def _dask(files: list[str], scheduler: str, reduce: Callable, max_bytes: int | None
          ) -> Iterator[tuple[int, Outcome]]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise UserInputError("--scheduler needs Dask distributed: pip install 'hwlab[dist]' (here and on the "
                             "cluster's workers)") from None
    try:
        client = Client(scheduler, timeout="10s")
    except (OSError, TimeoutError, ValueError) as e:
        raise UserInputError(f"cannot reach the Dask scheduler at {scheduler} ({type(e).__name__}: {e}): pass the "
                             "address a running scheduler prints (tcp://HOST:8786)") from None
    try:
        futs = client.map(reduce, files, max_bytes=max_bytes, pure=False, retries=RETRIES)
        index = {f.key: i for i, f in enumerate(futs)}
        for fut in as_completed(futs):
            i = index[fut.key]
            try:
                out = fut.result()
            except Exception as e:  # noqa: BLE001 -- named, the others read
                out = ("failed", f"{files[i]}: {_why(e)} (tried {RETRIES + 1} times), left out")
            fut.release()
            yield i, out
    finally:
        client.close()


def reduce_all(files: list[str | Path], *, workers: int | None = 1, scheduler: str | None = None,
               max_bytes: int | None = None, progress: Callable[..., None] | None = None,
               reduce: Callable[[str, int | None], Outcome] = reduce_one) -> list[Outcome]:
    """Every file's outcome, in file order (module doc). ``progress(ranks_done, n_ranks, bytes_done,
    n_bytes, elapsed_s)`` after each file. ``workers=None``: one per :data:`AUTO_BYTES_PER_WORKER`
    of files, at most :func:`default_workers`.

    With more than one worker the workers are started by ``spawn``, which imports the caller's
    main module again: a script that calls this needs the ``if __name__ == "__main__":`` guard
    (the ``hwlab`` command has it)."""
    if workers is not None and workers < 1:
        raise UserInputError("--workers must be 1 or more")
    names = [str(f) for f in files]
    sizes = []
    for f in names:
        try:
            sizes.append(os.stat(f).st_size)
        except OSError:
            sizes.append(0)
    total, done_bytes, t0 = sum(sizes), 0, time.monotonic()
    if workers is None:
        workers = max(1, min(default_workers(), total // AUTO_BYTES_PER_WORKER))
    if scheduler:
        it = _dask(names, scheduler, reduce, max_bytes)
    elif min(workers, len(names)) > 1:
        it = _pool(names, min(workers, len(names)), reduce, max_bytes)
    else:
        it = _local(names, reduce, max_bytes)
    outs: list[Outcome | None] = [None] * len(names)
    for n, (i, out) in enumerate(it, 1):
        outs[i] = out
        done_bytes += sizes[i]
        if progress:
            progress(n, len(names), done_bytes, total, time.monotonic() - t0)
    return outs  # type: ignore[return-value]


def read_all_reduced(files: list[Path], progress, problems: list[str], unreadable: list[dict[str, str]],
                     notes: list[str], *, workers: int | None = 1, scheduler: str | None = None,
                     max_bytes: int | None = None) -> list[rank_summary.ReducedTrace]:
    """:func:`hwlab.traces.rank_reading.read_all` over summaries read by :func:`reduce_all`: each
    file once, in file order; one trace given twice (same fingerprint) read once, said; a file
    that is bad, too large or whose worker failed named in ``problems`` and ``unreadable``."""
    read: list[rank_summary.ReducedTrace] = []
    seen: dict[tuple, str] = {}
    for f, (kind, v) in zip(files, reduce_all(files, workers=workers, scheduler=scheduler, max_bytes=max_bytes,
                                              progress=progress)):
        if kind != "ok":
            problems.append(v)
            unreadable.append({"file": str(f), "why": v})
            continue
        t = v
        if t.fingerprint in seen:
            notes.append(f"{Path(t.path).name} is the same trace as {Path(seen[t.fingerprint]).name} (same process, "
                         "events and times): read once")
            continue
        seen[t.fingerprint] = t.path
        if t.n_bad_times:
            notes.append(f"{Path(t.path).name}: {t.n_bad_times} event(s) with a NaN, infinite or negative time "
                         "left out")
        read.append(t)
    return read


def progress_printer(stream=sys.stderr) -> Callable[..., None]:
    """A progress line at most every :data:`PROGRESS_EVERY_S` and at the end: ranks and bytes done,
    and the time left estimated from the bytes per second so far (an estimate: ranks differ)."""
    last = [float("-inf")]

    def cb(n_done: int, n: int, bytes_done: int, n_bytes: int, elapsed_s: float) -> None:
        if n_done < n and elapsed_s - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = elapsed_s
        left = (f", about {_dur(elapsed_s * (n_bytes - bytes_done) / bytes_done)} left (estimate)"
                if 0 < bytes_done < n_bytes else "")
        print(f"hwlab ranks: read {n_done} of {n} ranks, {bytes_done / 1e6:,.0f} of {n_bytes / 1e6:,.0f} MB in "
              f"{_dur(elapsed_s)}{left}", file=stream)
    return cb


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"
