"""A real slow link on one machine, and the experiments that run over it.

Ranks run as separate processes speaking gloo over TCP; the ranks of one "island" run inside
a network namespace reached through a veth pair rate-limited with ``tbf`` (:class:`SlowLink`),
so traffic between islands really crosses a slower link. That needs root and iproute2;
elsewhere :class:`SlowLinkUnavailable` says so.

:func:`experiment` runs six ranks (0-3 on the host, 4-5 behind the link) with the naive
mapping (two TP groups straddle the link, as after a reorder of ordinals), the topology-aware
one from :func:`hwlab.core.mapping.choose_tp_groups`, the devices alone, and optionally the
overlapped block and the regressed kernel, all interleaved in one launch. :func:`sweep` runs
it at several rates; :func:`calibrate_rate` picks the rate at which the naive mapping's
throughput is the seed's 0.72x of the aware one.
"""
from __future__ import annotations

import math
import os
import secrets
import shutil
import subprocess
from typing import Any

from hwlab.core.mapping import choose_tp_groups, evaluate
from hwlab.core.topology import Topology
from hwlab.labs.crosslink.block import single_device_baseline
from hwlab.labs.crosslink.overlap import overlap_report
from hwlab.labs.crosslink.stragglers import launch_phases, phase_view
from hwlab.labs.crosslink.report import flowchart_evidence, paired_ratio, straggler_report
from hwlab.core.measure import spread_of

#: the seed's case: throughput fell to 0.72x; tail ranks finish 10-20 ms late
SEED_RATIO, SEED_RATIO_BAND, SEED_TAIL_MS = 0.72, 0.08, (10.0, 20.0)
#: six gloo ranks: 0-3 on the host, 4-5 behind the rate-limited veth (a second "island")
SLOW_RANKS = (4, 5)
WORLD = 6
#: the mapping after a reorder of ordinals: two TP groups straddle the slow link
NAIVE_GROUPS = [[0, 1], [2, 4], [3, 5]]
#: the link rates the sweep runs (Mbit/s, both directions)
SWEEP_RATES_MBIT = (100, 200, 400, 800, 1600, 3200)
#: the first, obvious example's link
EXTREME_RATE_MBIT = 100
#: the block's sizes in the slow-link runs: a 1 MiB TP all-reduce and a small compute per rank
#: (its time alone is recorded with every run), so six ranks on a small shared CPU spend most of
#: a step waiting on links rather than competing for cores
SIZES = {"hidden": 1024, "ffn": 1024, "batch": 256}
#: the overlap runs use the same block
OVERLAP_SIZES = SIZES
#: the "fast link" of the overlap comparison: the same veth shaped high enough that one
#: all-reduce of the block takes less than its compute
FAST_RATE_MBIT = 1600


class SlowLinkUnavailable(RuntimeError):
    pass


class SlowLink:
    """A network namespace behind a veth pair, both ends shaped with ``tbf`` to ``rate``.

    Ranks started with :meth:`wrap` inside the namespace reach the host side only through the
    shaped veth; ranks inside it talk to each other over the namespace's own loopback. Names
    are unique per instance; :meth:`close` (or the context manager) removes everything.
    """

    def __init__(self, rate: str = "200mbit", burst: str = "64kb", latency: str = "100ms"):
        if os.geteuid() != 0:
            raise SlowLinkUnavailable("needs root to create a network namespace (ip netns)")
        if not (shutil.which("ip") and shutil.which("tc")):
            raise SlowLinkUnavailable("needs iproute2 (ip, tc)")
        tag = secrets.token_hex(3)
        self.ns = f"hwslow{tag}"
        self.host_if, self.ns_if = f"vh{tag}", f"vs{tag}"
        octet = 100 + int(tag[:2], 16) % 100
        self.host_ip, self.ns_ip = f"10.{octet}.{int(tag[2:4], 16)}.1", f"10.{octet}.{int(tag[2:4], 16)}.2"
        self.rate, self.burst, self.latency = rate, burst, latency
        self._up = False

    def _sh(self, *cmd: str) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SlowLinkUnavailable(f"{' '.join(cmd)} failed: {r.stderr.strip()}")

    def open(self) -> "SlowLink":
        try:
            self._sh("ip", "netns", "add", self.ns)
            self._up = True
            self._sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            self._sh("ip", "link", "set", self.ns_if, "netns", self.ns)
            self._sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            self._sh("ip", "link", "set", self.host_if, "up")
            self._sh("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if)
            self._sh("ip", "netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up")
            self._sh("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
            if self.rate:
                tbf = ["root", "tbf", "rate", self.rate, "burst", self.burst, "latency", self.latency]
                self._sh("tc", "qdisc", "add", "dev", self.host_if, *tbf)
                self._sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "add", "dev", self.ns_if, *tbf)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._up:
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)  # removes both veth ends
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
            self._up = False

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
        return False

    def wrap(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *cmd]




