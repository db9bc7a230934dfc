"""Lab 3, cross-link tensor parallelism: a TP block, per-rank step times, stragglers, a real
slow link, overlap, and the counter-example where a kernel regressed on every rank.

Each rank runs the TP block (:mod:`.block`) as its own process over ``torch.distributed``
(:mod:`.ranks`): compute, the TP all-reduce inside its group, then a small data-parallel sync
over all ranks, so a slow TP group holds every rank. That is the seed's signature: a local
rank tail plus collective wait everywhere else, while each card alone is fine.
:mod:`.report` names the tail ranks, how late they finish and each rank's communication wait,
and builds the flowchart evidence from measured metrics only. :mod:`.slowlink` builds a real
rate-limited link (netns + veth + tbf) and runs the experiments over it; :mod:`.overlap`
measures how much communication the micro-batched block hides; :mod:`.comms` launches the
collectives and holds the one-GPU PCIe-staged step (route parsing, the P2P matrix and bus
bandwidth are core: :mod:`hwlab.core.comms`; the tail and spike rules too: :mod:`hwlab.core.tails`); :mod:`.grading` the exercise's
checkers. ``python -m hwlab.labs.crosslink`` is one rank (:mod:`.__main__`).
"""
# core names the lab's notebooks, exercises and tests reach as ``lab.<name>`` (hwlab.core.comms, hwlab.core.tails)
from hwlab.core.comms import (
    FORCE_SLOW_ROUTE, NCCL_SAFE_ENV, ROUTE_PATTERNS, busbw_table, needs_gpus, nccl_routes, p2p_matrix_gbps)
from hwlab.core.tails import SPIKE_OVER_MEDIAN, TAIL_JUMP, spikes
from hwlab.labs.crosslink.block import (
    KERNELS, block_partial, block_partial_regressed, block_reference, block_work, partial_fn,
    cpu_ceilings_one_core, make_weights, shard, single_device_baseline)
from hwlab.labs.crosslink.staged import collectives, run_collectives, single_gpu_tp_step
from hwlab.labs.crosslink.grader import grade_mapping, grade_straggler, grade_suspect
from hwlab.labs.crosslink.overlap import OVERLAP_FAILED_PCT, hidden_pct, overlap_report
from hwlab.labs.crosslink.overlap import shown as overlap_shown
from hwlab.labs.crosslink.stragglers import (
    DP_SYNC_ELEMS, launch, launch_phases, parse_groups, phase_view, run_rank)
from hwlab.labs.crosslink.report import (
    StragglerReport, aware_walk_note, flowchart_evidence, paired_ratio, rank_tail_pct, signature_row,
    straggler_report)
from hwlab.labs.crosslink.slowlink import (
    NAIVE_GROUPS, SEED_RATIO, SEED_RATIO_BAND, SEED_TAIL_MS, SLOW_RANKS, EXTREME_RATE_MBIT, FAST_RATE_MBIT,
    OVERLAP_SIZES, SIZES, SWEEP_RATES_MBIT, WORLD, SlowLink, SlowLinkUnavailable, aware_groups, analyse,
    calibrate_rate, crossing_ranks, experiment, in_seed_band, island_topology, overlap_experiment,
    seed_scale, sweep)

#: the name earlier notebooks used for :func:`experiment`
slowlink_experiment = experiment
