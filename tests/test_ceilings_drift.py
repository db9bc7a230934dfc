"""A fresh ceiling held against the cached one (#35): flagged when it differs by more than both
runs' spread, borderline inside it, not comparable at other sizes or without the cache's
timing; and `hwlab doctor --remeasure` reports it against the cache it replaces."""
import json

from hwlab.core import ceilings
from hwlab import cli
from hwlab.core.ceilings import Ceilings

PARAMS = {"size_mib": 64}


def _c(t_ms, p10, p90, n=50, params=PARAMS, bands=True):
    gbps = 64 * 2**20 * 2 / (t_ms * 1e6)
    b = {"copy": {"t_ms": t_ms, "t_p10_ms": p10, "t_p90_ms": p90, "n_rep": n, "params": params}} if bands else {}
    return Ceilings(device="CPU", copy_gbps=gbps, bands=b)


def test_a_tight_copy_ceiling_30pct_slower_is_flagged_either_way():
    cached, fresh = _c(1.0, 0.99, 1.01), _c(1.3, 1.29, 1.31)
    for a, b in ((cached, fresh), (fresh, cached)):
        lines = ceilings.drift(a, b)
        assert len(lines) == 1 and "CACHE NOT TODAY'S" in lines[0] and lines[0].startswith("copy")


def test_noise_and_small_changes_are_not_flagged():
    assert ceilings.drift(_c(1.0, 0.99, 1.01), _c(1.05, 1.04, 1.06)) == []  # under the tolerance
    wide = ceilings.drift(_c(1.0, 0.6, 1.5), _c(2.0, 1.2, 3.0))  # bands 90% of their medians
    assert len(wide) == 1 and "within spread (borderline)" in wide[0] and "NOT TODAY" not in wide[0]


def test_other_sizes_or_an_old_cache_are_not_comparable():
    other = ceilings.drift(_c(1.0, 0.99, 1.01, params={"size_mib": 256}), _c(3.0, 2.9, 3.1))
    assert len(other) == 1 and "other sizes" in other[0] and "not comparable" in other[0]
    old = ceilings.drift(_c(1.0, 0.99, 1.01, bands=False), _c(3.0, 2.9, 3.1))
    assert len(old) == 1 and "older cache" in old[0]
    assert ceilings.drift(_c(1.0, 0.99, 1.01, bands=False), _c(1.02, 1.0, 1.04)) == []


def test_doctor_remeasure_holds_the_fresh_ceilings_against_the_cache(tmp_path, monkeypatch, capsys):
    """A cache whose copy ceiling is ten times this machine's, with a tight band at the sizes
    a quick re-measure uses: the re-measure says the cache was not today's."""
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path))
    p = ceilings.save(ceilings.measure(quick=True))  # written as is: a busy host's band is tampered below
    d = json.loads(p.read_text())
    band = d["bands"]["copy"]
    t = band["t_ms"] / 10  # a ten times faster copy, every repeat
    d["bands"]["copy"] = dict(band, t_ms=t, t_p10_ms=t * 0.99, t_p90_ms=t * 1.01)
    d["copy_gbps"] *= 10
    p.write_text(json.dumps(d))
    assert cli.main(["doctor", "--quick", "--remeasure", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["ceilings_status"]
    copy = [x for x in st["drift_vs_previous_cache"] if x.startswith("copy")]
    assert len(copy) == 1 and ("CACHE NOT TODAY'S" in copy[0] or "borderline" in copy[0])


def _m(name, t_ms, p10, p90, n_rep, n_bytes=0, n_flops=0, params=None):
    from hwlab.core.measure import Measurement
    return Measurement(name=name, t_ms=t_ms, t_p10_ms=p10, t_p90_ms=p90, n_bytes=n_bytes, n_flops=n_flops,
                       device="CPU", timer="test", n_rep=n_rep, params=params or {})


def _cached_stable(tmp_path, monkeypatch):
    """A stable cache written by the kit's own writer: copy and fp32 GEMM with tight bands."""
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path))
    n = 2 * 256 ** 3
    old = Ceilings(device="CPU", copy_gbps=40.0, gemm_tflops={"fp32": n / (0.2e-3) / 1e12},
                   measured_at="2026-01-01T00:00:00+00:00",
                   bands={"copy": {"t_ms": 3.3, "t_p10_ms": 3.2, "t_p90_ms": 3.4, "n_rep": 20, "params": PARAMS},
                          "gemm fp32": {"t_ms": 0.2, "t_p10_ms": 0.19, "t_p90_ms": 0.21, "n_rep": 10,
                                        "params": {"m": 256}}})
    ceilings.save(old)
    return old, n


def _busy_probes(monkeypatch, n):
    """The measuring seam: a steady copy, and a GEMM on a busy host, 16x slower with a band of
    several times its median (the issue's poisoned case)."""
    from hwlab.core import probes
    monkeypatch.setattr(probes, "hbm_copy", lambda **k: _m("copy", 3.3, 3.25, 3.35, 20, n_bytes=150 * 10**6,
                                                             params=PARAMS))
    monkeypatch.setattr(probes, "gemm", lambda **k: _m("gemm", 3.2, 0.5, 9.0, 10, n_flops=n,
                                                         params={"m": 256}))


def test_remeasure_never_caches_an_unstable_ceiling_and_says_it_kept_the_old_one(tmp_path, monkeypatch, capsys):
    old, n = _cached_stable(tmp_path, monkeypatch)
    _busy_probes(monkeypatch, n)
    assert cli.main(["doctor", "--quick", "--remeasure", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    cached = json.loads(ceilings.cache_path().read_text())
    assert cached["gemm_tflops"]["fp32"] == old.gemm_tflops["fp32"]  # the cache kept its value
    assert cached["bands"]["gemm fp32"]["t_p90_ms"] == 0.21
    assert rep["ceilings"]["gemm_tflops"]["fp32"] == old.gemm_tflops["fp32"]  # and it is the one in use
    kept = rep["ceilings_status"]["not_cached_unstable"]
    assert [k["ceiling"] for k in kept] == ["gemm fp32"] and kept[0]["kept"] == old.gemm_tflops["fp32"]
    assert "band" in kept[0]["why"] and "NOT cached" in rep["ceilings_status"]["label"]
    assert cached["copy_gbps"] != old.copy_gbps  # a stable fresh ceiling still replaces the old one
    assert cli.main(["doctor", "--quick", "--remeasure"]) == 0
    assert "NOT cached" in capsys.readouterr().out


def test_an_unstable_ceiling_with_nothing_to_keep_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path))
    _busy_probes(monkeypatch, 2 * 256 ** 3)
    c = ceilings.get("cpu", quick=True)
    assert not ceilings.cache_path("cpu").exists()
    assert "NOT cached" in c.label and "measures again" in c.label
