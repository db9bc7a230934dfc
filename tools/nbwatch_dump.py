"""What :mod:`nbwatch` writes when a notebook stalls: both processes' stacks, the kernel's
threads as the OS sees them, both sides' zmq socket state and the client's message log.

The kernel side comes from two signal handlers installed by a silent request at kernel start
(:data:`KERNEL_SETUP`): SIGUSR1 makes ``faulthandler`` write every thread's Python stack (in C,
so it answers even when the main thread is blocked in a system call), SIGUSR2 makes the main
thread write the kernel's own state (its shell stream's queued replies, the iopub thread's
pending events, the parent request). The client side is read in-process.
"""
from __future__ import annotations

import asyncio
import io
import json
import linecache
import sys
import threading
import traceback
from pathlib import Path

#: run silently in the kernel right after it starts (argument: the path the dumps go to);
#: everything lives in its own namespace, nothing is added to the learner's
KERNEL_SETUP = r'''
def _setup(dump_path):
    import faulthandler, json, signal, sys, threading
    out = open(dump_path, "a", buffering=1)
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)

    def state(signum, frame):
        d = {}
        try:
            import zmq
            from ipykernel.kernelapp import IPKernelApp
            k = IPKernelApp.instance().kernel
            st = k.shell_stream
            d["parent_msg_id"] = (k.get_parent("shell") or {}).get("header", {}).get("msg_id")
            d["execution_count"] = k.execution_count
            d["aborting"] = getattr(k, "_aborting", None)
            d["shell_send_queue"] = st._send_queue.qsize() if hasattr(st, "_send_queue") else None
            d["shell_recv_callback"] = st._recv_callback is not None
            d["shell_stream_state"] = getattr(st, "_state", None)
            d["msg_queue"] = k.msg_queue.qsize() if hasattr(k, "msg_queue") else None
            io_thread = k.iopub_thread
            d["iopub_thread_alive"] = io_thread.thread.is_alive()
            d["iopub_pending_events"] = len(io_thread._events)
            d["threads"] = [(t.name, t.daemon, t.is_alive()) for t in threading.enumerate()]
            # last: reading EVENTS may process the socket's pending commands
            d["shell_socket_events"] = st.socket.get(zmq.EVENTS)
        except Exception as e:  # a dump must never raise in the kernel
            d["error"] = repr(e)
        out.write("\n--- kernel state (SIGUSR2, main thread) ---\n" + json.dumps(d, default=str) + "\n")
        out.flush()

    signal.signal(signal.SIGUSR2, state)
    out.write("nbwatch: dump hooks installed in pid %d\n" % __import__("os").getpid())
    out.flush()
'''


def kernel_setup_code(dump_path: Path) -> str:
    src = KERNEL_SETUP + f"\n_setup({str(dump_path)!r})\n"
    return f"exec({src!r}, {{'__name__': 'nbwatch'}})"


def proc_threads(pid: int) -> list[dict]:
    """Each kernel thread as /proc shows it: name, state, kernel wait channel, current system call."""
    rows = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        row = {"tid": int(task.name)}
        for key, name in (("comm", "comm"), ("wchan", "wchan"), ("syscall", "syscall")):
            try:
                row[key] = (task / name).read_text().strip().split(" ")[0] if key == "syscall" \
                    else (task / name).read_text().strip()
            except OSError as e:
                row[key] = f"unreadable ({e.strerror})"
        try:
            row["state"] = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            row["state"] = "?"
        rows.append(row)
    return rows


def tcp_queues(ports: set[int]) -> list[str]:
    """Lines of /proc/net/tcp for the kernel's ports: tx_queue:rx_queue shows bytes in flight."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)
            if local in ports or remote in ports:
                out.append(f"local :{local} remote :{remote} state {f[3]} tx:rx queue {f[4]}")
    return out


def _frames_text(frames) -> str:
    """Frames as ``File ..., line ..., in ...`` lines, without traceback's caret anchors: those
    ``ast.parse`` source segments, and on Python 3.11 an AST parse from inside a dump can leave the
    interpreter's AST recursion counter off, so that a later ``ast.parse`` raises SystemError."""
    out = []
    for frame in frames:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno).strip()
        out.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n    {line}\n')
    return "".join(out)


def client_stacks() -> str:
    """Every client thread's Python stack and every pending asyncio task's stack."""
    buf = io.StringIO()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        buf.write(f"\nThread {names.get(ident, ident)}:\n")
        buf.write(_frames_text(f for f, _ in reversed(list(traceback.walk_stack(frame)))))
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:
        tasks = set()
    for task in tasks:
        buf.write(f"\nasyncio task {task.get_name()} ({task.get_coro()!r}):\n")
        buf.write(_frames_text(task.get_stack(limit=8)))
    return buf.getvalue()


def client_sockets(kc) -> dict:
    """Per channel: does the client's socket hold a message nobody has read (POLLIN), and is a
    reader waiting on it (pending recv/poll futures)."""
    import zmq
    out = {}
    for name in ("shell", "iopub", "control", "stdin"):
        ch = getattr(kc, f"_{name}_channel", None)
        sock = getattr(ch, "socket", None)
        if sock is None:
            continue
        try:
            out[name] = {"pollin_ready": bool(sock.get(zmq.EVENTS) & zmq.POLLIN),
                         "waiting_readers": len(getattr(sock, "_recv_futures", ())),
                         "io_state": getattr(sock, "_state", None)}
        except Exception as e:  # noqa: BLE001  (a closed socket: say so, keep dumping)
            out[name] = {"error": repr(e)}
    return out


def write_report(path: Path, head: dict, log_lines: list[str], kernel_dump: str, stacks: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("nbwatch stall report\n" + json.dumps(head, indent=2, default=str)
                   + "\n\n--- client message log for the cell (t from the request, s) ---\n"
                   + "\n".join(log_lines)
                   + "\n\n--- kernel dump (faulthandler SIGUSR1, then state SIGUSR2) ---\n" + kernel_dump
                   + "\n\n--- client stacks ---\n" + stacks + "\n")
    tmp.replace(path)
