"""What a part on a leaf is told to do: J's sub-cause from measured figures (:func:`j_detail`),
the actions that fit the part's kind (:data:`PART_ACTIONS`), and the leaf's generic actions checked
against the machine (:func:`actions_for`).

**J, in detail.** A part landing on J is told which of launch, per-op overhead (a CPU), occupancy,
registers or memory latency it is, from measured figures: the idle share, the CPU's measured cost per
aten op times the part's ops (:mod:`hwlab.examine.op_overhead`), the profiler's kernel records (Kineto's
estimated achieved occupancy, registers per thread, warps per SM) or Nsight Compute's counted
occupancy where ``--ncu`` ran, and the achieved bandwidth against the copy ceiling. Thresholds
(and why) are in :data:`J_RULES`. The rules match the part's kind: "memory latency" (scattered,
short requests) is a diagnosis of gathers and elementwise passes; a dense GEMM part on J (its floor
its FLOPs, or near them: :func:`hwlab.examine.part_walk.near_ridge`) is below its GEMM ceiling for another reason, named by
:data:`GEMM_J_RULE` (shapes, threads, the library's per-call overhead), never "random rows".

**Fixes checked against the machine.** A dtype fix (the I leaf's "run the matmul in bf16") is
offered only where the machine runs bf16 natively and faster than fp32
(:func:`hwlab.core.ceilings.bf16_gain`); elsewhere it is replaced by a line saying why not.
"""
from __future__ import annotations

from typing import Any, Callable

from hwlab.diagnosis.flowchart import LEAVES
from hwlab.examine.part_record import Part
from hwlab.examine.part_walk import near_ridge

#: J's sub-causes: (name, rule, why). Checked in this order; the first that holds is named.
J_RULES = (
    ("launch", "idle share >= 50% of the step",
     "the GPU waits on the host for half the step or more: fewer, larger launches (CUDA graph, fusion)"),
    ("per-op overhead", "CPU: aten ops dispatched per call x the measured per-op cost >= 50% of the part's time",
     "each aten op pays the framework's dispatch and output allocation before any work: half the part's time "
     "or more goes to getting to the work; fewer, larger ops (vectorise the loop, batch, fuse with "
     "torch.compile)"),
    ("registers", "spills > 0, or >= 128 registers per thread",
     "at 128 registers per thread a Hopper/Ampere SM holds at most 16 of its 64 warps (65536 registers): "
     "too few to hide memory latency; spills add local-memory traffic on top"),
    ("occupancy", "achieved occupancy < 25% (counted by Nsight Compute where it ran, else Kineto's estimate)",
     "under a quarter of the SM's warp slots in use: too little parallel work in flight (small grid, "
     "large blocks, shared memory)"),
    ("memory latency", "occupancy >= 25% but achieved bandwidth < 30% of the copy ceiling",
     "warps are resident but each waits on scattered, short memory requests: random rows or indices; "
     "the bytes in flight are too few to fill the memory pipe"),
)
#: actions that fit a part better than the leaf's generic list, (part prefix, leaf) -> actions
PART_ACTIONS = {
    ("gather/scatter", "J"): (
        "sort (or bucket) the indices so neighbouring threads read neighbouring rows",
        "batch the lookups into one larger gather, so more requests are in flight per SM",
        "widen the rows (>= 128 bytes each: pack several fields or use a wider dtype per row) so each "
        "request fills whole cache lines"),
    ("gather/scatter", "G"): (
        "sort the indices so each warp reads contiguous rows (coalesced)",
        "widen the rows to whole 32-byte sectors (or 128-byte lines)"),
    ("elementwise/reduction", "G"): (
        "fuse the chain (torch.compile, or one Triton kernel) so each tensor crosses DRAM once",),
    ("copy/concat", "J"): (
        "grow the KV cache in place (a preallocated static cache written at the step's position) instead of "
        "concatenating a new copy of it every step",),
    ("copy/concat", "G"): (
        "write into a preallocated buffer instead of concatenating (a static KV cache), or fuse the copy "
        "into its producer",),
    ("gpu idle", "J"): (
        "capture the step in a CUDA graph (torch.compile mode='reduce-overhead') so launches cost nothing",
        "fuse small kernels (torch.compile) so there are fewer launches"),
    ("host outside ops", "J"): (
        "move the Python between ops out of the loop, or compile the function (torch.compile)",),
}
#: J for a dense GEMM part whose floor is its FLOPs: (name, rule, why)
GEMM_J_RULE = ("GEMM efficiency", "a GEMM part on J: FLOPs set its floor and tensor-core use is not low",
               "the matmuls run at a fair share of the GEMM ceiling yet far from their floor: small or skinny "
               "shapes (one of M, N, K small), many short calls paying the library's per-call overhead, or "
               "fewer threads than the ceiling had; batch the matmuls or grow them, and check the threads")
#: the leaf actions that advise a lower-precision dtype (checked against the machine)
DTYPE_ACTION_WORDS = ("bf16",)


