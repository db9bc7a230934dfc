"""tools/nbwatch.py's watchdog, on real kernels: a withheld execute_reply is caught within the
idle limit and dumped; a cell that computes, waits on a busy child process or prints while it
sleeps, longer than the limit, is not flagged. And the kit's profiling keeps libkineto's
``USDT:`` lines out of a notebook's output."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat missing: pip install -e '.[dev,lab]'")
pytest.importorskip("nbclient", reason="nbclient missing: pip install -e '.[dev,lab]'")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from nbwatch import KernelStall, execute_notebook  # noqa: E402

#: short, so a test waits seconds, not a minute; the criterion is the same at 60 s
IDLE_LIMIT_S = 6.0

#: a cell whose own execute_reply the kernel never sends (a lost reply, as seen from the client);
#: with a marker path (``MARKER``) it withholds only the first time (the retry then runs clean)
WITHHOLD = textwrap.dedent('''\
    import os
    from ipykernel.kernelapp import IPKernelApp
    _k = IPKernelApp.instance().kernel
    _send = _k.session.send
    class _Nowhere:
        def send_multipart(self, *a, **kw):
            pass
    def _withhold_next_reply(stream, msg_or_type, *a, **kw):
        t = msg_or_type if isinstance(msg_or_type, str) else msg_or_type["header"]["msg_type"]
        if t == "execute_reply":
            _k.session.send = _send
            return _send(_Nowhere(), msg_or_type, *a, **kw)
        return _send(stream, msg_or_type, *a, **kw)
    if MARKER is None or not os.path.exists(MARKER):
        if MARKER is not None:
            open(MARKER, "w").close()
        _k.session.send = _withhold_next_reply
    print("this cell's reply is withheld")''')


def _nb(*sources: str):
    return nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(s) for s in sources],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


@pytest.mark.slow
def test_a_withheld_reply_is_caught_within_the_idle_limit_and_dumped(tmp_path):
    nb = _nb("print('first')", "MARKER = None\n" + WITHHOLD, "print('never reached')")
    with pytest.raises(KernelStall) as e:
        execute_notebook(nb, cwd=tmp_path, idle_limit_s=IDLE_LIMIT_S, on_stall="fail", report_dir=tmp_path)
    rec = e.value.record
    assert rec["cell_index"] == 1 and not rec["execute_reply_received"] and rec["status_idle_received"]
    assert IDLE_LIMIT_S <= rec["quiet_s"] < IDLE_LIMIT_S + 10  # ticks of 1 s, on a loaded machine
    report = Path(rec["report"]).read_text()
    assert rec["request_msg_id"] in report and '"execute_reply_received": false' in report
    # the kernel's own dumps: faulthandler's stacks (main thread in its event loop) and its state
    assert "kernel state (SIGUSR2, main thread)" in report and "selectors.py" in report
    assert '"parent_msg_id": "' + rec["request_msg_id"] in report
    assert nb.metadata["hwlab_nbwatch"] == {"stalls": [rec], "retried": False}
    assert nb.cells[2].get("outputs", []) == []


@pytest.mark.slow
def test_a_cell_that_computes_silently_then_blocks_is_caught_one_limit_after_it_stops_computing(tmp_path):
    busy_s = 1.5 * IDLE_LIMIT_S
    nb = _nb(f"import threading, time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < {busy_s}: pass\n"
             "threading.Event().wait()  # blocks for ever, silently")
    with pytest.raises(KernelStall) as e:
        execute_notebook(nb, cwd=tmp_path, idle_limit_s=IDLE_LIMIT_S, on_stall="fail", report_dir=tmp_path)
    rec = e.value.record
    assert rec["cell_index"] == 0 and not rec["execute_reply_received"] and not rec["status_idle_received"]
    assert busy_s + IDLE_LIMIT_S <= rec["quiet_s"] < busy_s + IDLE_LIMIT_S + 10
    assert "threading.py" in Path(rec["report"]).read_text()  # the kernel's stack: waiting in Event.wait


@pytest.mark.slow
def test_a_stall_is_retried_once_in_a_fresh_kernel_and_said_in_the_metadata(tmp_path):
    marker = tmp_path / "withheld_once"
    nb = _nb(f"MARKER = {str(marker)!r}\n" + WITHHOLD, "print('after the stalled cell')")
    execute_notebook(nb, cwd=tmp_path, idle_limit_s=IDLE_LIMIT_S, report_dir=tmp_path)
    meta = nb.metadata["hwlab_nbwatch"]
    assert meta["retried"] and len(meta["stalls"]) == 1 and meta["stalls"][0]["cell_index"] == 0
    assert nb.cells[1].outputs[0]["text"] == "after the stalled cell\n"


@pytest.mark.slow
def test_computing_waiting_on_a_busy_child_or_printing_while_asleep_is_not_a_stall(tmp_path):
    limit = IDLE_LIMIT_S
    nb = _nb(
        # computes silently for twice the limit
        f"import time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < {2 * limit}: pass\nprint('computed')",
        # waits silently on a child process that computes
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
        f"'import time\\nt0 = time.monotonic()\\nwhile time.monotonic() - t0 < {2 * limit}: pass'], check=True)\n"
        "print('child done')",
        # sleeps, printing a line every third of the limit
        f"for i in range(6):\n    print('tick', i, flush=True)\n    time.sleep({limit / 3})",
    )
    execute_notebook(nb, cwd=tmp_path, idle_limit_s=limit, on_stall="fail", report_dir=tmp_path)
    assert nb.metadata["hwlab_nbwatch"]["stalls"] == [] and not nb.metadata["hwlab_nbwatch"]["retried"]
    assert [c.outputs[0]["text"].split("\n")[0] for c in nb.cells] == ["computed", "child done", "tick 0"]
    assert not list(tmp_path.glob("*.stall.txt"))


def test_native_stderr_filter_drops_usdt_lines_and_passes_the_rest():
    code = ("import os, sys\nfrom hwlab.core.profiling import native_stderr_filtered\n"
            "with native_stderr_filtered():\n"
            "    os.write(2, b'USDT:2026 x.cpp:52] profiler_start\\n')\n"
            "    os.write(2, b'a native warning the reader needs\\n')\n"
            "os.write(2, b'USDT: after the block, untouched\\n')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["a native warning the reader needs", "USDT: after the block, untouched"]


@pytest.mark.slow
def test_the_kits_profiling_leaves_no_usdt_line_in_a_notebooks_output(tmp_path):
    nb = _nb(
        # control: torch.profiler itself, as this torch prints it (fd 2, forwarded by the kernel)
        "import hwlab  # before torch: on a CPU it sets up Triton's interpreter\n"
        "import torch\nfrom torch.profiler import ProfilerActivity, profile\n"
        "with profile(activities=[ProfilerActivity.CPU]):\n    torch.ones(4) @ torch.ones(4)\n"
        "import time; time.sleep(2)  # the kernel forwards fd 2 from a thread: let it land in this cell",
        # the kit: hwlab examine's profiler run
        "from hwlab.examine.torch_profile import profile_calls\n"
        "s = profile_calls(lambda a: a @ a, [[torch.randn(32, 32)]], {}, torch.device('cpu'), n_calls=2)\n"
        "print('profiled calls', s.n_calls)\ntime.sleep(2)",
        "print('a later cell')",
    )
    # without PYTEST_CURRENT_TEST the kernel forwards fd 1/2 into the cells as a learner's kernel
    # does (ipykernel leaves them alone inside pytest)
    execute_notebook(nb, cwd=tmp_path, env={"PYTHONPATH": str(ROOT / "src")}, drop_env=("PYTEST_CURRENT_TEST",),
                     report_dir=tmp_path)
    outs = ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells]
    if "USDT:" not in outs[0]:
        pytest.skip("this torch prints no USDT lines: nothing to keep out")
    assert "profiled calls 2" in outs[1] and "USDT:" not in outs[1] + outs[2]


@pytest.mark.slow
def test_a_send_on_the_shell_channel_loses_a_waiting_replys_wake_up_and_sliced_waits_still_read_it(tmp_path):
    """The stall's mechanism, made deterministic: a task waits on the shell channel, the reply
    arrives while the event loop is busy, then the client sends on the shell channel (what
    nbclient's Output-widget mirror does for every captured output). The stock wait never
    wakes; :func:`nbwatch.sliced_get_msg` reads the reply within a slice."""
    import asyncio
    import time

    from jupyter_client.manager import AsyncKernelManager
    from nbwatch import sliced_get_msg

    async def waits_out(sliced: bool) -> bool:
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            await asyncio.sleep(1)
            while await kc.shell_channel.msg_ready():  # wait_for_ready may leave a second reply behind
                await kc.shell_channel.get_msg(timeout=1)
            get = sliced_get_msg(kc.shell_channel.get_msg, 1.0) if sliced else kc.shell_channel.get_msg
            waiter = asyncio.ensure_future(get(timeout=None))
            for _ in range(5):
                await asyncio.sleep(0)  # the wait is registered with the event loop
            kc.kernel_info()
            time.sleep(3)  # the loop is busy: the reply arrives and signals the socket meanwhile
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": "nobody", "data": {}}))
            done, _ = await asyncio.wait([waiter], timeout=8)
            waiter.cancel()
            return bool(done) and waiter.result()["msg_type"] == "kernel_info_reply"
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    loop = asyncio.new_event_loop()
    try:
        stock_read_it = loop.run_until_complete(waits_out(sliced=False))
        sliced_read_it = loop.run_until_complete(waits_out(sliced=True))
    finally:
        loop.close()
    assert sliced_read_it
    if stock_read_it:
        pytest.skip("this jupyter_client/pyzmq keeps the wake-up: the stock wait read the reply too")
