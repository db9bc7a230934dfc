"""baseline compare: runs that cannot be compared are their own class, say what differs and
give no node advice; comparable runs get deviations with advice (exit 1) or a clean match (0)."""
import copy
import json
import re
import subprocess
import sys

import pytest

from hwlab.diagnosis import baseline
from hwlab.core import evidence

H200 = evidence.RECORDED_DIR / "h200"


@pytest.fixture
def base():
    return evidence.recorded("baseline")


def _save(ev, path):
    ev.path = None
    return ev.save(path)


def _variant(ev, **changes):
    v = copy.deepcopy(ev)
    for fn in changes.values():
        fn(v)
    return v


def test_unchanged_rerun_is_comparable_and_matches(base):
    c = baseline.compare(base, evidence.recorded("baseline_rerun"))
    assert c.comparable and c.ok and c.verdict == "ok"


@pytest.mark.parametrize("change,phrase", [
    (lambda v: v.machine.update(device="NVIDIA A100-SXM4-80GB"), "GPU model differs: NVIDIA H200 vs NVIDIA A100"),
    (lambda v: v.snapshot["gpus"].append(dict(v.snapshot["gpus"][0], index=1)), "GPU count differs: 1 vs 2"),
    (lambda v: v.versions.update(driver="570.86.10"), "driver major version differs: 580.159.04 vs 570.86.10"),
    (lambda v: v.versions.update(cuda_runtime="12.8"), "CUDA runtime major version differs: 13.0 vs 12.8"),
    (lambda v: v.results.__setitem__(2, _with_params(v.results[2], m=4096, n=4096, k=4096)),
     "probe gemm[bf16] ran with other parameters: k 8192 vs 4096, m 8192 vs 4096, n 8192 vs 4096"),
])
def test_not_comparable_says_what_differs_and_gives_no_advice(base, change, phrase):
    now = _variant(base, c=change)
    # and make it look sick: half the copy rate; still no hardware verdict or node advice
    now.results[0] = _with_t(now.results[0], 2.0)
    c = baseline.compare(base, now)
    assert not c.comparable and not c.ok and c.verdict == "not comparable"
    assert any(phrase in w for w in c.not_comparable), c.not_comparable
    assert c.deviations == []
    s = c.summary()
    assert s.startswith("NOT COMPARABLE") and "drain" not in s and "swap" not in s


def _with_params(meas, **params):
    meas = copy.deepcopy(meas)
    meas.params.update(params)
    return meas


def _with_t(m, factor):
    m = copy.deepcopy(m)
    m.t_ms *= factor
    m.t_p10_ms *= factor
    m.t_p90_ms *= factor
    return m


def test_driver_minor_change_stays_comparable_as_a_runtime_deviation(base):
    now = _variant(base, c=lambda v: v.versions.update(driver="580.200.01"))
    c = baseline.compare(base, now)
    assert c.comparable and not c.ok and c.categories() == {"runtime"}


def test_measured_launch_time_is_not_a_parameter(base):
    now = _variant(base, c=lambda v: v.results[-1].params.update(us_per_launch=11.0))
    assert baseline.compare(base, now).comparable


