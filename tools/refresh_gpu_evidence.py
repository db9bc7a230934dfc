"""Refresh every recorded GPU figure hwlab shows, in one run on a GPU machine.

    python tools/refresh_gpu_evidence.py --out OUTDIR [--only doctor,probe_vs_torch,lab01] [--keep-going]

Writes one evidence record per part into OUTDIR (never over an existing file); copy them to
``src/hwlab/recorded/<device>/`` to commit them. Prints a short summary table last.

Parts:
* ``doctor``          system state, topology, measured ceilings (the doctor report)
* ``probe_vs_torch``  hwlab's copy and bf16 GEMM probes beside torch's own ``copy_`` and
                      ``torch.matmul`` timed independently by ``triton.testing.do_bench``
                      in the same run (acceptance: copy >= 95%, GEMM within 5%)
* ``lab01``           Lab 1 (bandwidth-bound): unfused vs fused chain, strided vs
                      coalesced, with Nsight Compute counters where ncu is installed
* ``lab02`` ``lab03`` Lab 2 (tiles, spills, occupancy, launch) and Lab 3 (one-GPU TP step)
* ``baseline``        the node baseline, recorded twice and compared (an unchanged re-run)
* ``scenarios``       the dtype/MMA-path and workload-mix leaves
* ``lab04``           Lab 4 (FP8): kernel self-checks, weight memory and logit error per path,
                      the serving stream per context bucket on bf16, mixed, gemms_fixed and
                      fixed (per-path performance reports: hit rate, dequant/requant per token,
                      TTFT/TPOT p50/p99), the seed's signature over the whole service, the
                      flowchart's B/D/K measured, the attention kernel vs SDPA
* ``drills``          one diagnosis drill per fault, live where one GPU can reproduce it
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

from hwlab.diagnosis import doctor
from hwlab.core import probes
from hwlab.core.ceilings import Ceilings
from hwlab.core.evidence import Evidence, machine_info


def part_doctor(out: Path, summary: list[str]) -> Ceilings:
    rep = doctor.doctor_report(remeasure=True, progress=lambda s: print("doctor:", s, flush=True))
    c = Ceilings.from_dict(rep["ceilings"])
    doctor.doctor_evidence(rep).save(out / "doctor.json")  # the record `hwlab doctor --save` writes
    summary.append(f"ceilings: copy {c.copy_gbps:,.0f} GB/s; " + ", ".join(
        f"{k} {v:,.1f} TFLOP/s" for k, v in c.gemm_tflops.items()) +
        f"; host link {c.host_link_gbps or 0:,.1f} GB/s")
    return c


def _torch_timer_ms(fn) -> float:
    """Median ms per call from torch.utils.benchmark (synchronises around each block)."""
    import torch.utils.benchmark as tb

    m = tb.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=2.0)
    return m.median * 1e3


def part_probe_vs_torch(out: Path, summary: list[str]) -> None:
    from triton.testing import do_bench

    dev = torch.device("cuda")
    comps = []
    # copy: hwlab's Triton copy probe vs torch copy_ timed by do_bench, 2 GiB each
    probe = probes.hbm_copy(size_mib=2048, impl="triton")
    probe_torch = probes.hbm_copy(size_mib=2048, impl="torch")
    n = 2048 * 2**20 // 4
    src, dst = torch.randn(n, device=dev), torch.empty(n, device=dev)
    t_ms = do_bench(lambda: dst.copy_(src), warmup=100, rep=1000, return_mode="median")
    db_gbps = 2 * n * 4 / (t_ms * 1e-3) / 1e9
    t_ms = _torch_timer_ms(lambda: dst.copy_(src))
    tb_gbps = 2 * n * 4 / (t_ms * 1e-3) / 1e9
    torch_gbps = max(db_gbps, tb_gbps)  # judge against torch's best showing
    comps.append({"what": "copy 2 GiB fp32 (read+write)", "probe_gbps": probe.gbps,
                  "probe_torch_impl_gbps": probe_torch.gbps,
                  "torch_copy_do_bench_gbps": db_gbps,
                  "torch_copy_utils_benchmark_gbps": tb_gbps,
                  "ratio_probe_over_torch": probe.gbps / torch_gbps, "criterion": ">= 0.95"})
    del src, dst
    # bf16 GEMM 8192^3: hwlab probe vs torch.matmul under do_bench
    g = probes.gemm(size=8192, dtype="bf16")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t_ms = do_bench(lambda: a @ b, warmup=100, rep=1000, return_mode="median")
    db_tflops = 2 * 8192**3 / (t_ms * 1e-3) / 1e12
    t_ms = _torch_timer_ms(lambda: a @ b)
    tb_tflops = 2 * 8192**3 / (t_ms * 1e-3) / 1e12
    comps.append({"what": "bf16 GEMM 8192^3", "probe_tflops": g.tflops,
                  "torch_matmul_do_bench_tflops": db_tflops,
                  "torch_matmul_utils_benchmark_tflops": tb_tflops,
                  "ratio_probe_over_torch": g.tflops / tb_tflops, "criterion": "within 5%",
                  "note": "judged against torch.utils.benchmark (back-to-back calls, as the "
                          "probe times them); do_bench zeroes a 256 MB buffer before every "
                          "call, which on the H200 cost the GEMM ~10-15% (shown beside it)"})
    ev = Evidence(kind="probe_vs_torch", machine=machine_info(),
                  results=[probe, probe_torch, g], extra={"comparisons": comps})
    ev.save(out / "probe_vs_torch.json")
    for c in comps:
        summary.append(f"{c['what']}: probe/torch = {c['ratio_probe_over_torch']:.3f} ({c['criterion']})")


def _how(d) -> str:
    """How a walk was answered, for the summary: fully measured, by hand where, or undecided."""
    if d.by_hand:
        return "BY HAND at " + ",".join(s.question for s in d.by_hand)
    return "fully measured" if d.fully_measured else f"undecided at {d.undecided.id if d.undecided else '?'}"


def part_lab01(out: Path, summary: list[str]) -> None:
    from hwlab.diagnosis.flowchart import diagnose, walk_cases
    from hwlab.labs import bandwidth as lab

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: --cpu-check at the lab's tiny sizes
    n_rows, n_cols = lab.default_size(dev)
    counters = {}
    if dev == "cuda":
        try:
            counters = lab.counters_with_ncu(n_rows, n_cols, torch.float16)
        except Exception as e:  # ncu missing or refused: the estimates still stand, say so
            print("ncu counters unavailable:", e, flush=True)
    # same run, same card
    ceiling = probes.hbm_copy(size_mib=2048 if dev == "cuda" else 16, device=dev, impl="torch").gbps
    r = walk_cases(lab.run(n_rows, n_cols, torch.float16, device=dev, ceiling_gbps=ceiling, counters=counters,
                           n_rep=50 if dev == "cuda" else 3))  # the lab measures, the flowchart walks
    ev = Evidence(kind="lab01_bandwidth", machine=machine_info(),
                  results=list(r.measurements.values()),
                  ceilings={"copy_gbps": ceiling, "source": "hbm_copy[torch] in this run"},
                  extra={"params": r.params, "flowchart_evidence": r.evidence,
                         "counters": counters, "service": r.service,
                         "diagnosis_paths": {k: d.path for k, d in r.diagnoses.items()},
                         "speedups": {"fused_over_unfused": r.speedup("unfused", "fused"),
                                      "coalesced_over_strided": r.speedup("strided", "coalesced")}})
    ev.save(out / "lab01_bandwidth.json")
    for k, m in r.measurements.items():  # CPU: interpreter timings, walked here only to show the answers
        d = r.diagnoses.get(k) or diagnose(r.evidence[k])
        summary.append(f"lab01 {m.summary()} -> {d.path}; D {r.evidence[k]['e2e_slowdown']:.2f}x, "
                       f"K {r.evidence[k]['rank_tail_pct']:.1f}% over {r.evidence[k]['n_ranks']} rank; {_how(d)}")
    summary.append(f"lab01 fused/unfused {r.speedup('unfused', 'fused'):.2f}x, "
                   f"coalesced/strided {r.speedup('strided', 'coalesced'):.2f}x, counters: "
                   + ", ".join(f"{k}: dram {v['dram_pct_of_peak']:.0f}% amp {v['sector_amplification']:.1f}"
                               for k, v in counters.items()))


def part_lab02(out: Path, summary: list[str]) -> None:
    from hwlab.diagnosis.flowchart import diagnose
    from hwlab.labs import registers as lab

    cublas = lab.cublas_bf16(8192)
    results = lab.sweep(lab.SWEEP, size=8192, ceiling_tflops=cublas.tflops,
                        progress=lambda s: print("lab02 config", s, flush=True))
    no_ncu = lab.collect_ncu(results, progress=lambda s: print("lab02 ncu", s, flush=True))
    of = lab.overfusion()  # softmax(A @ B) over a 512-wide row, fused vs split
    if of.skipped:
        raise RuntimeError(f"lab02 over-fusion: {of.skipped}")
    fused, split = of.fused, of.split
    launch = lab.launch_bound()
    copy = probes.hbm_copy(size_mib=2048, impl="torch").gbps
    ok = [r for r in results if r.measurement]
    best = max(ok, key=lambda r: r.measurement.tflops)
    spilling = [r for r in ok if (r.report.n_spills or 0) > 0]
    ev = Evidence(kind="lab02_registers", machine=machine_info(),
                  results=[cublas] + [r.measurement for r in ok] + [fused, split, launch.eager, launch.graph],
                  ceilings={"cublas_bf16_tflops": cublas.tflops},
                  extra={"configs": [r.to_dict() for r in results], "launch": launch.to_dict(),
                         "copy_gbps": copy,
                         "flowchart_evidence": {**{r.config.label: lab.config_evidence(r, copy) for r in ok},
                                                "launch-bound step": lab.launch_evidence(launch, copy)},
                         "best": best.config.label,
                         "overfusion": of.reports()})
    ev.save(out / "lab02_registers.json")
    for r in results:
        m = r.measurement
        summary.append(f"lab02 {r.config.label}: regs {r.report.n_regs} spills {r.report.n_spills} "
                       f"smem {r.report.shared_bytes} occ {r.occupancy and r.occupancy['blocks_by_limit']} "
                       f"ncu {r.ncu and {k: v for k, v in r.ncu.items() if 'limit' in k}} "
                       + (f"{m.t_ms:.3f} ms {m.tflops:.0f} TFLOP/s ({m.pct_of_flops_ceiling:.0f}% cuBLAS)" if m else r.report.skipped or ""))
    summary.append(f"lab02 cuBLAS {cublas.tflops:.0f} TFLOP/s; best {best.config.label}; worst spill "
                   f"slowdown {max(s.measurement.t_ms for s in spilling) / best.measurement.t_ms if spilling else 0:.1f}x")
    summary.append(f"lab02 over-fusion: fused {fused.t_ms:.3f} ms (spills {of.fused_report.n_spills}) vs split "
                   f"{split.t_ms:.3f} ms (spills {of.split_report.n_spills}); ncu: {no_ncu or 'ran'}")
    summary.append(f"lab02 launch: eager {launch.eager.t_ms:.3f} ms, graph {launch.graph.t_ms:.3f} ms, "
                   f"{launch.speedup:.1f}x, {launch.us_per_launch_eager:.2f} us/launch, idle {launch.gpu_idle_pct_eager:.0f}%")
    for k, e in ev.extra["flowchart_evidence"].items():
        d = diagnose(e)
        summary.append(f"lab02 walk {k}: {d.path}, D {e.get('e2e_slowdown', float('nan')):.2f}x, "
                       f"K {e.get('rank_tail_pct', float('nan')):.1f}% over {e.get('n_ranks')} rank; {_how(d)}")


def part_lab03(out: Path, summary: list[str]) -> None:
    from hwlab.labs import crosslink as lab

    dev_ar = lab.single_gpu_tp_step(staged=False)
    staged = lab.single_gpu_tp_step(staged=True)
    h2d = probes.host_link(size_mib=256, direction="h2d")
    d2h = probes.host_link(size_mib=256, direction="d2h")
    extra = {"step_ratio_staged_over_device": staged.t_ms / dev_ar.t_ms,
             "host_link_gbps": {"h2d": h2d.gbps, "d2h": d2h.gbps},
             "allreduce_bytes": dev_ar.params["allreduce_bytes"],
             "p2p_matrix": lab.p2p_matrix_gbps(), "nccl_collectives": lab.collectives(2, nccl=True)}
    ngpu = torch.cuda.device_count()
    if ngpu >= 2:  # several GPUs: default route vs forced slow route, with NCCL's chosen transport
        groups = [list(range(ngpu))]
        extra["nccl_default"] = lab.straggler_report(r := lab.launch(ngpu, groups, nccl=True, steps=20)).to_dict()
        extra["nccl_default_routes"] = [x["routes"] for x in r]
        extra["nccl_forced_slow"] = lab.straggler_report(r := lab.launch(
            ngpu, groups, nccl=True, steps=20, extra_env=lab.FORCE_SLOW_ROUTE)).to_dict()
        extra["nccl_forced_slow_routes"] = [x["routes"] for x in r]
    ev = Evidence(kind="lab03_crosslink", machine=machine_info(), results=[dev_ar, staged, h2d, d2h],
                  extra=extra)
    ev.save(out / "lab03_crosslink.json")
    summary.append(f"lab03 TP step: device all-reduce {dev_ar.t_ms:.3f} ms, PCIe-staged {staged.t_ms:.3f} ms "
                   f"({extra['step_ratio_staged_over_device']:.2f}x); host link h2d {h2d.gbps:.1f} / d2h "
                   f"{d2h.gbps:.1f} GB/s; staged moved {staged.n_bytes / 2**20:.0f} MiB per step "
                   f"-> {staged.n_bytes / (staged.t_ms - dev_ar.t_ms) / 1e6:.1f} GB/s effective; "
                   f"p2p: {extra['p2p_matrix'].get('skipped', 'measured')}")


def part_baseline(out: Path, summary: list[str]) -> None:
    from hwlab.diagnosis import baseline

    first = baseline.record(progress=lambda s: print("baseline:", s, flush=True))
    first.save(out / "baseline.json")
    again = baseline.record(progress=lambda s: print("baseline re-run:", s, flush=True))
    again.save(out / "baseline_rerun.json")
    c = baseline.compare(first, again)
    summary.append(f"baseline: {len(first.results)} probes, missing {sorted(first.extra['missing'])}; "
                   f"runtime path {first.extra['runtime_path']}")
    summary.append(f"baseline re-run compare: {'OK' if c.ok else 'DEVIATIONS'}: {c.summary()[:600]}")


def part_scenarios(out: Path, summary: list[str]) -> None:
    from hwlab.labs import scenarios

    d = scenarios.dtype_path()
    w = scenarios.workload_mix()
    ev = Evidence(kind="scenarios", machine=machine_info(),
                  results=list(d["measurements"].values()) + [w["tuned"]] + list(w["buckets"].values()),
                  extra={"dtype_path": {"flowchart_evidence": d["flowchart_evidence"], "copy_gbps": d["copy_gbps"],
                                        "service": d["service"]},
                         "workload": {k: w[k] for k in ("measured_step_ms", "step_samples_ms", "predicted_from_tuned_ms",
                                                          "predicted_from_buckets_ms", "floor_tuned_ms",
                                                          "floor_buckets_ms", "ceilings", "mix", "flowchart_evidence")}})
    ev.save(out / "scenarios.json")
    for k, m in d["measurements"].items():
        summary.append(f"dtype path {k}: {m.tflops:.0f} TFLOP/s")
    summary.append(f"workload: measured {w['measured_step_ms']:.3f} ms, predicted from tuned shape "
                   f"{w['predicted_from_tuned_ms']:.3f} ms, from buckets {w['predicted_from_buckets_ms']:.3f} ms")


def part_lab04(out: Path, summary: list[str]) -> None:
    from hwlab.diagnosis import flowchart
    from hwlab.labs import fp8 as lab
    from hwlab.labs.fp8 import kernels as fp8_kernels

    tile = fp8_kernels.DEFAULT_TILE
    kernels = dataclasses.asdict(tile)  # the decode attention's tile every decoder of this run uses
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: --cpu-check at the lab's tiny sizes
    checks = fp8_kernels.self_check(dev, tile=tile)
    t0 = time.perf_counter()
    r = lab.run(device=dev, progress=lambda s: print("lab04:", s, flush=True), attn_tile=tile)
    run_s = time.perf_counter() - t0
    copy = probes.hbm_copy(size_mib=2048 if dev == "cuda" else 256, device=dev, impl="torch").gbps
    walk = lab.flowchart_evidence(r, copy)
    sig = lab.seed_signature(r)
    ev = Evidence(kind="lab04_fp8", machine=machine_info(),
                  ceilings={"copy_gbps": copy, "source": "hbm_copy[torch] in this run"},
                  extra={"run": r, "run_s": run_s, "kernel_checks": checks, "kernel_config": kernels,
                         "stream_reports": {p: lab.performance_report(r["stream"], p) for p in r["stream"]["paths"]},
                         "seed_signature": sig,
                         "flowchart_evidence": walk,
                         "flowchart_leaves": {k: flowchart.diagnose(e).leaf_id for k, e in walk.items()}})
    ev.save(out / "lab04_fp8.json")
    summary.append(f"lab04 run {run_s:.0f} s; config {r['config']}")
    for p in r["stream"]["paths"]:
        summary.append(lab.format_report(ev.extra["stream_reports"][p], "lab04 stream"))
    summary.append(f"lab04 seed signature (mixed vs bf16, whole service): memory {sig['memory_change_pct']:+.1f}%, "
                   f"TPOT gain p50 {sig['gain_p50_pct']:+.1f}% p99 {sig['gain_p99_pct']:+.1f}%; "
                   f"p50 gain 0-6%: {sig['p50_gain_small']}, p99 gains less: {sig['p99_gains_less']}")
    for p in r["stream"]["paths"]:
        st = lab.service_tpot(r["stream"], p)
        summary.append(f"lab04 service {p}: TPOT p50 {st['tpot_ms_p50']:.3f} p99 {st['tpot_ms_p99']:.3f} "
                       f"mean {st['tpot_ms_mean']:.3f} ms over {st['tokens']} tokens")
    for k, e in walk.items():
        summary.append(f"lab04 walk {k}: B {e['slowdown_vs_floor']:.2f}x, D {e['e2e_slowdown']:.2f}x, "
                       f"K {e['rank_tail_pct']:.1f}% -> {ev.extra['flowchart_leaves'][k]}")
    summary.append("lab04 kernel checks: " + ", ".join(f"{k} {v:.2e}" for k, v in checks.items()))
    summary.append("lab04 logit error: " + ", ".join(f"{k} {v:.3f}" for k, v in r["logit_error"].items()))
    a = r.get("attention_vs_sdpa")
    if a:
        summary.append(f"lab04 attention ctx {a['ctx']} x{a['batch']} ({a['timing']}): kit on FP8 {a['kit_fp8_gbps']:.0f} GB/s "
                       f"({a['kit_fp8_over_sdpa_gbps']:.0%} of SDPA), SDPA on bf16 {a['sdpa_gbps']:.0f}, kit on bf16 "
                       f"{a['kit_bf16_gbps']:.0f}; errors " + ", ".join(f"{k} {v:.1e}" for k, v in a["rel_err_vs_float32"].items()))


def part_drills(out: Path, summary: list[str]) -> None:
    """One drill per fault, live on this machine where it can run the fault's scenario: the
    sealed drill, the right answer graded (the fixed configuration run again, every metric
    recomputed) and one wrong answer. ``runs`` keeps each (scenario, case) measured here, the
    source CPU machines read drills from. Drills are sealed with a key made for this run (in
    OUTDIR/drill-refresh.key, not copied to the repo): the rows name their fault openly.

    ``HWLAB_DRILL_FAULTS`` (comma-separated fault names): record only those, merged into an
    existing ``OUTDIR/drills.json`` (its other rows and runs kept, these replaced): a short
    device call can add a drill without re-running every other one."""
    from dataclasses import asdict

    from hwlab.diagnosis import flowchart

    from hwlab.course import drills

    key = out / "drill-refresh.key"
    os.environ["HWLAB_DRILL_KEY_FILE"] = str(key)
    rows, runs = [], {}
    only = [x for x in os.environ.get("HWLAB_DRILL_FAULTS", "").split(",") if x]
    unknown = [x for x in only if x not in drills.FAULTS]
    if unknown:
        raise SystemExit(f"HWLAB_DRILL_FAULTS names no fault {unknown}; faults: {', '.join(drills.FAULTS)}")
    prior = None
    if only and (out / "drills.json").exists():
        from hwlab.core.evidence import load
        prior = load(out / "drills.json")
    for i, (name, f) in enumerate(drills.FAULTS.items()):
        if only and name not in only:
            continue
        print("drill:", name, flush=True)
        wrong_leaf = "G" if f.leaf != "G" else "J"
        try:
            d = drills.new(seed=1000 + i, fault=name, live=True)  # live wherever this machine can run it
            right = drills.grade(d, f.leaf, learner="refresh-script")
            wrong = drills.grade(d, wrong_leaf, learner="refresh-script")
        except Exception as e:  # one fault's scenario failing must not lose the others' runs
            import traceback
            traceback.print_exc()
            rows.append({"fault": name, "leaf": f.leaf, "error": f"{type(e).__name__}: {e}"})
            summary.append(f"drill {name}: FAILED {type(e).__name__}: {e}")
            continue
        runs.setdefault(f"{f.scenario}/{f.case}", {"evidence": d.observations, "source": d.source})
        fix_ev, fix_src = ((right.fix_evidence, right.fix_source) if right.fix_evidence is not None
                           else f.fixed(live=True))  # the right leaf was missed: still record the fixed run
        runs.setdefault(f"{f.scenario}/{f.fixed_case}", {"evidence": fix_ev, "source": fix_src})
        walk = flowchart.diagnose(d.observations)
        rows.append({"recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "fault": name, "leaf": f.leaf, "scenario": f.scenario, "case": f.case,
                     "fixed_case": f.fixed_case, "drill": asdict(d),
                     "observed_leaf": walk.leaf_id, "fully_measured": walk.fully_measured,
                     "right": asdict(right), "wrong": asdict(wrong)})
        summary.append(f"drill {name}: {'live' if d.live else 'recorded'} -> "
                       f"{rows[-1]['observed_leaf']} (want {f.leaf}, measured walk {walk.fully_measured}); "
                       f"right answer passed={right.passed} fix works={right.fix_removes_slowdown}; "
                       f"wrong {wrong_leaf}: {wrong.explanation[:90]}")
    if prior is not None:
        mine = {r["fault"] for r in rows}
        rows = [r for r in prior.extra.get("drills", []) if r.get("fault") not in mine] + rows
        runs = {**prior.extra.get("runs", {}), **runs}
        ev = Evidence(kind="drills", machine=machine_info(), extra={"drills": rows, "runs": runs,
                                                                    "merged": {"added": sorted(mine),
                                                                               "kept_from": prior.recorded_at}})
        ev.save(out / "drills.json", overwrite=True)
        return
    ev = Evidence(kind="drills", machine=machine_info(), extra={"drills": rows, "runs": runs})
    ev.save(out / "drills.json")


PARTS = {"doctor": part_doctor, "probe_vs_torch": part_probe_vs_torch, "lab01": part_lab01,
         "lab02": part_lab02, "lab03": part_lab03, "baseline": part_baseline,
         "scenarios": part_scenarios, "lab04": part_lab04, "drills": part_drills}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--only", default=",".join(PARTS))
    p.add_argument("--cpu-check", action="store_true",
                   help="run the chosen parts on this CPU at small sizes, to check the script end to "
                        "end (records say CPU; never copy them to recorded/h200)")
    p.add_argument("--keep-going", action="store_true",
                   help="a part that fails is reported (one line, then its traceback's last lines) and the "
                        "others still run; exit 1 at the end if any failed (a device call is too short to "
                        "lose the parts after a failing one)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available() and not a.cpu_check:
        print("no CUDA GPU here: this script refreshes GPU evidence and has nothing to measure",
              file=sys.stderr)
        return 2
    parts = a.only.split(",")
    unknown = [x for x in parts if x not in PARTS]
    if unknown:  # before any part runs, not after an hour of the others
        print(f"unknown part(s) {unknown}; parts: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    summary: list[str] = []
    failed = []
    for part in parts:
        t0 = time.time()
        print(f"== {part}", flush=True)
        try:
            PARTS[part](a.out, summary)
        except Exception as e:  # noqa: BLE001  (--keep-going: any failure of a part, reported, the rest run)
            if not a.keep_going:
                raise
            failed.append(part)
            tail = traceback.format_exc().strip().splitlines()[-6:]
            print(f"== {part} FAILED after {time.time() - t0:.0f} s: {type(e).__name__}: {e}\n   "
                  + "\n   ".join(tail), flush=True)
            continue
        print(f"== {part} done in {time.time() - t0:.0f} s", flush=True)
    print("\n".join(summary))
    if failed:
        print(f"failed parts: {', '.join(failed)} (their records were not written)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
