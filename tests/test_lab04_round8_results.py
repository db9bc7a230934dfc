"""Round 8's H200 results (benchmarks/results/round8/), re-read on the CPU: every claim of
LAB04_NOTES.md round 8 that decided an adoption is recomputed here from the files, and the
figures the notes quote are the files' figures."""
import json
from pathlib import Path

import pytest

from hwlab.labs.fp8.attention import FP8_CACHE_MATH_REL

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results" / "round8"
NOTES = (ROOT / "benchmarks" / "LAB04_NOTES.md").read_text()
ROUND8 = NOTES[NOTES.index("## Round 8"):NOTES.index("## Round 9")]


def _load(name):
    return json.loads((RES / name).read_text())


def test_attention_tiles_checked_timed_and_none_beat_the_labs_where_it_streams():
    d = _load("lab04_round8_h200.json")
    for row in d["attn"]:
        kit = {k: v for k, v in row["us_per_layer"].items() if k != "sdpa"}
        assert all(row["rel_err_vs_float32"][k] < FP8_CACHE_MATH_REL for k in kit)  # checked before timed
        nbytes = 2 * row["batch"] * 32 * row["ctx"] * 128  # K and V, one byte each, per layer
        for k, us in kit.items():
            assert row["gbps"][k] == pytest.approx(nbytes / us / 1e3)
        if row["ctx"] >= 4096:  # the lab's tile is the fastest kit tile where KV bytes dominate
            assert min(kit, key=kit.get) == "lab", row["ctx"]
            assert kit["fused"] > kit["lab"] and kit["ppsm 14"] > kit["ppsm 28"] > kit["lab"]
        else:
            assert kit["fused"] == pytest.approx(kit["lab"], rel=0.01)
    quoted = {(r["ctx"], k): f"{v:.1f}" for r in d["attn"] for k, v in r["us_per_layer"].items()}
    assert f"{quoted[(4096, 'lab')]} -> {quoted[(4096, 'ppsm 28')]} us at 4k" in ROUND8
    assert f"32k {quoted[(32768, 'lab')]} -> {quoted[(32768, 'fused')]}" in ROUND8


def test_step_choices_that_were_not_adopted_lost_in_the_step():
    steps = {(s["path"], s["ctx"]): s["tpot_ms"] for s in _load("lab04_round8_h200.json")["step"]}
    for ctx in (4096, 32768):
        t = steps[("fixed", ctx)]
        assert min(t, key=t.get) == "lab", ctx
    # PDL for the attention: faster on the fixed step at 512, slower on the bf16 one
    assert steps[("fixed", 512)]["pdl attention"] < steps[("fixed", 512)]["lab"]
    assert steps[("bf16", 512)]["pdl attention"] > steps[("bf16", 512)]["lab"]


def test_serial_split_k_beats_the_atomic_sums_and_was_adopted_on_its_step_gain():
    d = _load("lab04_round8b_h200.json")
    for g in d["gemm"]:
        us = g["us_per_layer"]
        assert not g["failed"] and all(e < 2e-2 for e in g["rel_err_vs_float32"].values())
        if g["layer"] in ("out", "down", "qkv"):
            assert us["kit swap 64x128 s6 k4 serial"] < us["kit swap 64x128 s6 k4"], (g["layer"], g["rows"])
        if g["layer"] in ("qkv", "up"):  # there the split itself costs
            assert us["kit swap 64x128 s6"] < us["kit swap 64x128 s6 k2 serial"]
    steps = {s["ctx"]: s["tpot_ms"] for s in d["step"]}
    for ctx in (512, 4096):
        assert steps[ctx]["lab tiles, serial split-K"] < steps[ctx]["lab"]
    assert f"{steps[512]['lab']:.3f} -> **{steps[512]['lab tiles, serial split-K']:.3f} ms**" in ROUND8


def test_the_faulty_tile_is_wrong_only_with_atomic_sums():
    rows = _load("splitk_serial_h200.json")["rows"]
    serial = [r for r in rows if "serial" in r["case"]]
    atomic4 = [r for r in rows if "atomic" in r["case"] and r["rows"] == 4]
    assert len(serial) == 6 and all(r["calls_off"] == 0 for r in serial)
    assert atomic4 and atomic4[0]["calls_off"] > 0
    assert f"with atomics {atomic4[0]['calls_off']} of {atomic4[0]['calls']} calls off" in ROUND8