def island_topology(world: int, slow_ranks: tuple[int, ...]):
    """The ranks as a topology: loopback pairs are 'NODE', pairs across the veth are 'SYS'."""
    names = [f"GPU{r}" for r in range(world)]
    t = Topology(gpus=names, source="gloo ranks: host loopback vs rate-limited veth")
    for a in range(world):
        for b in range(world):
            t.links[(names[a], names[b])] = ("X" if a == b else
                                              "SYS" if (a in slow_ranks) != (b in slow_ranks) else "NODE")
        t.numa_affinity[names[a]] = 1 if a in slow_ranks else 0
    return t


def aware_groups(tp: int = 2) -> list[list[int]]:
    """The chooser's TP groups on the ranks' topology (loopback pairs NODE, veth pairs SYS)."""
    topo = island_topology(WORLD, SLOW_RANKS)
    return [[int(g[3:]) for g in grp] for grp in choose_tp_groups(topo, tp)]


def crossing_ranks(groups: list[list[int]]) -> list[int]:
    """Ranks whose TP group straddles the slow link."""
    return sorted(r for g in groups if len({r in SLOW_RANKS for r in g}) > 1 for r in g)


HIDDEN_DEFINITION = ("hidden_pct = 100 * (t_comm_alone + t_compute_alone - t_overlapped) / "
                     "min(t_comm_alone, t_compute_alone): saved time over what could hide; per round the pair's "
                     "slower member, medians over rounds, same launch")


