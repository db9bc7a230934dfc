"""Speed and progress of ``examine`` (issue 63, item 6): the time-left estimate's arithmetic on
synthetic phase costs and clocks, the timing blocks' variance stop on synthetic samples, and the
command line's progress lines (held briefly, a heartbeat while the target imports, never swallowed
by the profiler's capture of file descriptor 2). No wall-clock speed is asserted here: the speed is
measured by ``tools/bench_examine.py`` and recorded under ``tools/results/examine/``."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from hwlab.examine import progress as pr
from hwlab.examine.progress import ESTIMATING, OVERRUN_SHARE, SUBSTEP, Progress
from hwlab.examine.timing_blocks import (MAX_BLOCK_CHUNKS, MAX_BLOCK_REP, MIN_BLOCK_REP, TARGET_MEDIAN_ERROR,
                                         block_size,
                                         median_error, rel_width, timed_blocks)

PHASES = ("checked", "ceilings", "timing", "accepted", "profiling", "counting", "walk")


class FakeClock:
    """(wall, CPU) seconds a test advances by hand; ``rate`` CPU seconds per wall second."""

    def __init__(self) -> None:
        self.wall, self.cpu = 100.0, 10.0

    def __call__(self) -> tuple[float, float]:
        return self.wall, self.cpu

    def run(self, wall_s: float, cpu_per_wall: float = 1.0) -> None:
        self.wall += wall_s
        self.cpu += wall_s * cpu_per_wall


def _progress(clock: FakeClock, device_type: str = "cpu", n_profiled: int = 5) -> tuple[Progress, list[str]]:
    seen: list[str] = []
    return Progress(seen.append, n_profiled, PHASES, device_type=device_type, clock=clock), seen


def _expected_cpu_s(p: Progress, c: float, from_phase: int) -> float:
    """The module doc's sums, written out: what is left from the start of ``from_phase`` (2..6)."""
    dev = p.device_type
    timing = p.timing_plan_calls(c) * c
    prof = p.n_profiled * c * pr.PROFILE_CALL_FACTOR[dev] + pr.PROFILE_FIXED_S[dev] + (
        pr.PROFILER_IMPORT_S if "torch._inductor" not in sys.modules else 0.0)
    costs = {2: timing, 3: 0.0, 4: prof,
             5: pr.COUNT_CALLS * c, 6: pr.WALK_S}
    return sum(v for k, v in costs.items() if k >= from_phase)


# ------------------------------------------------------------------ the estimate
def test_no_number_before_a_call_has_been_timed_nor_while_ceilings_are_measured():
    clock = FakeClock()
    p, seen = _progress(clock)
    p.step("checked")
    assert p.left_s() is None and seen == [f"checked ({ESTIMATING})"]
    p.probe(0.4, 0.4)
    p.measuring_ceilings = True
    p.step("ceilings")
    assert p.left_s() is None and seen[-1] == f"ceilings ({ESTIMATING})"
    assert ESTIMATING in p.line() and "~" not in p.line()
    p.measuring_ceilings = False
    p.step("timing")
    assert p.left_s() is not None and seen[-1].startswith("timing (~")


def test_left_is_the_phases_measured_costs_in_calls_and_shrinks_with_the_cpu_spent_in_a_phase():
    clock = FakeClock()
    p, _ = _progress(clock)
    c = 0.3
    p.probe(0.3, c)
    p.step("ceilings")
    assert p.left_s() == pytest.approx(_expected_cpu_s(p, c, 2))
    p.step("profiling")
    whole = _expected_cpu_s(p, c, 4)
    assert p.left_s() == pytest.approx(whole)
    prof_cost = whole - _expected_cpu_s(p, c, 5)
    clock.run(prof_cost / 2)  # half the profiling's CPU spent
    assert p.left_s() == pytest.approx(whole - prof_cost / 2)
    clock.run(prof_cost * 5)  # far past its estimate: some of it is still left, not none
    assert p.left_s() == pytest.approx(OVERRUN_SHARE * prof_cost + _expected_cpu_s(p, c, 5))


