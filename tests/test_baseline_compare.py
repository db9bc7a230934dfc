"""baseline compare: runs that cannot be compared are their own class, say what differs and
give no node advice; comparable runs get deviations with advice (exit 1) or a clean match (0)."""
import copy
import json
import subprocess
import sys

import pytest

from hwlab import baseline, evidence

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
    run = lambda *a: subprocess.run([sys.executable, "-m", "hwlab.cli", "baseline", "compare", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    r = run(b, other)
    assert r.returncode == 2 and "NOT COMPARABLE" in r.stdout and "GPU model differs" in r.stdout
    assert "drain" not in r.stdout
    j = json.loads(run(b, other, "--json").stdout)
    assert j["verdict"] == "not comparable" and j["deviations"] == [] and j["not_comparable"]
    r = run(b, slow)
    assert r.returncode == 1 and "[hardware] hbm_copy" in r.stdout and "drain and swap" in r.stdout
    assert run(b, b).returncode == 0
    rows = [json.loads(x) for x in run(b, b, other, slow).stdout.splitlines()]
    assert [x["verdict"] for x in rows] == ["ok", "not comparable", "hardware"]
    assert "GPU model differs" in rows[1]["not_comparable"][0]