def rederive_overlap(ovl: dict[str, Any]) -> dict[str, Any]:
    """Re-read a recorded overlap measurement (:func:`overlap_experiment`'s output) through the
    current :func:`~.overlap.hidden_pct`: every repeat's report from its raw per-rank series,
    then each side's median repeat again."""
    if not ovl:
        return ovl
    ovl["definition"] = HIDDEN_DEFINITION
    for name in ("fast", "slow"):
        if name not in ovl:
            continue
        side = ovl[name]
        reps = [side] + list(side.get("other_repeats", []))
        fresh = []
        for r in reps:
            rep = overlap_report(r["ranks_raw"], r["mapping"], r["ranks"])
            rep.update({k: r[k] for k in ("rate_mbit", "link", "ranks_raw") if k in r})
            fresh.append(rep)
        mid = sorted(fresh, key=lambda r: r["hidden_pct"])[len(fresh) // 2]
        ovl[name] = {**mid, "hidden_pct_repeats": [r["hidden_pct"] for r in fresh],
                     "other_repeats": [r for r in fresh if r is not mid]}
    return ovl


def overlap_experiment(rate_mbit: float, *, fast_rate_mbit: float | None = FAST_RATE_MBIT, steps: int = 20,
                       repeats: int = 3, hidden: int = OVERLAP_SIZES["hidden"], ffn: int = OVERLAP_SIZES["ffn"],
                       batch: int = OVERLAP_SIZES["batch"], micro: int = 4,
                       timeout_s: float = 600.0) -> dict[str, Any]:
    """Hidden share of the TP all-reduce (:mod:`.overlap`) for one pair of ranks across the veth
    shaped to ``fast_rate_mbit`` (skipped when None) and to ``rate_mbit``: launches of two ranks
    (rank 1 behind the link), each timing compute alone, all-reduces alone and both overlapped,
    round by round; fast and slow launches alternate ``repeats`` times and each side reports its
    median repeat, every repeat's figure kept (``hidden_pct_repeats``): on a shared CPU one
    launch's figure moves with the load of everything else on the machine.

    Two ranks, not six: with six processes on a small CPU the compute is stretched by time
    sharing while the wire time is not, which would flatter the slow link. The fast link is the
    same veth at a high rate, not loopback: an unshaped transfer on a CPU is itself CPU work
    (kernel TCP copies) competing with the compute for the same cores."""
    phases = ["ovl_comp", "ovl_comm:pair", "ovl_both:pair"]
    out: dict[str, Any] = {"micro": micro, "steps": steps, "repeats": repeats,
                           "sizes": {"hidden": hidden, "ffn": ffn, "batch": batch},
                           "definition": HIDDEN_DEFINITION}
    sides = [("fast", fast_rate_mbit)] if fast_rate_mbit else []
    sides.append(("slow", rate_mbit))
    runs: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for _ in range(repeats):
        for name, rate in sides:
            with SlowLink(rate=f"{rate:g}mbit") as link:
                res = launch_phases(2, {"pair": [[0, 1]]}, phases, slow=link, slow_ranks=(1,), steps=steps,
                                    hidden=hidden, ffn=ffn, batch=batch, micro=micro, timeout_s=timeout_s)
            rep = overlap_report(res, "pair", [0, 1])
            rep.update(rate_mbit=rate, link=f"veth shaped to {rate:g} Mbit/s", ranks_raw=res)
            runs[name].append(rep)
    for name, reps in runs.items():
        mid = sorted(reps, key=lambda r: r["hidden_pct"])[len(reps) // 2]
        out[name] = {**mid, "hidden_pct_repeats": [r["hidden_pct"] for r in reps],
                     "other_repeats": [r for r in reps if r is not mid]}
    return out


def experiment(rate_mbit: float = EXTREME_RATE_MBIT, *, steps: int = 15, overlap: bool = True,
               regressed: bool = False, hidden: int = SIZES["hidden"], ffn: int = SIZES["ffn"],
               batch: int = SIZES["batch"], micro: int = 4,
               baselines: dict[str, dict] | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Naive vs topology-aware TP groups over a real link shaped to ``rate_mbit``, in one launch.

    Returns per mapping the straggler report, the mapping's link analysis and the flowchart
    evidence (B from the block alone in one process, D from the paired devices-alone step, K
    from the per-rank tail); the naive throughput over the aware one, paired round by round;
    with ``regressed`` the counter-example (aware mapping, regressed kernel on every rank, in
    the same launch); with ``overlap`` the hidden share on a fast and on this slow link
    (:func:`overlap_experiment`), shown on the walks; and the raw per-rank series (``ranks``)
    from which the rest re-derives."""
    topo = island_topology(WORLD, SLOW_RANKS)
    aware = aware_groups()
    mappings = {"naive": NAIVE_GROUPS, "aware": aware}
    phases = ["solo", "step:aware", "step:naive"]
    if regressed:
        phases += ["solo:regressed", "step:aware:regressed"]
    sizes = {"hidden": hidden, "ffn": ffn, "batch": batch, "tp": 2}
    base = dict(baselines or {})
    for kernel in ("healthy", "regressed") if regressed else ("healthy",):
        if kernel not in base:
            base[kernel] = single_device_baseline(kernel, **sizes)
    with SlowLink(rate=f"{rate_mbit:g}mbit") as link:
        res = launch_phases(WORLD, mappings, phases, slow=link, slow_ranks=SLOW_RANKS, steps=steps,
                            hidden=hidden, ffn=ffn, batch=batch, timeout_s=timeout_s)
    out: dict[str, Any] = {"world": WORLD, "slow_ranks": list(SLOW_RANKS), "rate": f"{rate_mbit:g}mbit",
                           "rate_mbit": rate_mbit, "tp": 2, "steps": steps, "phases": phases,
                           "sizes": {**sizes, "allreduce_bytes": batch * hidden * 4},
                           "topology": topo.to_dict(), "single_device": base, "ranks": res}
    # the overlap comparison needs a fast link clearly faster than this one; at or near the fast
    # rate only this link's own hidden share is measured
    fast = FAST_RATE_MBIT if FAST_RATE_MBIT >= 4 * rate_mbit else None
    if overlap:
        out["overlap"] = overlap_experiment(rate_mbit, fast_rate_mbit=fast, micro=micro, timeout_s=timeout_s)
    return analyse(out)


def analyse(out: dict[str, Any]) -> dict[str, Any]:
    """Everything :func:`experiment` derives, from what it measured (``ranks``: the per-rank
    series; ``single_device``: the block alone; ``overlap``): reports, walks' evidence, ratios.
    Recorded runs re-derive through this, so a changed rule re-reads the same measurements."""
    res, base, ovl = out["ranks"], out["single_device"], rederive_overlap(out.get("overlap", {}))
    topo = island_topology(WORLD, SLOW_RANKS)
    mappings = {"naive": NAIVE_GROUPS, "aware": aware_groups()}
    solo = phase_view(res, "solo")
    views = {}
    for name, groups in mappings.items():
        view = phase_view(res, f"step:{name}")
        views[name] = view
        rep = straggler_report(view)
        side = ovl.get("fast" if name == "aware" else "slow", {})
        hid = side.get("hidden_pct")
        ev = flowchart_evidence(base["healthy"], view, solo, rep, overlap_hidden_pct=hid,
                                overlap_comm_alone_ms=side.get("t_comm_alone_ms"),
                                overlap_compute_alone_ms=side.get("t_compute_alone_ms"))
        if hid is not None:
            ev["metric_sources"]["overlap_hidden_pct"] = (
                f"micro-batched block with async all-reduces over the {'fast' if name == 'aware' else 'slow'} "
                "link: 100*(comm alone + compute alone - overlapped)/min(comm alone, compute alone), two ranks, "
                "same launch")
            sp = spread_of(side.get("hidden_pct_repeats", []), "launches")
            if sp:
                ev["metric_spreads"]["overlap_hidden_pct"] = sp
        out[name] = {"groups": groups, "report": rep.to_dict(), "flowchart_evidence": ev,
                     "mapping": evaluate(topo, [[f"GPU{r}" for r in g] for g in groups]).to_dict()}
    out["throughput_naive_over_aware"] = paired_ratio(views["aware"], views["naive"])
    out["speedup_aware_over_naive"] = 1.0 / out["throughput_naive_over_aware"]
    if "step:aware:regressed" in out["phases"]:
        view = phase_view(res, "step:aware:regressed")
        rep = straggler_report(view)
        ev = flowchart_evidence(base["regressed"], view, phase_view(res, "solo:regressed"), rep)
        out["regressed"] = {"groups": mappings["aware"], "report": rep.to_dict(), "flowchart_evidence": ev,
                            "slowdown_vs_aware": paired_ratio(view, views["aware"])}
    return out


def sweep(rates_mbit=SWEEP_RATES_MBIT, *, steps: int = 10, **kw: Any) -> list[dict[str, Any]]:
    """One :func:`experiment` (no overlap, no regressed kernel) per link rate; the block alone is
    measured once and shared. Each point keeps its raw per-rank series."""
    sizes = {**SIZES, **{k: kw[k] for k in ("hidden", "ffn", "batch") if k in kw}}
    base = {"healthy": single_device_baseline("healthy", **sizes, tp=2)}
    return [experiment(r, steps=steps, overlap=False, baselines=base, **kw) for r in rates_mbit]


def calibrate_rate(points: list[tuple[float, float]], target: float = SEED_RATIO) -> float:
    """The link rate (Mbit/s) at which throughput naive/aware reaches ``target``: linear in
    log(rate) between the two measured points that bracket it (the ratio rises with the rate);
    outside the measured range, the nearest end's slope."""
    pts = sorted(points)
    if len(pts) < 2:
        raise ValueError("calibration needs at least two measured rates")
    pairs = list(zip(pts, pts[1:]))
    for (r0, y0), (r1, y1) in pairs:
        if min(y0, y1) <= target <= max(y0, y1) and y0 != y1:
            break
    else:
        (r0, y0), (r1, y1) = pairs[0] if target < pts[0][1] else pairs[-1]
        if y0 == y1:
            raise ValueError(f"ratio flat at {y0:.2f}: cannot calibrate")
    f = (target - y0) / (y1 - y0)
    return math.exp(math.log(r0) + f * (math.log(r1) - math.log(r0)))


def in_seed_band(ratio: float) -> bool:
    return abs(ratio - SEED_RATIO) <= SEED_RATIO_BAND


def seed_scale(aware_step_ms: float, tail_ms: float) -> dict[str, Any]:
    """How the CPU run's tail compares with the seed's 10-20 ms, with the scale factor stated.

    At 0.72x, a tail that explains the whole loss is ``(1/0.72 - 1) = 0.39`` of the healthy
    step, so the seed's 10-20 ms tail implies a healthy step of ~26-51 ms. The CPU block's
    step is whatever this machine gives (it stretches under load); ``scale`` maps its step onto
    the middle of that range, and ``tail_ms_at_seed_scale`` is the measured tail times it."""
    lo, hi = (t / (1.0 / SEED_RATIO - 1.0) for t in SEED_TAIL_MS)
    scale = (lo + hi) / 2 / aware_step_ms
    return {"seed_step_ms_range": [lo, hi], "cpu_aware_step_ms": aware_step_ms, "scale": scale,
            "tail_ms": tail_ms, "tail_ms_at_seed_scale": tail_ms * scale,
            "tail_pct_of_aware_step": 100.0 * tail_ms / aware_step_ms}