def test_the_timing_phase_counts_the_calls_it_says_it_has_left():
    clock = FakeClock()
    p, _ = _progress(clock)
    c = 0.2
    p.probe(0.2, c)
    p.step("timing")
    p.timing_left(12)  # the timing's own account, in calls
    after_timing = _expected_cpu_s(p, c, 3)
    assert p.left_s() == pytest.approx(12 * c + after_timing)
    clock.run(5 * c)  # five calls' CPU since it said so
    assert p.left_s() == pytest.approx(7 * c + after_timing)
    clock.run(50 * c)  # it overran: the timing part is spent, the rest stands
    assert p.left_s() == pytest.approx(after_timing)


def test_cpu_seconds_left_become_wall_seconds_at_the_slowdown_measured_now():
    clock = FakeClock()
    p, _ = _progress(clock)
    p.probe(0.3, 0.3)
    p.step("counting")
    for _ in range(30):  # a quiet host: one CPU second per wall second
        clock.run(0.25)
        p.sample()
    p.phase_cpu0 = clock.cpu  # the counting starts now (the warm-up of the window above is not it)
    quiet = p.left_s()
    assert p.slowdown() == pytest.approx(1.0)
    for _ in range(30):  # a neighbour arrives: half a CPU second per wall second, and no CPU spent
        clock.wall += 0.25  # in the phase is counted twice: only the CPU clock advances the work
        clock.cpu += 0.125
        p.sample()
        p.phase_cpu0 = clock.cpu
    assert p.slowdown() == pytest.approx(2.0)
    assert p.left_s() == pytest.approx(2 * quiet)
    for _ in range(30):  # several threads compute: faster than one CPU second per wall second
        clock.wall += 0.25
        clock.cpu += 0.5
        p.sample()
        p.phase_cpu0 = clock.cpu
    assert p.slowdown() == pytest.approx(0.5)


def test_a_run_of_synthetic_phases_is_estimated_within_thirty_percent_at_every_line():
    """A run whose phases cost what the module doc says, on a host whose load changes mid-run (the
    slowdown goes from 1 to 1.25 during the timing, which no estimate made before can know): every
    phase line and heartbeat is within 30%."""
    clock = FakeClock()
    p, seen = _progress(clock)
    c = 0.35
    lines: list[tuple[float, float | None]] = []  # (wall when said, estimate)

    def say(label: str) -> None:
        p.step(label)
        lines.append((clock.wall, p.left_s()))

    def spend(cpu_s: float, slowdown: float) -> None:  # in 0.25 s ticks, a heartbeat line every 3.5 s
        while cpu_s > 1e-9:
            d = min(cpu_s, 0.25 / slowdown)
            clock.run(d * slowdown, 1 / slowdown)
            cpu_s -= d
            p.sample()
            if clock.wall - lines[-1][0] >= pr.HEARTBEAT_S:
                lines.append((clock.wall, p.left_s()))

    say("checked")
    spend(2 * c, 1.0)
    p.probe(c, c)
    say("ceilings")
    spend(0.05, 1.0)
    say("timing")
    n_calls = p.timing_plan_calls(c)
    for k in range(int(n_calls)):
        slow = 1.0 if k < n_calls / 2 else 1.25
        spend(c, slow)
        p.timed(c * slow * 1e3)
        p.timing_left(n_calls - k - 1)
    slow = 1.25
    prof = _expected_cpu_s(p, c, 4) - _expected_cpu_s(p, c, 5)
    for label, cost in (("accepted", 0.0), ("profiling", prof), ("counting", pr.COUNT_CALLS * c), ("walk", pr.WALK_S)):
        say(label)
        spend(cost, slow)
    end = clock.wall
    judged = [(t, est) for t, est in lines if est is not None and end - t > 0.5]
    assert len(judged) >= 8
    for t, est in judged:
        assert abs(est / (end - t) - 1) <= 0.30, (t - lines[0][0], est, end - t)
    assert seen[0] == f"checked ({ESTIMATING})"


