"""What each leaf of the chart means: the cause it names, in one sentence, beside its actions (the fix).

The legend the ``hwlab flowchart`` command, the glossary and the drills' references print. It says what a
leaf *is*, never which lab, scenario or recording lands on it: that is each checkpoint's answer, shown
only after the learner has given theirs.
"""
from __future__ import annotations

#: leaf -> the cause it names (what is slow and why), as a reader checks their own walk against it
CAUSES: dict[str, str] = {
    "G": "the kernel moves more bytes than the work needs (unfused passes, uncoalesced or wasted sectors) "
         "or streams them at the memory's limit: time is set by DRAM traffic",
    "I": "the matmul does not run on the Tensor Cores at their rate: a dtype without an MMA path, shapes "
         "that miss its multiples, or a tile that does not map onto it",
    "J": "the SM is not kept busy: too few blocks or warps resident (registers, shared memory, spills), or "
         "launches too small and too many for the GPU to stay fed",
    "L": "one rank or link is slower than the others: traffic crossing a slow link (PCIe, SYS, another "
         "NUMA node), a bad rank-to-device map, or communication left on the critical path",
    "M": "the workload run in service differs from the one measured: other shapes or batch buckets, cold "
         "caches, or a fallback kernel taken for some of them",
    "OK": "nothing at this level is slow: the kernel is near its floor and nothing slows at scale, so the "
          "symptom is elsewhere (compare with the node's baseline)",
}


def cause(leaf_id: str) -> str:
    """The cause leaf ``leaf_id`` names ("" for an id that is not a leaf)."""
    return CAUSES.get(leaf_id, "")
