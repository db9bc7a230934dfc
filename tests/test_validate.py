"""hwlab.core.validate: numbers checked for type, finiteness and physical range where they enter."""
import argparse
import json
import math

import pytest

from hwlab.core import evidence, validate
from hwlab.core.validate import NumberError


@pytest.mark.parametrize("value,kw,match", [
    ("fast", {}, "should be a number"), (True, {}, "should be a number"), (None, {}, "not null"),
    (math.nan, {}, "not a finite"), (math.inf, {}, "not a finite"), (-1.0, {"lo": 0.0}, ">= 0"),
    (0.0, {"lo": 0.0, "lo_open": True}, "> 0"), (101.0, {"hi": 100.0}, "<= 100"),
    (1.5, {"whole": True}, "whole number"),
])
def test_number_refuses_with_the_field_named(value, kw, match):
    with pytest.raises(NumberError, match=match) as e:
        validate.number(value, "t_ms", where="results[0] ", **kw)
    assert "results[0] t_ms" in str(e.value)


def test_number_accepts_the_edges_of_its_range():
    assert validate.number(0, "x", lo=0.0) == 0.0
    assert validate.number(100.0, "x", hi=100.0) == 100.0
    assert validate.number(3, "n", whole=True) == 3.0


def test_observations_ranges_come_from_what_each_metric_is():
    ok = {"dram_pct_of_peak": 100.0, "rank_tail_pct": 250.0, "n_spills": 0, "single_gpu_slow": True,
          "e2e_slowdown": None, "metric_sources": {"x": "y"}}
    assert validate.observations(ok) == ok  # a tail over the median may exceed 100 %
    for bad, match in [({"dram_pct_of_peak": 100.5}, "<= 100"), ({"launch_gap_pct": -1}, ">= 0"),
                       ({"n_spills": 2.5}, "whole"), ({"tensor_pct_of_peak": "low"}, "should be a number"),
                       ({"unknown_metric": math.inf}, "finite"), ({"n_ranks": 0}, ">= 1")]:
        with pytest.raises(NumberError, match=match):
            validate.observations(bad)


def test_a_rate_may_pass_its_measured_ceiling_within_reason():
    """% of a measured ceiling: a little over 100 is the ceiling's spread; twice it is no part."""
    validate.observations({"tensor_pct_of_peak": 100.6, "dram_pct_estimated": 150.0})
    for k in ("tensor_pct_of_peak", "dram_pct_estimated"):
        with pytest.raises(NumberError, match=f"<= {validate.MEASURED_PCT_MAX:g}"):
            validate.observations({k: validate.MEASURED_PCT_MAX + 1})


def test_every_recorded_drill_observation_passes():
    """What the kit's own drills show a learner (recorded runs) is valid input when the learner
    submits it back as evidence."""
    from hwlab.course import drills

    n = 0
    for fault in sorted(drills.FAULTS):
        try:
            d = drills.new(seed=5, fault=fault, live=False)
        except evidence.EvidenceError:
            continue
        validate.observations({k: v for k, v in d.observations.items() if not isinstance(v, (dict, list, str))})
        n += 1
    assert n, "no drill fault has a recorded run"


def test_every_recorded_evidence_file_passes_and_a_corrupted_copy_does_not(tmp_path):
    """The kit's own records pass the checks (they are what a healthy record looks like); the
    same record with one number made impossible is reported as corrupt, never loaded."""
    paths = sorted(evidence.RECORDED_DIR.glob("*/*.json"))
    assert paths
    for p in paths:
        evidence.load(p)
    d = json.loads((evidence.RECORDED_DIR / "h200" / "baseline.json").read_text())
    for field, value in [("t_ms", 0.0), ("t_p10_ms", d["results"][0]["t_ms"] * 2), ("n_bytes", -8),
                         ("ceiling_gbps", 1e6)]:
        bad = json.loads(json.dumps(d))
        bad["results"][0][field] = value
        p = tmp_path / f"{field}.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(evidence.EvidenceError, match=f"corrupt.*{field}"):
            evidence.load(p)


def test_count_arg_takes_whole_numbers_in_either_notation():
    assert validate.count_arg("4096") == 4096 and validate.count_arg("1e9") == 10**9
    for text in ("-1", "1.5", "inf", "nan", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            validate.count_arg(text)


def test_implied_rate_bounds():
    # a known GPU: its datasheet peak; no datasheet: CPU_RATE_FACTOR times the measured ceiling
    validate.implied_rate("n_bytes", 4000.0, "GB/s", "NVIDIA H200", 4800.0, 4000.0)
    with pytest.raises(NumberError, match="datasheet peak"):
        validate.implied_rate("n_bytes", 4900.0, "GB/s", "NVIDIA H200", 4800.0, 4000.0)
    validate.implied_rate("n_bytes", 20 * 3.0, "GB/s", "CPU", None, 3.0)  # caches: well above DRAM copy
    with pytest.raises(NumberError, match="measured ceiling"):
        validate.implied_rate("n_bytes", validate.CPU_RATE_FACTOR * 3.0 * 1.01, "GB/s", "CPU", None, 3.0)
    validate.implied_rate("n_bytes", 1e30, "GB/s", "CPU", None, None)  # nothing to judge against: no refusal


def test_a_corrupt_or_streamed_ceilings_cache_is_refused_not_used(tmp_path, monkeypatch):
    import os

    from hwlab.core import ceilings
    from hwlab.core.measure import InputError

    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path))
    p = ceilings.cache_path("cpu")
    good = {"device": "cpu", "copy_gbps": 5.0, "gemm_tflops": {"fp32": 0.2}, "measured_at": "2026"}
    p.write_text(json.dumps(good))
    assert ceilings.load_cached("cpu").copy_gbps == 5.0
    p.write_text(json.dumps({**good, "copy_gbps": float("nan")}))
    with pytest.raises(InputError, match="corrupt.*copy_gbps.*remeasure"):
        ceilings.load_cached("cpu")
    p.unlink()
    os.mkfifo(p)
    with pytest.raises(InputError, match="FIFO"):
        ceilings.load_cached("cpu")