def actions_for(p: Part, leaf: str, bf16_ok: Callable[[], tuple[bool, str]] | None = None) -> list[str]:
    """The part's actions on ``leaf``: those that fit its kind first, then the leaf's; a bf16 action
    only where ``bf16_ok()`` (:func:`hwlab.core.ceilings.bf16_gain`) says the machine gains from it."""
    fit = next((v for (pre, lf), v in PART_ACTIONS.items() if p.name.startswith(pre) and lf == leaf), ())
    out = list(fit)
    for a in LEAVES[leaf].actions:
        if bf16_ok is not None and any(w in a for w in DTYPE_ACTION_WORDS):
            ok, why = bf16_ok()
            if not ok:
                out.append(f"not bf16 here ({why}): keep fp32, and fix the shapes or the path instead")
                p.notes.append(f"the leaf's bf16 advice is withheld: {why}")
                continue
        out.append(a)
    return out


def j_detail(part: Part, idle_pct: float | None, copy_gbps: float | None, n_spills: int | None,
             ncu: dict[str, Any] | None, kernel_args: list[tuple[float, dict]],
             per_op: dict[str, Any] | None = None) -> dict[str, Any]:
    """Which of :data:`J_RULES` a part on J meets, from measured figures (each with its source).
    ``per_op``: a CPU's measured cost per aten op (:func:`hwlab.examine.op_overhead.per_op_us`)."""
    from hwlab.examine.op_overhead import PER_OP_SHARE_MIN, per_op_share

    figures: dict[str, Any] = {}
    sources: dict[str, str] = {}
    op_share = per_op_share(part.n_ops, part.t_ms, per_op) if part.name != "host outside ops" else None
    if op_share is not None:
        figures["per_op_overhead_pct"] = 100.0 * op_share
        sources["per_op_overhead_pct"] = (f"{part.n_ops} aten ops per call (as dispatched) x {per_op['us']:.3g} us "
                                          "per op "
                                          f"({per_op['source']}) over the part's time")

    def tw(key: str) -> float | None:
        pairs = [(us, float(a[key])) for us, a in kernel_args if isinstance(a.get(key), (int, float))]
        tot = sum(us for us, _ in pairs)
        return sum(us * v for us, v in pairs) / tot if tot else None

    occ, regs, warps = tw("est. achieved occupancy %"), tw("registers per thread"), tw("warps per SM")
    if occ is not None:
        figures["occupancy_pct_estimated"], sources["occupancy_pct_estimated"] = occ, \
            "Kineto kernel records: est. achieved occupancy % (time-weighted)"
    if regs is not None:
        figures["registers_per_thread"], sources["registers_per_thread"] = regs, "Kineto kernel records"
    if warps is not None:
        figures["grid_warps_per_sm"], sources["grid_warps_per_sm"] = warps, \
            "Kineto kernel records (the grid's warps over the SMs, not resident warps; time-weighted)"
    if ncu:
        if ncu.get("warps_active_pct") is not None:
            figures["occupancy_pct_counted"] = ncu["warps_active_pct"]
            sources["occupancy_pct_counted"] = "counted by Nsight Compute (sm__warps_active)"
        if ncu.get("registers_per_thread_max") is not None:
            figures["registers_per_thread"] = ncu["registers_per_thread_max"]
            sources["registers_per_thread"] = "counted by Nsight Compute (launch__registers_per_thread)"
    if idle_pct is not None:
        figures["idle_pct"], sources["idle_pct"] = idle_pct, "GPU idle share of the step (profiler)"
    if n_spills is not None:
        figures["n_spills"], sources["n_spills"] = n_spills, "Triton compiled-kernel metadata (ptxas)"
    bw_pct = 100.0 * part.gbps / copy_gbps if part.gbps is not None and copy_gbps else None
    if bw_pct is not None:
        figures["bandwidth_pct_of_copy"], sources["bandwidth_pct_of_copy"] = bw_pct, \
            "the part's moved bytes (traffic model) / its time vs the measured copy ceiling (estimated)"
    occ_any = figures.get("occupancy_pct_counted", figures.get("occupancy_pct_estimated"))
    dense_gemm = part.floor_source.startswith("FLOPs") or near_ridge(part)
    checks = (
        ("launch", part.name in ("gpu idle", "host outside ops") or (idle_pct is not None and idle_pct >= 50)),
        ("per-op overhead", op_share is not None and op_share >= PER_OP_SHARE_MIN),
        ("registers", (n_spills or 0) > 0 or (figures.get("registers_per_thread") or 0) >= 128),
        ("occupancy", occ_any is not None and occ_any < 25.0),
        ("memory latency", not dense_gemm and (occ_any is None or occ_any >= 25.0) and bw_pct is not None
         and bw_pct < 30.0),
        (GEMM_J_RULE[0], dense_gemm),
    )
    cause = next((n for n, ok in checks if ok), None)
    rule = {n: (r, w) for n, r, w in (*J_RULES, GEMM_J_RULE)}
    if cause is None:
        return {"cause": "not decided", "rule": "none of the J rules holds on the figures measured",
                "why": "read the compiler report (registers, spills) or run with --ncu",
                "figures": figures, "sources": sources}
    return {"cause": cause, "rule": rule[cause][0], "why": rule[cause][1], "figures": figures, "sources": sources}