def test_a_gpu_timing_plan_adds_the_protocols_warm_up_and_sustained_run_once():
    from hwlab.core.measure import GPU_MIN_RUN_S, GPU_WARMUP_S

    clock = FakeClock()
    p, _ = _progress(clock, device_type="cuda", n_profiled=3)
    c = 0.05
    p.probe(c, c)
    p.step("timing")
    floor = p.timing_plan_calls(c) * c + GPU_WARMUP_S + GPU_MIN_RUN_S * (1 + 2 / 3)
    assert p.left_s() == pytest.approx(floor + _expected_cpu_s(p, c, 3))


# ------------------------------------------------------------------ the variance stop
def test_block_size_grows_with_the_spread_between_a_floor_and_a_cap():
    assert block_size([10.0, 10.05, 9.98, 10.02, 10.01]) == MIN_BLOCK_REP
    assert block_size([10.0, 14.0, 8.0, 12.0, 9.0]) == MAX_BLOCK_REP
    mid = [10.0, 10.4, 10.8, 10.2, 10.6]
    w = rel_width(mid)
    assert block_size(mid) == max(MIN_BLOCK_REP, min(MAX_BLOCK_REP, -int(-(w / TARGET_MEDIAN_ERROR) ** 2 // 1)))
    assert median_error(w, block_size(mid)) <= TARGET_MEDIAN_ERROR  # the size it asks for settles it
    sizes = [block_size([10.0, 10.0 + d, 10.0 - d, 10.0 + d / 2]) for d in (0.01, 0.1, 0.3, 0.6, 1.0)]
    assert sizes == sorted(sizes) and sizes[0] == MIN_BLOCK_REP and sizes[-1] == MAX_BLOCK_REP


@dataclass
class _Timing:
    samples_ms: list
    timer: str = "synthetic"
    n_warmup: int = 1
    wall_ms: list | None = None
    wait_ms: list | None = None


class _SyntheticFn:
    """time_fn and back_to_back stand-ins that hand out samples from a cycle, recording each call."""

    def __init__(self, cycle: list[float]) -> None:
        self.cycle, self.i, self.calls = cycle, 0, []

    def _take(self, n: int) -> list[float]:
        out = [self.cycle[(self.i + k) % len(self.cycle)] for k in range(n)]
        self.i += n
        return out

    def time_fn(self, run, arg_sets, dev, n_warmup=1, n_rep=3, max_total_s=1.0, net_of_wait=False, **kw):
        self.calls.append(("time", n_rep, kw))
        return _Timing(self._take(n_rep))

    def back_to_back(self, run, arg_sets, dev, t_ms, n_chunks=3):
        self.calls.append(("b2b", n_chunks, {}))
        return self._take(n_chunks)


class _Dev:
    def __init__(self, type_: str) -> None:
        self.type = type_


def test_a_steady_function_stops_every_block_at_the_floor_and_says_it_settled():
    s = _SyntheticFn([10.0, 10.02, 9.99, 10.01])
    left: list[float] = []
    b = timed_blocks(None, [()], _Dev("cuda"), s.time_fn, s.back_to_back, on_left=left.append)
    assert [len(x) for x in b.samples_ms] == [MIN_BLOCK_REP] * 3
    assert [len(x) for x in b.chunks_ms] == [MIN_BLOCK_REP] * 3
    assert b.stops == [("settled", "settled")] * 3 and "every block settled" in b.sizing()
    assert f"{3 * MIN_BLOCK_REP} single calls" in b.sizing()
    assert left[-1] == 0 and all(x >= 0 for x in left)
    # warm-up once: the first block by the protocol's rule, the later ones with none of their own and a
    # share of the sustained run (a GPU here)
    from hwlab.core.measure import GPU_MIN_RUN_S

    times = [kw for kind, _, kw in s.calls if kind == "time"]
    assert times[0] == {} and len(times) == 3
    assert all(kw == {"warmup_s": 0.0, "min_run_s": GPU_MIN_RUN_S / 3} for kw in times[1:])


def test_a_noisy_function_samples_to_the_cap_and_says_so():
    s = _SyntheticFn([10.0, 14.0, 8.0, 12.0, 9.0, 13.0, 7.5])
    b = timed_blocks(None, [()], _Dev("cpu"), s.time_fn, s.back_to_back)
    assert all(len(x) == MAX_BLOCK_REP for x in b.samples_ms) and all(len(x) == MAX_BLOCK_CHUNKS for x in b.chunks_ms)
    assert all(stop == (f"the cap of {MAX_BLOCK_REP}", f"the cap of {MAX_BLOCK_CHUNKS}") for stop in b.stops), b.stops
    assert f"the cap of {MAX_BLOCK_REP}" in b.sizing() and "stopped by" in b.sizing()
    assert b.n_calls >= 3 * (MAX_BLOCK_REP + MAX_BLOCK_CHUNKS)  # every single call and chunk counted
    times = [kw for kind, _, kw in s.calls if kind == "time"]  # a CPU: no warm-up, no sustained run after
    assert times[0] == {} and len(times) > 3 and all(kw == {"warmup_s": 0.0, "min_run_s": 0.0} for kw in times[1:])


def test_a_moderate_spread_takes_the_calls_its_median_needs_and_no_more():
    s = _SyntheticFn([10.0, 10.3, 9.75, 10.2, 9.85, 10.35, 9.7])
    b = timed_blocks(None, [()], _Dev("cpu"), s.time_fn, s.back_to_back)
    assert all(stop == ("settled", "settled") for stop in b.stops), b.stops
    for k in (1, 2):  # the later blocks sized by the spread of every sample before them
        before = [x for blk in b.samples_ms[:k] for x in blk]
        blk = b.samples_ms[k]
        assert MIN_BLOCK_REP < len(blk) and block_size(before + blk) <= len(blk)  # settled by its own size
        assert len(blk) <= max(block_size(before + blk[:j]) for j in range(len(blk)))  # no call past a need
        assert median_error(rel_width(before + b.samples_ms[k]), len(b.samples_ms[k])) <= TARGET_MEDIAN_ERROR
    assert max(len(x) for x in b.samples_ms) < MAX_BLOCK_REP


# ------------------------------------------------------------------ the command line's lines
def test_held_lines_come_out_after_the_hold_and_the_import_gets_a_heartbeat(monkeypatch):
    from hwlab.cli import cmd_examine

    monkeypatch.setattr(pr, "HEARTBEAT_S", 0.3)
    got: list[tuple[float, str]] = []
    lock = threading.Lock()

    def step(label: str) -> None:
        with lock:
            got.append((time.monotonic(), label))

    t0 = time.monotonic()
    held = cmd_examine.HeldSteps(step, "accepted", hold_s=0.2, beat_until="checked")
    held(f"import x ({ESTIMATING})")
    assert got == []  # held: a refusal coming now would stand alone
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    held("checked (~3 s left, estimated)")
    n_at_checked = len(got)
    time.sleep(1.0)
    held.stop(show_held=True)
    assert got[0][1] == f"import x ({ESTIMATING})" and got[0][0] - t0 >= 0.2
    beats = [label for _, label in got[1:n_at_checked - 1]]
    assert beats and all(b.startswith(f"{SUBSTEP}import x (") and ESTIMATING in b for b in beats)
    assert len(got) == n_at_checked  # the examination's own heartbeat takes over at its first phase


def test_a_refusal_within_the_hold_stands_alone():
    from hwlab.cli import cmd_examine

    got: list[str] = []
    held = cmd_examine.HeldSteps(got.append, "accepted", hold_s=5.0, beat_until="checked")
    held("import x")
    held.stop()  # a refusal: the held lines are dropped
    assert got == []


def test_progress_lines_are_not_swallowed_while_the_profiler_captures_file_descriptor_2():
    """The profiler's start and stop point fd 2 at a buffer (hwlab.core.profiling); a progress line
    written then must come out at once. The child exits inside the capture, so a line that went into
    the buffer would never come out at all."""
    code = (
        "import os, sys\n"
        "from hwlab.cli.cmd_examine import progress_stream\n"
        "from hwlab.core.profiling import native_stderr_filtered\n"
        "with progress_stream() as err:\n"
        "    with native_stderr_filtered():\n"
        "        print('progress line', file=err or sys.stderr, flush=True)\n"
        "        print('plain line', file=sys.stderr, flush=True)\n"
        "        os._exit(0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "progress line" in r.stderr, r.stderr
    assert "plain line" not in r.stderr  # the capture is real: what went to fd 2 is held back


def test_the_progress_stream_is_sys_stderr_where_stderr_is_not_the_processs_own(capsys):
    from hwlab.cli.cmd_examine import progress_stream

    with progress_stream() as err:
        assert err is None  # pytest's capture: the lines go where the test reads them


def test_a_profile_summary_records_without_its_per_call_items_and_keeps_them():
    """The record leaves the per-kernel items out (the trace file keeps them) without copying them
    first; everything else is as a full copy gives it, and the object keeps its items."""
    import dataclasses

    from hwlab.examine.torch_profile import ProfileSummary

    calls = [[{"name": f"aten::op{i}", "us": float(i), "stack": ["aten::op"], "op_ids": [i]} for i in range(50)]
             for _ in range(3)]
    s = ProfileSummary(on_gpu=False, n_calls=3, kernels_per_call=50.0, busy_ms_per_call=1.2,
                       top=[{"name": "aten::op1", "share_pct": 40.0}], calls=calls, call_us=[10.0, 11.0, 12.0])
    full = dataclasses.asdict(s)
    full.pop("calls")
    d = s.to_dict()
    assert d == full and "calls" not in d
    assert s.calls is calls and len(s.calls) == 3
    d["top"][0]["share_pct"] = 0.0  # a copy: the record's dicts are not the summary's
    assert s.top[0]["share_pct"] == 40.0


@pytest.mark.slow
def test_cli_lines_say_estimating_until_there_is_a_basis_and_the_record_says_how_the_timing_stopped(tmp_path):
    """A real examination through the command line, with no ceilings cached (they are measured):
    the lines before a call has been timed, and those while the ceilings are measured, give no
    number; every line from the timing on gives one; the record says how many calls were timed."""
    import os
    import re
    from pathlib import Path

    from hwlab.cli.console import loads_strict
    from hwlab.examine import PHASES

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "hwlab", "examine", "examples/unfused_chain.py:unfused_chain", "--json"],
                       cwd=root, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HWLAB_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert r.returncode in (0, 1, 4), r.stderr[-2000:]
    d = loads_strict(r.stdout)
    lines = [x for x in r.stderr.splitlines() if x.startswith("hwlab examine: [")]
    steps = [x for x in lines if "] ... " not in x]
    number = re.compile(r"~\d+(\.\d+)? s left, estimated")
    beats = [x for x in lines if re.search(r"\(\d+ s in, ", x)]
    for x in steps + beats:  # one or the other, never both, never the console's own guess
        assert (ESTIMATING in x) != bool(number.search(x)), x
        assert "s elapsed, ~" not in x, x
    first_timed = next(i for i, x in enumerate(steps) if PHASES[2] in x)
    assert all(ESTIMATING in x for x in steps[:2])  # the import and the checked call: no basis yet
    assert ESTIMATING in next(x for x in steps if PHASES[1] in x)  # ceilings measured now (none cached)
    assert all(number.search(x) for x in steps[first_timed:])
    sizing = [n for n in d["notes"] if n.startswith("timing sized by the measured spread")]
    assert len(sizing) == 1
    n_single = int(re.search(r"(\d+) single calls", sizing[0]).group(1))
    assert n_single == d["measurement"]["n_rep"] and n_single >= 3 * MIN_BLOCK_REP
    assert re.search(r"every block settled|stopped by", sizing[0])