@pytest.mark.slow
def test_cli_exit_codes_and_json(base, tmp_path):
    b = _save(copy.deepcopy(base), tmp_path / "base.json")
    other = _save(_variant(base, c=lambda v: v.machine.update(device="NVIDIA A100-SXM4-80GB")),
                  tmp_path / "a100.json")
    slow = _save(_variant(base, c=lambda v: v.results.__setitem__(0, _with_t(v.results[0], 2.0))),
                 tmp_path / "slow.json")
    run = lambda *a: subprocess.run([sys.executable, "-m", "hwlab", "baseline", "compare", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    r = run(b, other)
    assert r.returncode == 2 and "NOT COMPARABLE" in r.stdout and "GPU model differs" in r.stdout
    assert "drain" not in r.stdout
    j = json.loads(run(b, other, "--json").stdout)
    assert j["verdict"] == "not comparable" and j["deviations"] == [] and j["not_comparable"]
    r = run(b, slow)
    assert r.returncode == 1 and "[hardware] hbm_copy" in r.stdout and "drain and swap" in r.stdout
    assert run(b, b).returncode == 0
    rows = json.loads(run(b, b, other, slow, "--json").stdout)  # the fleet as one JSON array
    assert [x["verdict"] for x in rows] == ["ok", "not comparable", "hardware"]
    assert "GPU model differs" in rows[1]["not_comparable"][0]


# ---------------------------------------------------------------- noise is not an alarm (#35)
def _cpu(name):
    from pathlib import Path
    return evidence.load(Path(__file__).parent / "data" / f"baseline_cpu_{name}.json")


SAME_H200 = ["baseline", "baseline_rerun", "baseline_recheck", "baseline_recheck_rerun"]


@pytest.mark.parametrize("a", SAME_H200)
@pytest.mark.parametrize("b", SAME_H200)
def test_recorded_h200_baselines_of_one_card_compare_clean_both_ways(a, b):
    """Four records of one H200 on two days: every ordered pair matches, no hardware verdict."""
    c = baseline.compare(evidence.recorded(a), evidence.recorded(b))
    assert c.comparable and c.ok and "hardware" not in c.categories(), c.summary()
    assert "drain" not in c.summary() and not c.cpu


@pytest.mark.parametrize("a,b", [("a", "b"), ("b", "a"), ("a", "c"), ("c", "a"), ("b", "c"), ("c", "b")])
def test_two_cpu_records_of_one_host_compare_clean_and_say_cpu(a, b):
    """Three baselines recorded on this shared 2-core CPU host (tests/data, recorded on CPU; a
    and b a minute apart, c twenty minutes later under heavier load): probes differ up to
    several-fold, mostly with p10-p90 bands as wide; every order is clean, says it is a CPU
    baseline and gives no GPU node advice."""
    base, now = _cpu(a), _cpu(b)
    c = baseline.compare(base, now)
    s = c.summary()
    assert c.comparable and c.ok and c.cpu and c.verdict == "ok", s
    assert s.startswith("CPU baseline") and "drain" not in s and "swap" not in s
    assert c.categories() <= {"borderline", "missing", "host"}
    assert all("within spread (borderline)" in d.rule for d in c.deviations if d.category == "borderline")
    # the slower-to-faster direction holds real drops past the tolerance: reported as borderline
    if (a, b) == ("b", "a"):
        assert any(d.category == "borderline" for d in c.deviations)
    # c's host copy is five times slower in every repeat: beyond spread, listed as the host's load
    if (a, b) == ("b", "c"):
        assert [d.what for d in c.deviations if d.category == "host"] == ["host_memcpy[cpu] (GB/s)"]
        assert "host's load" in s


def test_a_real_drop_with_tight_spreads_is_still_hardware(base):
    """A probe 30% slower (every repeat: the band moves with it) in a record of the same card."""
    now = _variant(base, c=lambda v: v.results.__setitem__(0, _with_t(v.results[0], 1.3)))
    c = baseline.compare(base, now)
    assert not c.ok and c.categories() == {"hardware"}
    d = c.deviations[0]
    assert d.what.startswith("hbm_copy") and "beyond both runs' p10-p90" in d.rule
    assert "drain and swap" in d.next_step
    # said one way per quantity: the rate fell by what the two figures give, its time rose by the judged change
    fall = 100 * (1 - d.now / d.baseline)
    assert re.search(r"GB/s down ([\d.]+)%: time per run up ([\d.]+)%", d.rule), d.rule
    got_fall, got_rise = map(float, re.search(r"down ([\d.]+)%: time per run up ([\d.]+)%", d.rule).groups())
    assert got_fall == pytest.approx(fall, abs=0.15) and got_rise == pytest.approx(100 / (1 - fall / 100) - 100, abs=0.5)
    assert "drop >" not in d.rule and "rise +" not in d.rule


def test_a_drop_inside_the_spread_is_borderline_not_hardware(base):
    """gemm[bf16] 15% slower: its recorded p10-p90 band is wide (a long upper tail), so the moved
    band still overlaps the baseline's: borderline, exit-0 verdict, no node advice."""
    now = _variant(base, c=lambda v: v.results.__setitem__(2, _with_t(v.results[2], 1.15)))
    c = baseline.compare(base, now)
    assert c.ok and c.categories() == {"borderline"}, c.summary()
    assert "overlap" in c.deviations[0].rule and "drain" not in c.summary()


def test_a_cpu_drop_beyond_spread_is_a_host_change_without_node_advice():
    """On a CPU record a probe with tight bands that moves past them is listed as a host change
    (the host's load moved it), with host advice, no GPU node advice, and no failed comparison."""
    base = _cpu("b")
    i = next(k for k, m in enumerate(base.results) if m.name.startswith("kv_cache_read"))
    assert base.results[i].spread_pct < 50  # the one tight band in this record
    now = _variant(base, c=lambda v: v.results.__setitem__(i, _with_t(v.results[i], 1.5)))
    c = baseline.compare(base, now)
    assert c.ok and c.categories() == {"host"} and c.cpu and c.verdict == "ok"
    assert "beyond both runs' p10-p90" in c.deviations[0].rule
    s = c.summary()
    assert "drain" not in s and "idle host" in c.deviations[0].next_step and "[host] kv_cache_read" in s


@pytest.mark.parametrize("n_rep,p10,p90,status", [
    (5, 0.99, 1.01, "borderline"),     # too few repeats for a band
    (50, 0.70, 1.40, "borderline"),    # a band 70% of its median: host load
    (50, 0.99, 1.01, "beyond spread"),  # enough repeats, tight band: a real change
])
def test_the_spread_rule_on_its_own(n_rep, p10, p90, status):
    from hwlab.core.spread import Band, judge_rise
    base = Band(1.0, p10, p90, n_rep)
    now = Band(1.3, 1.3 * p10, 1.3 * p90, n_rep)
    assert judge_rise(base, now, 10.0).status == status
    assert judge_rise(base, Band(1.05, 1.04, 1.06, n_rep), 10.0).status == "ok"  # under tolerance


@pytest.mark.parametrize("reasons,category,fails", [
    (["sw_power_cap"], "note", False),  # a healthy card under load reads it
    (["sw_power_cap", "hw_thermal_slowdown"], "hardware", True),
    (["hw_slowdown"], "hardware", True),
])
def test_a_new_power_cap_alone_is_a_note_a_slowdown_is_hardware(base, reasons, category, fails):
    now = _variant(evidence.recorded("baseline_rerun"),
                   c=lambda v: v.snapshot["gpus"][0].update(clock_event_reasons=reasons))
    c = baseline.compare(base, now)
    clock = [d for d in c.deviations if d.what.endswith("clock event reasons")]
    assert [d.category for d in clock] == [category] and clock[0].now == sorted(reasons)
    assert c.ok is not fails and (c.verdict == "hardware") is fails
    assert ("drain" in c.summary()) is fails


# ---------------------------------------------------------------- nothing compared is not a match
def _cli(capsys, *args):
    from hwlab.cli import main

    rc = main(["baseline", "compare", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("empty_side", ["new", "base"])
def test_a_record_with_no_probe_results_is_not_comparable(base, tmp_path, capsys, empty_side):
    """An empty record on either side leaves nothing to compare: not a match (exit 0 was), but not
    comparable, exit 2 (the baseline command's code for records that cannot be compared), saying
    what to do."""
    full = _save(copy.deepcopy(base), tmp_path / "full.json")
    empty = _save(_variant(base, c=lambda v: v.results.clear()), tmp_path / "empty.json")
    pair = (full, empty) if empty_side == "new" else (empty, full)
    rc, out, _ = _cli(capsys, *pair)
    assert rc == 2 and "matches the baseline" not in out
    assert "NOT COMPARABLE" in out and "no probe in common" in out and "hwlab baseline record" in out
    rc, out, _ = _cli(capsys, *pair, "--json")
    j = json.loads(out)
    assert rc == 2 and j["verdict"] == "not comparable" and not j["ok"]
    assert _cli(capsys, empty, empty)[0] == 2


def test_missing_probes_are_listed_and_leave_the_comparison_undecided(base, tmp_path, capsys):
    """Two of seven probes absent from the new record: the five compared match, the two are named
    with the record's reason, the verdict is not 'matches' and the exit code is 4 (undecided)."""
    def drop(v):
        v.results[:] = [m for m in v.results if not m.name.startswith(("rmsnorm", "gemm"))]
        v.extra.setdefault("missing", {})["gemm[bf16]"] = "RuntimeError: cuBLAS failed"
    b = _save(copy.deepcopy(base), tmp_path / "base.json")
    part = _save(_variant(base, c=drop), tmp_path / "part.json")
    c = baseline.compare(evidence.load(b), evidence.load(part))
    assert c.comparable and not c.ok and c.undecided and c.verdict == "incomplete"
    assert sorted(c.missing) == ["gemm[bf16]", "rmsnorm[eager]"]
    rc, out, _ = _cli(capsys, b, part)
    assert rc == 4 and "matches the baseline" not in out
    assert "2 of 7" in out and "gemm[bf16] (RuntimeError: cuBLAS failed)" in out and "rmsnorm[eager]" in out
    rows = json.loads(_cli(capsys, b, b, part, "--json")[1])
    assert [x["verdict"] for x in rows] == ["ok", "incomplete"] and _cli(capsys, b, b, part)[0] == 4
    # without --json the fleet is a table: a header, one line per node, its verdict in the last column
    table = _cli(capsys, b, b, part)[1].splitlines()
    assert table[1].split()[0] == "host" and table[1].split()[-1] == "verdict"
    assert [ln.split()[-1] for ln in table[2:4]] == ["ok", "incomplete"]
    assert not any(ln.lstrip().startswith("{") for ln in table)
