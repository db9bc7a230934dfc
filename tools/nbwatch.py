"""Execute one notebook headlessly: the one way the tests, the executed copies and the nbgrader
course drive a kernel, with a watchdog on every cell.

    from nbwatch import execute_notebook
    nb = execute_notebook(path, cwd=path.parent, env={"HWLAB_CHECKPOINT_ANSWERS": "..."})

``cwd`` is the folder the kernel starts in (a learner's working copy, not the checkout, when the
test is about the learner); ``env`` adds variables to the kernel's environment only (the caller's
``os.environ`` is left as it was), ``drop_env`` removes some; ``kernel_name`` is a kernelspec name the running Python's
Jupyter sees. ``cell_timeout_s`` bounds one busy cell.

The watchdog: a cell is *stalled* when the client has received no message for ``idle_limit_s``
(default 60 s) while the kernel and its child processes together used under
:data:`IDLE_CPU_FRACTION` of one core. A computing cell burns CPU and a cell waiting on a
subprocess burns the child's, so neither is flagged however long it runs; a cell that prints
keeps messages coming. Only a cell that waits silently on nothing measurable for a minute
looks like a stall: give such a wait a progress line. On a stall the watchdog writes both
processes' stacks and the cell's message log to ``test-artifacts/nbwatch/`` and raises
:class:`KernelStall` (``on_stall="fail"``) or executes the notebook once more in a fresh kernel
(``on_stall="retry"``, the default), recording the stall in ``nb.metadata["hwlab_nbwatch"]``.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from queue import Empty
from typing import Mapping

import nbformat
import psutil
from nbclient import NotebookClient

import nbwatch_dump as dump

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "nbwatch"
#: a kernel (with its children) using less than this share of one core is idle: an idle ipykernel
#: wakes for its heartbeat and flush timers only, while a cell that computes, even one given a
#: few percent of a core on a machine loaded many times over, stays above it
IDLE_CPU_FRACTION = 0.01
#: how often the watchdog looks (s)
TICK_S = 1.0
#: the longest single wait on a channel socket (s); a longer wait is a series of these
POLL_SLICE_S = 1.0


class KernelStall(RuntimeError):
    """No message and no kernel CPU for ``idle_limit_s`` during a cell; ``report`` is the dump."""

    def __init__(self, msg: str, record: dict):
        super().__init__(msg)
        self.record = record


def kernel_cpu_s(pid: int) -> float:
    """CPU seconds used by the kernel, its reaped children and its live descendants."""
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for c in p.children(recursive=True):
            try:
                ct = c.cpu_times()
                total += ct.user + ct.system
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return float("nan")


def sliced_get_msg(get_msg, slice_s: float = POLL_SLICE_S):
    """``get_msg(timeout)`` of an async channel, waiting in polls of at most ``slice_s``: each poll
    that times out checks the socket itself, so a message whose wake-up was lost is read within
    a slice, not at the end of the whole wait."""
    async def sliced(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                return await get_msg(timeout=slice_s if left is None else max(0.0, min(slice_s, left)))
            except Empty:
                if left is not None and left <= slice_s:
                    raise
    return sliced


class WatchedClient(NotebookClient):
    """A :class:`NotebookClient` that logs every message it receives and watches each cell."""

    def __init__(self, nb, *, idle_limit_s: float, report_dir: Path, label: str,
                 poll_slice_s: float | None = POLL_SLICE_S, **kw):
        super().__init__(nb, **kw)
        self.idle_limit_s = idle_limit_s
        self.poll_slice_s = poll_slice_s
        self.report_dir = report_dir
        self.label = label
        self.msg_log: list[tuple[float, str, str, str | None, str | None]] = []
        self.last_msg_t = time.monotonic()
        self.kernel_dump_path = report_dir / f"{label}.kernel-{os.getpid()}-{id(self)}.txt"
        #: the longest stretch without a message in each cell: (cell index, s, kernel CPU s in it)
        self.longest_quiet: tuple[int, float, float] = (-1, 0.0, 0.0)
        self._cell_index = -1

    # ------------------------------------------------------------------ message log
    def _log(self, channel: str, msg: dict) -> None:
        self.last_msg_t = time.monotonic()
        content = msg.get("content", {})
        self.msg_log.append((self.last_msg_t, channel, msg.get("msg_type") or msg["header"]["msg_type"],
                             (msg.get("parent_header") or {}).get("msg_id"),
                             content.get("execution_state") or content.get("status")))

    def _wrap_channel(self, name: str) -> None:
        """Log every message the channel delivers; with ``poll_slice_s``, wait in slices.

        Why slices: nbclient mirrors an ``ipywidgets.Output`` and, for every output the widget
        captures, sends the widget's state back on the shell channel while another task waits
        on that channel for the execute_reply. jupyter_client sends through a blocking shadow of
        the asyncio socket; the send processes the socket's pending commands and so consumes
        the wake-up of a reply that has just arrived. The reply then sits in the client's socket
        while both sides idle, until the wait's timeout (the cell timeout) polls it once more.
        A wait made of short polls re-checks the socket every slice instead."""
        ch = getattr(self.kc, f"{name}_channel")
        inner = ch.get_msg if self.poll_slice_s is None else sliced_get_msg(ch.get_msg, self.poll_slice_s)

        async def get_msg(timeout=None):
            msg = await inner(timeout=timeout)
            self._log(name, msg)
            return msg
        ch.get_msg = get_msg

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        self._wrap_channel("shell")
        self._wrap_channel("iopub")
        self.report_dir.mkdir(parents=True, exist_ok=True)
        # the kernel's dump hooks: a silent request, answered before the first cell
        reply = await self.async_wait_for_reply(
            kc.execute(dump.kernel_setup_code(self.kernel_dump_path), silent=True, store_history=False))
        if (reply or {}).get("content", {}).get("status") != "ok":
            raise RuntimeError(f"nbwatch: the kernel refused the dump hooks: {reply}")
        inner_execute = kc.execute

        def execute(*a, **kw):  # remember each request's msg_id for the report
            self._last_request = inner_execute(*a, **kw)
            return self._last_request
        kc.execute = execute
        return kc

    @property
    def kernel_pid(self) -> int | None:
        prov = getattr(self.km, "provisioner", None)
        proc = getattr(prov, "process", None)
        return getattr(proc, "pid", None)

    # ------------------------------------------------------------------ the watchdog
    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if cell.cell_type != "code" or not cell.source.strip():
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        self.last_msg_t = t_start = time.monotonic()
        self._cell_index = cell_index
        n_log = len(self.msg_log)
        run = asyncio.ensure_future(super().async_execute_cell(cell, cell_index, execution_count, store_history))
        watch = asyncio.ensure_future(self._watch(run))
        try:
            await asyncio.wait([run, watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if run.done():
            return run.result()
        record = await self._report(cell_index, t_start, n_log)
        run.cancel()
        try:
            await run
        except BaseException:  # noqa: BLE001  (the cancelled cell: nbclient says "Kernel died")
            pass
        raise KernelStall(f"{self.label}: cell {cell_index} stalled: no message and an idle kernel for "
                          f"{self.idle_limit_s:.0f} s; stacks and message log in {record['report']}", record)

    async def _watch(self, run: asyncio.Future) -> None:
        """Return when the cell is stalled: no message for ``idle_limit_s`` and, over the last
        ``idle_limit_s``, the kernel idle (so a cell that computed silently and then hung is
        caught one limit after it stopped computing, not in proportion to how long it computed)."""
        pid = self.kernel_pid
        if pid is None:
            return await asyncio.Future()  # no local kernel process to watch: nbclient's timeout only
        quiet_since = self.last_msg_t
        samples = [(time.monotonic(), kernel_cpu_s(pid))]  # (t, kernel CPU s) since the quiet stretch began
        while not run.done():
            await asyncio.sleep(TICK_S)
            now, cpu = time.monotonic(), kernel_cpu_s(pid)
            if self.last_msg_t != quiet_since:  # a message came: the quiet stretch starts again
                quiet_since, samples = self.last_msg_t, [(now, cpu)]
                continue
            samples.append((now, cpu))
            while len(samples) > 2 and samples[1][0] <= now - self.idle_limit_s:
                samples.pop(0)  # keep one sample at or before the window's start
            quiet_s = now - quiet_since
            window_s, window_cpu_s = now - samples[0][0], cpu - samples[0][1]
            if quiet_s > self.longest_quiet[1]:
                self.longest_quiet = (self._cell_index, round(quiet_s, 1), round(window_cpu_s, 2))
            if quiet_s >= self.idle_limit_s and window_cpu_s < IDLE_CPU_FRACTION * window_s:
                self._quiet = (quiet_s, window_cpu_s)
                return

    async def _report(self, cell_index: int, t_start: float, n_log: int) -> dict:
        pid = self.kernel_pid
        quiet_s, cpu_s = self._quiet
        head = {"notebook": self.label, "cell_index": cell_index, "quiet_s": round(quiet_s, 1),
                "kernel_cpu_s_last_window": round(cpu_s, 3), "kernel_pid": pid,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        cell_log = self.msg_log[n_log:]
        head["request_msg_id"] = self._last_request
        mine = [m for m in cell_log if m[3] == self._last_request]
        head["execute_reply_received"] = any(m[1] == "shell" and m[2] == "execute_reply" for m in mine)
        head["status_busy_received"] = any(m[2] == "status" and m[4] == "busy" for m in mine)
        head["status_idle_received"] = any(m[2] == "status" and m[4] == "idle" for m in mine)
        head["client_sockets"] = dump.client_sockets(self.kc)
        stacks = dump.client_stacks()
        kernel_dump = ""
        if pid is not None:
            head["kernel_threads"] = dump.proc_threads(pid)
            ports = {v for k, v in (self.km.get_connection_info() or {}).items() if k.endswith("_port")}
            head["tcp_queues"] = dump.tcp_queues(ports)
            before = self.kernel_dump_path.stat().st_size if self.kernel_dump_path.exists() else 0
            for sig in (signal.SIGUSR1, signal.SIGUSR2):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
                await asyncio.sleep(1.0)
            if self.kernel_dump_path.exists():
                with open(self.kernel_dump_path) as f:
                    f.seek(before)
                    kernel_dump = f.read()
        log_lines = [f"{t - t_start:8.2f} {ch:5s} {typ:20s} parent={par} {state or ''}"
                     for t, ch, typ, par, state in cell_log]
        path = self.report_dir / f"{self.label}.cell{cell_index}.{time.strftime('%H%M%S')}.stall.txt"
        dump.write_report(path, head, log_lines, kernel_dump, stacks)
        head["report"] = str(path)
        return {k: head[k] for k in ("notebook", "cell_index", "quiet_s", "kernel_cpu_s_last_window",
                                     "request_msg_id", "execute_reply_received", "status_idle_received",
                                     "report", "at")}

    _last_request: str | None = None


def _client(nb, label, cwd, kernel_name, cell_timeout_s, idle_limit_s, report_dir, poll_slice_s) -> WatchedClient:
    c = WatchedClient(nb, idle_limit_s=idle_limit_s, report_dir=report_dir, label=label, poll_slice_s=poll_slice_s,
                      timeout=cell_timeout_s, kernel_name=kernel_name,
                      resources={"metadata": {"path": str(cwd)}})
    return c


def execute_notebook(nb_or_path, *, cwd: Path, env: Mapping[str, str] | None = None,
                     drop_env: tuple[str, ...] = (), kernel_name: str = "python3",
                     cell_timeout_s: int = 300, idle_limit_s: float = 60.0, on_stall: str = "retry",
                     report_dir: Path = ARTIFACTS, label: str | None = None,
                     poll_slice_s: float | None = POLL_SLICE_S) -> nbformat.NotebookNode:
    """Execute a notebook (a path or a ``NotebookNode``, executed in place) and return it.

    ``idle_limit_s`` and ``on_stall`` ("retry" once in a fresh kernel, or "fail") are the
    watchdog's (module docstring); ``nb.metadata["hwlab_nbwatch"]["stalls"]`` lists each stall.
    ``poll_slice_s`` bounds one wait on a channel (:meth:`WatchedClient._wrap_channel` says why);
    ``None`` waits as nbclient does, which can lose a reply until the cell timeout."""
    if on_stall not in ("retry", "fail"):
        raise ValueError(f"on_stall must be 'retry' or 'fail', not {on_stall!r}")
    nb = nbformat.read(nb_or_path, as_version=4) if isinstance(nb_or_path, (str, Path)) else nb_or_path
    if label is None:
        label = (f"{Path(nb_or_path).parent.name}__{Path(nb_or_path).stem}"
                 if isinstance(nb_or_path, (str, Path)) else "notebook")
    kernel_env = {k: v for k, v in os.environ.items() if k not in drop_env}
    kernel_env.update(env or {})
    stalls: list[dict] = []
    for attempt in (1, 2):
        client = _client(nb, label, cwd, kernel_name, cell_timeout_s, idle_limit_s, Path(report_dir), poll_slice_s)
        try:
            client.execute(env=kernel_env, cwd=str(cwd))  # keyword arguments reach the kernel manager's start
            break
        except KernelStall as e:
            stalls.append(e.record)
            if on_stall == "fail" or attempt == 2:
                nb.metadata["hwlab_nbwatch"] = {"stalls": stalls, "retried": attempt == 2}
                raise
    nb.metadata["hwlab_nbwatch"] = {"stalls": stalls, "retried": bool(stalls)}
    if client.longest_quiet[0] >= 0:
        c, q, cpu = client.longest_quiet
        nb.metadata["hwlab_nbwatch"]["longest_quiet"] = {"cell_index": c, "s": q, "kernel_cpu_s": cpu}
    return nb
