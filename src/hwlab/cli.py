"""``hwlab`` command line: doctor, probe, topo, evidence, lab."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_USAGE, EXIT_FAIL = 0, 2, 1


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _progress_status(console, enabled: bool):
    """A rich spinner whose text each step updates; a no-op when output is JSON."""
    if not enabled:
        class _Null:
            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

            def update(self, *_a, **_k):
                pass
        return _Null()
    return console.status("starting", spinner="dots")


def doctor_report(remeasure: bool = False, quick: bool = False, progress=None) -> dict[str, Any]:
    """System state, topology, ceilings, quick probes and a verdict, as one dict."""
    import torch

    from . import ceilings, probes, specs, system, topology
    from .evidence import machine_info

    def step(msg):
        if progress:
            progress(msg)

    step("reading NVML")
    snap = system.snapshot()
    gpu = torch.cuda.is_available()
    report: dict[str, Any] = {"machine": machine_info(), "snapshot": snap}
    step("reading topology")
    text = topology.capture_topo_text()
    topo = None
    if text:
        try:
            topo = topology.parse_topo_matrix(text, source="nvidia-smi topo -m")
        except topology.TopologyParseError as e:
            report["topology_error"] = str(e)
    if topo is None:
        topo = topology.from_nvml()
    report["topology"] = topo.to_dict() if topo else None
    report["topology_text"] = text
    spec = specs.try_lookup(report["machine"]["device"]) if gpu else None
    report["spec"] = spec.to_dict() if spec else None
    if gpu and spec is None:
        report["spec_note"] = str(specs.UnknownGPUError(report["machine"]["device"]))
    c = ceilings.get(remeasure=remeasure, quick=quick, progress=lambda s: step(f"ceiling: {s}"))
    report["ceilings"] = c.to_dict()
    step("probe: launch overhead")
    report["probes"] = [probes.launch_overhead(n_launches=500 if quick else 2000).to_dict()]
    verdict = system.health_flags(snap) if gpu else []
    warn = ceilings.datasheet_check(c)
    if warn:
        verdict.append(warn)
    if not gpu:
        verdict.append("no CUDA GPU here: figures are this CPU's; recorded H200 results: "
                       "`hwlab evidence show doctor`")
    report["verdict"] = verdict or ["healthy: no throttling, ECC or link warnings; ceilings "
                                    "within the datasheet band"]
    return report


def _print_doctor(rep: dict[str, Any], console) -> None:
    from rich.table import Table

    m = rep["machine"]
    console.print(f"[bold]hwlab doctor[/bold] on {m['device']} (host {m['host']})")
    v = rep["snapshot"]["versions"]
    console.print("versions: " + ", ".join(f"{k} {v[k]}" for k in
                  ("python", "torch", "cuda_runtime", "triton", "nccl", "driver") if k in v))
    nv = rep["snapshot"].get("nvml", {})
    if not nv.get("available"):
        console.print(f"NVML: [yellow]not available[/yellow]: {nv.get('reason')}")
    for g in rep["snapshot"]["gpus"]:
        def f(key, unit=""):
            val = g.get(key)
            return "unsupported" if isinstance(val, dict) and "unsupported" in val else f"{val}{unit}"
        console.print(f"GPU{g['index']} {f('name')}: {f('temperature_c', ' C')}, {f('power_w', ' W')}"
                      f"/{f('power_limit_w', ' W')}, SM {f('sm_clock_mhz')}/{f('sm_clock_max_mhz')} MHz, "
                      f"PCIe Gen{f('pcie_gen')} x{f('pcie_width')} (max Gen{f('pcie_gen_max')} "
                      f"x{f('pcie_width_max')}), ECC {f('ecc_mode')}, clocks: {f('clock_event_reasons')}")
    if rep.get("topology_text"):
        console.print(rep["topology_text"].split("\n\nLegend")[0])
    c = rep["ceilings"]
    t = Table(title=f"ceilings ({c.get('source')}, {c.get('measured_at', '')[:19]})")
    t.add_column("ceiling")
    t.add_column("measured", justify="right")
    t.add_column("datasheet", justify="right")
    spec = rep.get("spec") or {}
    t.add_row("copy bandwidth", f"{c['copy_gbps']:,.0f} GB/s",
              f"{spec['hbm_gbps']:,.0f} GB/s" if spec else "-")
    for dt, val in c["gemm_tflops"].items():
        key = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16": "bf16_tflops",
               "fp8": "fp8_tflops"}.get(dt)
        ds = spec.get(key) if spec and key else None
        t.add_row(f"GEMM {dt}", f"{val:,.2f} TFLOP/s", f"{ds:,.1f}" if ds else "-")
    if c.get("host_link_gbps"):
        t.add_row("host->device (pinned)", f"{c['host_link_gbps']:,.1f} GB/s", spec.get("host_link", "-"))
    console.print(t)
    if rep.get("spec_note"):
        console.print(f"[yellow]{rep['spec_note']}[/yellow]")
    for p in rep["probes"]:
        if p["name"] == "launch_overhead":
            console.print(f"launch overhead: {p['params']['us_per_launch']:.2f} us per launch "
                          f"[{p['device']}]")
    console.print("[bold]verdict:[/bold]")
    for line in rep["verdict"]:
        console.print(f"  - {line}")


def cmd_doctor(a) -> int:
    console = _console(stderr=a.json)
    with _progress_status(console, not a.json) as st:
        rep = doctor_report(remeasure=a.remeasure, quick=a.quick,
                            progress=lambda s: st.update(s))
    if a.save:
        from .ceilings import Ceilings
        from .evidence import Evidence
        from .measure import Measurement

        ev = Evidence(kind="doctor", machine=rep["machine"],
                      results=[Measurement.from_dict(p) for p in rep["probes"]],
                      ceilings=Ceilings.from_dict(rep["ceilings"]).to_dict(),
                      versions=rep["snapshot"]["versions"], snapshot=rep["snapshot"],
                      extra={k: rep[k] for k in ("topology", "topology_text", "spec", "verdict")})
        ev.save(a.save, overwrite=a.force)
    if a.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        _print_doctor(rep, console)
    return EXIT_OK


def cmd_probe(a) -> int:
    from . import probes

    if a.name not in probes.PROBES:
        print(f"unknown probe {a.name!r}; choose one of: {', '.join(probes.PROBES)}", file=sys.stderr)
        return EXIT_USAGE
    kwargs: dict[str, Any] = {}
    for kv in a.param or []:
        if "=" not in kv:
            print(f"--param takes KEY=VALUE, got {kv!r}", file=sys.stderr)
            return EXIT_USAGE
        k, v = kv.split("=", 1)
        try:
            kwargs[k] = json.loads(v)
        except json.JSONDecodeError:
            kwargs[k] = v
    console = _console(stderr=True)
    with _progress_status(console, not a.json) as st:
        st.update(f"probe {a.name}")
        m = probes.PROBES[a.name](**kwargs)
    print(json.dumps(m.to_dict(), indent=2, default=str) if a.json else m.summary())
    return EXIT_OK


def cmd_topo(a) -> int:
    from . import topology

    if a.file:
        text = Path(a.file).read_text()
        src = a.file
    else:
        text = topology.capture_topo_text()
        src = "nvidia-smi topo -m"
        if text is None:
            t = topology.from_nvml()
            if t is None:
                print("no nvidia-smi and no NVML here: pass a saved `nvidia-smi topo -m` "
                      "output with --file", file=sys.stderr)
                return EXIT_FAIL
            print(t.render())
            return EXIT_OK
    t = topology.parse_topo_matrix(text, source=src)
    print(json.dumps(t.to_dict(), indent=2) if a.json else t.render())
    return EXIT_OK


def cmd_evidence(a) -> int:
    from . import evidence

    if a.action == "list":
        for p in sorted(evidence.RECORDED_DIR.glob("*/*.json")):
            ev = evidence.load(p)
            print(f"{p.parent.name}/{p.stem}: {ev.kind}, {ev.label}")
        return EXIT_OK
    target = a.target or "doctor"
    p = Path(target)
    if p.suffix == ".json":
        ev = evidence.load(p)
    else:
        try:
            ev = evidence.recorded(target, a.device)
        except evidence.EvidenceError:
            ev = evidence.recorded(target, "cpu")
    if a.json:
        print(json.dumps(ev.to_dict(), indent=2, default=str))
        return EXIT_OK
    print(f"{ev.kind}: {ev.label.upper()} (not measured on this machine)")
    if ev.ceilings:
        c = ev.ceilings
        print(f"  ceilings: copy {c['copy_gbps']:,.0f} GB/s; GEMM " +
              ", ".join(f"{k} {v:,.1f} TFLOP/s" for k, v in c.get("gemm_tflops", {}).items()))
    for r in ev.results:
        print("  " + r.summary())
    return EXIT_OK


def cmd_lab(a) -> int:
    import subprocess

    root = Path(a.dir) if a.dir else _find_notebooks()
    if root is None:
        print("cannot find the notebooks/ folder: run from the hwlab checkout or pass --dir",
              file=sys.stderr)
        return EXIT_FAIL
    import importlib.util

    if importlib.util.find_spec("jupyterlab") is None:
        print("JupyterLab is not installed in this environment: pip install jupyterlab", file=sys.stderr)
        return EXIT_FAIL
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={root.parent}", f"--port={a.port}",
           str(Path(root.name) / "00_start_here.ipynb")]
    if a.no_browser:
        cmd.append("--no-browser")
    print("starting:", " ".join(cmd))
    if a.dry_run:
        return EXIT_OK
    return subprocess.call(cmd, cwd=root.parent)


def _find_notebooks() -> Path | None:
    for base in [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]]:
        if (base / "notebooks" / "00_start_here.ipynb").exists():
            return base / "notebooks"
    return None


def cmd_baseline(a) -> int:
    from . import baseline, evidence

    if a.action == "record":
        if not baseline.should_record_on_this_rank():
            print("not local rank 0: one process per node records the baseline", file=sys.stderr)
            return EXIT_OK
        console = _console(stderr=True)
        with _progress_status(console, True) as st:
            ev = baseline.record(quick=a.quick, progress=lambda s: st.update(f"baseline: {s}"))
        out = Path(a.out) if a.out and a.out.endswith(".json") else baseline.default_path(a.out or ".")
        ev.save(out, overwrite=a.force)
        print(f"baseline written to {out} ({len(ev.results)} probes; missing: "
              f"{', '.join(f'{k} ({v})' for k, v in ev.extra['missing'].items()) or 'none'})")
        return EXIT_OK
    if a.action == "compare":
        if not a.paths or len(a.paths) < 2:
            print("compare needs BASELINE.json NEW.json [NEW2.json ...]", file=sys.stderr)
            return EXIT_USAGE
        base = evidence.load(a.paths[0])
        if len(a.paths) > 2:
            for row in baseline.fleet_table(a.paths[1:], base):
                print(json.dumps(row))
            return EXIT_OK
        c = baseline.compare(base, evidence.load(a.paths[1]))
        if a.json:
            print(json.dumps({"ok": c.ok, "checked": c.checked,
                              "deviations": [d.__dict__ for d in c.deviations]}, indent=2, default=str))
        else:
            print(c.summary())
        return EXIT_OK if c.ok else EXIT_FAIL
    return EXIT_USAGE


def cmd_incident(a) -> int:
    from . import evidence, flowchart, incident

    ev = evidence.load(a.evidence) if a.evidence else None
    obs = json.loads(Path(a.observations).read_text()) if a.observations else {}
    d = flowchart.diagnose(obs)
    inc = incident.from_diagnosis(a.title, ev, d, symptom_scope=a.scope, symptom=a.symptom, fix=a.fix,
                                  reverify=a.reverify, rank_mapping=a.rank_mapping)
    md, js = incident.save(inc, a.out)
    print(f"incident written: {md} and {js}\n")
    print(d.explain())
    return EXIT_OK


def cmd_drill(a) -> int:
    import dataclasses

    from . import drills
    from .store import write_json_atomic

    if a.action == "new":
        d = drills.new(seed=a.seed, fault=a.fault)
        p = d.save(a.dir)
        print(f"drill {d.drill_id} written to {p}\nworkload: {d.workload}\nwhat the probes show "
              f"({d.source}):\n{json.dumps(d.observations, indent=2)}\nwalk the flowchart, then: "
              f"hwlab drill submit {p} --leaf LEAF --learner NAME")
        return EXIT_OK
    if a.action == "summary":
        grades = [drills.Grade(**json.loads(x.read_text())) for x in sorted(Path(a.dir).glob("grade-*.json"))]
        print(json.dumps(drills.class_summary(grades), indent=2))
        return EXIT_OK
    if not a.drill:
        print(f"drill {a.action} needs the drill's .json file", file=sys.stderr)
        return EXIT_USAGE
    d = drills.Drill.load(a.drill)
    if a.action == "reveal":
        print(json.dumps(drills.reveal(d), indent=2))
        return EXIT_OK
    if not a.leaf:
        print("submit needs --leaf (G, I, J, L, M or OK)", file=sys.stderr)
        return EXIT_USAGE
    ev = json.loads(Path(a.evidence).read_text()) if a.evidence else None
    g = drills.grade(d, a.leaf, ev, learner=a.learner)
    write_json_atomic(Path(a.dir) / f"grade-{d.drill_id}-{a.learner}-{g.at.replace(':', '')}.json",
                      dataclasses.asdict(g))
    print(("PASSED: " if g.passed else "NOT YET: ") + g.explanation)
    return EXIT_OK if g.passed else EXIT_FAIL


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hwlab", description="hardware-aware GPU troubleshooting kit")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="system state, topology, ceilings and a verdict")
    d.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    d.add_argument("--remeasure", action="store_true", help="re-measure the cached ceilings")
    d.add_argument("--quick", action="store_true", help="small sizes (seconds, less accurate)")
    d.add_argument("--save", metavar="PATH", help="also write an evidence record to PATH")
    d.add_argument("--force", action="store_true", help="replace PATH if it exists")
    d.set_defaults(fn=cmd_doctor)
    pr = sub.add_parser("probe", help="run one probe: " + ", ".join(
        ["hbm_copy", "host_link", "gemm", "launch_overhead"]))
    pr.add_argument("name")
    pr.add_argument("--param", "-p", action="append", metavar="KEY=VALUE",
                    help="probe argument, e.g. -p size_mib=512 -p dtype=bf16")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(fn=cmd_probe)
    t = sub.add_parser("topo", help="parse and show the GPU topology")
    t.add_argument("--file", help="a saved `nvidia-smi topo -m` output")
    t.add_argument("--json", action="store_true")
    t.set_defaults(fn=cmd_topo)
    e = sub.add_parser("evidence", help="show recorded evidence (labelled as recorded)")
    e.add_argument("action", choices=["show", "list"])
    e.add_argument("target", nargs="?", help="a record kind (doctor, lab01_bandwidth) or a .json path")
    e.add_argument("--device", default="h200")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_evidence)
    b = sub.add_parser("baseline", help="node health baseline: record, or compare against one")
    b.add_argument("action", choices=["record", "compare"])
    b.add_argument("paths", nargs="*", help="compare: BASELINE.json NEW.json [more NEW for a fleet table]")
    b.add_argument("--out", help="record: a .json path or a folder (default: ./baseline-<host>-<time>.json)")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--force", action="store_true")
    b.add_argument("--json", action="store_true")
    b.set_defaults(fn=cmd_baseline)
    i = sub.add_parser("incident", help="write the minimal incident record (Markdown + JSON)")
    i.add_argument("--title", required=True)
    i.add_argument("--scope", required=True, help="single-card, multi-GPU, training, inference or bucket")
    i.add_argument("--symptom", required=True)
    i.add_argument("--fix", required=True)
    i.add_argument("--reverify", required=True, help="which probe or bucket proves recovery")
    i.add_argument("--evidence", help="an evidence/baseline .json of the affected machine")
    i.add_argument("--observations", help="a .json of flowchart metrics (metric -> value)")
    i.add_argument("--rank-mapping", default="n/a")
    i.add_argument("--out", default="incidents")
    i.set_defaults(fn=cmd_incident)
    dr = sub.add_parser("drill", help="diagnosis drills: a hidden fault to find")
    dr.add_argument("action", choices=["new", "submit", "reveal", "summary"])
    dr.add_argument("drill", nargs="?", help="submit/reveal: the drill .json")
    dr.add_argument("--seed", type=int)
    dr.add_argument("--fault", help="instructor: choose the fault (see hwlab.drills.FAULTS)")
    dr.add_argument("--leaf")
    dr.add_argument("--evidence", help="submit: a .json of the metrics your diagnosis rests on")
    dr.add_argument("--learner", default="anonymous")
    dr.add_argument("--dir", default="drills", help="where drills and grades are kept")
    dr.set_defaults(fn=cmd_drill)
    lab = sub.add_parser("lab", help="open the labs in JupyterLab")
    lab.add_argument("--dir", help="the notebooks/ folder")
    lab.add_argument("--port", type=int, default=8888)
    lab.add_argument("--no-browser", action="store_true")
    lab.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    lab.set_defaults(fn=cmd_lab)
    return p


def main(argv: list[str] | None = None) -> int:
    from .evidence import EvidenceError
    from .measure import CorrectnessError, InputError, InsufficientMemoryError
    from .specs import UnknownGPUError
    from .store import RecordExistsError
    from .topology import TopologyParseError

    a = build_parser().parse_args(argv)
    try:
        return a.fn(a)
    except (EvidenceError, InputError, InsufficientMemoryError, TopologyParseError,
            RecordExistsError, UnknownGPUError, CorrectnessError, FileNotFoundError,
            ValueError, TypeError) as e:
        print(f"hwlab {a.cmd}: {e}", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
