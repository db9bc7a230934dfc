"""Record the CPU-only runs the notebooks show when they cannot run them live (labelled CPU).

    sudo .venv/bin/python tools/record_cpu_evidence.py --out src/hwlab/recorded/cpu [--only NAME,...]

Both need root + iproute2 (a rate-limited veth in a network namespace):

* ``lab03_slowlink``   the first, obvious example: six gloo ranks, two behind a 100 Mbit/s veth,
                       naive (reordered) vs topology-aware TP groups and the devices alone,
                       interleaved in one launch; overlap on a fast vs this slow link; a gloo
                       collectives table.
* ``lab03_linksweep``  the same experiment at several link rates (throughput naive / aware per
                       rate), then the calibrated case: the rate interpolated to the seed's 0.72x,
                       run with the counter-example (regressed kernel on every rank) and overlap;
                       re-run at a corrected rate (up to ``--tries``) while outside 0.72 +- 0.08.
                       Every attempt is kept in the record.

Destinations are checked before anything runs: an existing file is refused without ``--force``.
``--rederive --force`` re-reads recorded files through the current analysis rules (no new
measurement; the file says when it was re-derived).
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from hwlab.core.evidence import Evidence, load, machine_info
from hwlab.labs import crosslink as C

PARTS = ("lab03_slowlink", "lab03_linksweep")


def record_slowlink(steps: int) -> Evidence:
    exp = C.experiment(C.EXTREME_RATE_MBIT, steps=steps, overlap=True, regressed=False)
    coll = C.collectives(4, sizes=(1 << 16, 1 << 20, 1 << 22))
    print(f"lab03_slowlink: throughput naive/aware {exp['throughput_naive_over_aware']:.2f}x, tail "
          f"{exp['naive']['report']['tail_ranks']} {exp['naive']['report']['tail_ms']:.1f} ms; overlap hidden "
          f"fast {exp['overlap']['fast']['hidden_pct']:.0f}% slow {exp['overlap']['slow']['hidden_pct']:.0f}%")
    return Evidence(kind="lab03_slowlink", machine=machine_info("cpu"), results=[],
                    extra={"experiment": exp, "collectives_gloo_loopback": coll})


def record_linksweep(steps: int, tries: int, rates: list[float]) -> Evidence:
    points = C.sweep(rates, steps=steps)
    for p in points:
        print(f"  sweep {p['rate']}: naive/aware {p['throughput_naive_over_aware']:.2f}x, "
              f"tail {p['naive']['report']['tail_ms']:.1f} ms")
    measured = [(p["rate_mbit"], p["throughput_naive_over_aware"]) for p in points]
    base = points[0]["single_device"]
    attempts = []
    for _ in range(tries):
        rate = round(C.calibrate_rate(measured))
        case = C.experiment(rate, steps=steps + 5, overlap=True, regressed=True, baselines=dict(base))
        base = case["single_device"]
        ratio = case["throughput_naive_over_aware"]
        print(f"  calibrated try at {rate} Mbit/s: naive/aware {ratio:.2f}x")
        attempts.append(case)
        measured.append((rate, ratio))
        if C.in_seed_band(ratio):
            break
    case = min(attempts, key=lambda c: abs(c["throughput_naive_over_aware"] - C.SEED_RATIO))
    others = [{k: v for k, v in a.items() if k != "ranks"} for a in attempts if a is not case]
    return Evidence(kind="lab03_linksweep", machine=machine_info("cpu"), results=[],
                    extra=finish_linksweep({"sweep": points, "calibrated": case, "other_attempts": others}))


def finish_linksweep(x: dict) -> dict:
    """The calibrated case's seed comparison and signature table, from its (re-)derived reports."""
    case = x["calibrated"]
    case["seed"] = C.seed_scale(case["aware"]["report"]["step_ms"], case["naive"]["report"]["tail_ms"])
    case["signature"] = [C.signature_row("slow link (naive mapping)", case["naive"]),
                         C.signature_row("regressed kernel (aware mapping)", case["regressed"])]
    x.update(seed_ratio=C.SEED_RATIO, seed_band=C.SEED_RATIO_BAND, seed_tail_ms=list(C.SEED_TAIL_MS))
    print(f"lab03_linksweep: calibrated {case['rate']} naive/aware {case['throughput_naive_over_aware']:.2f}x "
          f"(in band: {C.in_seed_band(case['throughput_naive_over_aware'])}), tail "
          f"{case['naive']['report']['tail_ms']:.1f} ms")
    return x


def rederive(out: Path, parts: list[str]) -> None:
    """Re-read recorded runs through the current analysis rules (no new measurement): every
    report, walk evidence and ratio is recomputed from the recorded per-rank series."""
    for part in parts:
        ev = load(out / f"{part}.json")
        if part == "lab03_slowlink":
            C.analyse(ev.extra["experiment"])
        else:
            for p in ev.extra["sweep"]:
                C.analyse(p)
            C.analyse(ev.extra["calibrated"])
            finish_linksweep(ev.extra)
        ev.extra["rederived_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        print(ev.save(out / f"{part}.json", overwrite=True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--force", action="store_true", help="replace existing records")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated, from {PARTS}")
    p.add_argument("--steps", type=int, default=15, help="rounds per launch (after 3 warm-up rounds)")
    p.add_argument("--tries", type=int, default=3, help="calibrated runs at most")
    p.add_argument("--rederive", action="store_true",
                   help="re-derive the recorded files in --out with the current rules (needs --force)")
    p.add_argument("--rates", default=",".join(str(r) for r in C.SWEEP_RATES_MBIT), help="sweep rates, Mbit/s")
    a = p.parse_args(argv)
    parts = [x for x in a.only.split(",") if x]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        print(f"unknown part(s) {bad}: choose from {PARTS}", file=sys.stderr)
        return 2
    if a.rederive:
        if not a.force:
            print("--rederive rewrites the records: pass --force", file=sys.stderr)
            return 2
        rederive(a.out, parts)
        return 0
    for part in parts:
        dest = a.out / f"{part}.json"
        if dest.exists() and not a.force:
            print(f"{dest} exists: pass --force to replace it", file=sys.stderr)
            return 2
    if not a.out.is_dir():
        print(f"{a.out} is not a folder", file=sys.stderr)
        return 2
    for part in parts:
        ev = (record_slowlink(a.steps) if part == "lab03_slowlink" else
              record_linksweep(a.steps, a.tries, [float(r) for r in a.rates.split(",")]))
        print(ev.save(a.out / f"{part}.json", overwrite=a.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
