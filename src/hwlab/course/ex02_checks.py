"""Exercise 02: a spill-free tile and the limit that binds it (:func:`check_limiter`), then Lab 2's row
softmax: blocks per SM and the binding limit at a short row (:func:`check_occupancy_prediction`), and
the warps count that fills the SM at a long one (:func:`check_warps_choice`), all from the static sm_90a
``ptxas -v`` report and :mod:`hwlab.labs.registers.occupancy`. A wrong answer is told what it
contradicts, never the count; a wrong warps count gets no figure of its own try, so trying every count
teaches nothing the reasoning would not."""
from __future__ import annotations

from hwlab.course.exercise import ExerciseResult, not_done
from hwlab.course.toolchain_check import environment_problem, toolchain_problem
from hwlab.course.toolchain_check import toolchain_words as _toolchain_words
from hwlab.course.tries import Reference, graded

LIMITERS = {"registers": "registers", "register": "registers", "regs": "registers",
            "shared memory": "shared_mem", "shared_mem": "shared_mem", "smem": "shared_mem", "shared": "shared_mem",
            "warps": "warps", "warp": "warps", "threads": "warps", "spills": "spills", "spill": "spills"}


#: a reason is a sentence, not a list of every figure in the report: at most this many numbers
REASON_MAX_NUMBERS = 6
_RESOURCE_WORDS = {"registers": ("register",), "shared_mem": ("shared",), "warps": ("warp", "thread")}


def reason_figures(key: str, rep, cfg) -> set[float]:
    """The compile report's figures for resource ``key`` that a reason may quote: registers per
    thread; shared memory in B, KiB or KB; warps per block or threads per block."""
    if key == "registers":
        return {float(rep.n_regs)}
    if key == "shared_mem":
        b = float(rep.shared_bytes)
        return {b, round(b / 1024), round(b / 1024, 1), round(b / 1000), round(b / 1000, 1)}
    if key == "warps":
        return {float(cfg.warps), float(cfg.warps * 32)}
    return set()


def reason_problem(reason: str, key: str, rep, cfg) -> str | None:
    """What MY_REASON lacks, or None: it must name the limiting resource and quote that resource's
    figure from the compile report (:func:`reason_figures`), in a sentence (at most
    :data:`REASON_MAX_NUMBERS` numbers, so a list of every figure does not pass). The message
    says what is missing, never the figure itself."""
    import re

    text = str(reason).lower()
    nums = [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*(?:\.\d+)?", text)]
    if len(nums) > REASON_MAX_NUMBERS:
        return (f"quotes {len(nums)} numbers: write one sentence with the figure that matters "
                f"(at most {REASON_MAX_NUMBERS} numbers)")
    words = _RESOURCE_WORDS.get(key, ())
    if words and not any(w in text for w in words):
        return "does not name the resource that limits the occupancy"
    figs = reason_figures(key, rep, cfg)
    if figs and not any(any(abs(n - f) < 0.05 for f in figs) for n in nums):
        return ("does not quote that resource's figure from the compile report (the static sm_90a compile "
                "of your config: registers per thread, shared memory per block, or warps per block)")
    return None


def limiter_reference(cfg, limiter=None, reason=None, device=None) -> Reference:
    """What passes :func:`check_limiter` for ``cfg``: the blocks per SM and the limit that binds, from
    its static sm_90a compile (or, where it spills or does not compile, that no limiter passes)."""
    from hwlab.labs import registers

    rep = registers.compile_guarded("matmul", cfg, static=True)
    if rep.skipped or rep.n_spills:
        return Reference(how=f"{cfg.label} does not compile for sm_90a without spills, so no limiter passes: "
                             "pick a tile whose accumulator fits the registers first")
    occ = rep.occupancy(cfg.warps)
    return Reference({"blocks per SM": occ.blocks_per_sm, "the limit that binds": " and ".join(occ.binding)},
                     how="MY_REASON names that resource and quotes its figure from the compile report")


@graded(limiter_reference)
def check_limiter(cfg, limiter: str | None, reason: str | None, device=None) -> ExerciseResult:
    """Exercise 02's checker: the config compiles for sm_90a without spills, the learner's
    named limiter is one that binds in its occupancy, and (GPU) it reaches the speed band of
    :func:`hwlab.labs.registers.grade_config`."""
    from hwlab.labs import registers
    from hwlab.core.measure import device_of

    name = "spill-free tile and its limiter"
    if cfg is None or not limiter or not reason:
        return not_done(name, "Set MY_CONFIG, MY_LIMITER (registers / shared memory / warps / spills) "
                              "and MY_REASON.")
    key = LIMITERS.get(str(limiter).strip().lower())
    if key is None:
        return ExerciseResult(name, "wrong", f"MY_LIMITER = {limiter!r}: name one of registers, shared "
                              "memory, warps, spills")
    problem = toolchain_problem(static_compile=True)
    if problem:
        return environment_problem(name, problem)
    rep = registers.compile_guarded("matmul", cfg, static=True)
    if rep.skipped:
        if _toolchain_words(rep.skipped):
            return environment_problem(name, f"the sm_90a compile could not run ({rep.skipped})")
        return ExerciseResult(name, "wrong", f"{cfg.label} did not compile for sm_90a: {rep.skipped}")
    facts = (f"{cfg.label}: {rep.n_regs} registers/thread, {rep.n_spills} spill slots, "
             f"{rep.shared_bytes} B shared memory (static sm_90a compile, ptxas -v)")
    if rep.n_spills:
        return ExerciseResult(name, "wrong", f"{facts}: it still spills; the accumulator alone is "
                              f"{cfg.acc_regs_per_thread:.0f} registers/thread.")
    try:
        occ = rep.occupancy(cfg.warps)
    except ValueError as e:
        return ExerciseResult(name, "wrong", f"{facts}: {e}")
    binds = ", ".join(occ.binding)
    bad_reason = reason_problem(reason, key, rep, cfg)
    if key in occ.binding and bad_reason:
        return ExerciseResult(name, "wrong", f"MY_LIMITER matches; MY_REASON {bad_reason}")
    if key == "spills":
        return ExerciseResult(name, "wrong", f"{facts}: nothing spills, so spills do not limit it; work out the "
                              "blocks per SM each other resource allows.")
    if key not in occ.binding:  # what the named limit allows, never which limit binds
        return ExerciseResult(name, "wrong", f"you named {key}; {facts}. {key} alone would allow "
                              f"{occ.blocks_by_limit[key]} block(s) per SM: another limit allows fewer.")
    if device_of(device).type != "cuda":
        return ExerciseResult(name, "passed (correctness only)",
                              f"{facts}; {occ.blocks_per_sm} block(s)/SM bound by {binds}: your limiter "
                              f"({key}) matches. Speed is graded on a GPU.")
    speed = registers.grade_config(cfg, reason, device=device)
    if speed.status.startswith("wrong") and _toolchain_words(speed.message):
        return environment_problem(name, speed.message)
    speed.name = name
    speed.message = f"limiter {key} matches the compile report ({binds} bind). " + speed.message
    return speed


# ---------------------------------------------------------------- 02: the row softmax's occupancy
#: exercise 02's names for the four limits of :func:`hwlab.labs.registers.occupancy.occupancy`
SOFTMAX_LIMITS = {"registers": "registers", "register": "registers", "regs": "registers",
                  "shared memory": "shared_mem", "shared_mem": "shared_mem", "smem": "shared_mem",
                  "shared": "shared_mem", "warps": "warps", "warp": "warps", "threads": "warps",
                  "block slots": "blocks", "blocks": "blocks", "block slot": "blocks", "max blocks": "blocks",
                  "resident blocks": "blocks", "block limit": "blocks"}
_LIMIT_WORDS = {"registers": "registers", "shared_mem": "shared memory", "warps": "warps",
                "blocks": "block slots"}
#: the warps counts exercise 02's second part may pick from (one program per row of the block)
SOFTMAX_WARPS = (1, 2, 4, 8, 16)


def softmax_report(block: int, warps: int):
    """The static sm_90a compile report of Lab 2's row softmax (``wide_block_kernel``) at
    ``block`` elements per program on ``warps`` warps (a time-limited child, cached per process)."""
    from hwlab.labs import registers

    return registers.compile_guarded("wide_block", block=block, warps=warps)


def _report_problem(name: str, rep) -> ExerciseResult | None:
    if rep.skipped:
        if _toolchain_words(rep.skipped):
            return environment_problem(name, f"the sm_90a compile could not run ({rep.skipped})")
        return ExerciseResult(name, "wrong", f"{rep.config} did not compile for sm_90a: {rep.skipped}")
    return None


def occupancy_reference(block: int, warps: int, blocks_per_sm=None, limiter=None) -> Reference:
    """What passes :func:`check_occupancy_prediction`: the count and the limit that binds."""
    rep = softmax_report(block, warps)
    if rep.skipped:
        return Reference(how=f"the sm_90a compile could not run here ({rep.skipped})")
    occ = rep.occupancy(warps)
    return Reference({"blocks per SM": occ.blocks_per_sm,
                      "the limit that binds": " and ".join(_LIMIT_WORDS[k] for k in occ.binding)},
                     how=f"each limit's count: " + ", ".join(f"{_LIMIT_WORDS[k]} {v}"
                                                             for k, v in occ.blocks_by_limit.items()))


@graded(occupancy_reference)
def check_occupancy_prediction(block: int, warps: int, blocks_per_sm, limiter) -> ExerciseResult:
    """Exercise 02, part 1: the learner's blocks per SM and binding limit for the row softmax at
    (``block``, ``warps``), against the occupancy calculator on the static compile report. A wrong
    count is told which limits the learner's number contradicts (a limit that allows fewer, or
    none that allows exactly it); a wrong limiter is told how many that limit alone allows. Neither
    message names the right count or the limit that binds."""
    name = "blocks per SM and the limit that binds"
    if blocks_per_sm is None or not limiter:
        return not_done(name, "Set MY_BLOCKS_PER_SM (a whole number) and MY_LIMITER (registers, shared "
                              "memory, warps or block slots).")
    key = SOFTMAX_LIMITS.get(str(limiter).strip().lower())
    if key is None:
        return ExerciseResult(name, "wrong", f"MY_LIMITER = {limiter!r}: name one of registers, shared memory, "
                              "warps, block slots")
    try:
        n = int(blocks_per_sm)
    except (TypeError, ValueError):
        return ExerciseResult(name, "wrong", f"MY_BLOCKS_PER_SM = {blocks_per_sm!r}: give a whole number")
    problem = toolchain_problem(static_compile=True)
    if problem:
        return environment_problem(name, problem)
    rep = softmax_report(block, warps)
    bad = _report_problem(name, rep)
    if bad:
        return bad
    occ = rep.occupancy(warps)
    facts = (f"BLOCK={block} on {warps} warp(s): {rep.n_regs} registers/thread, {rep.shared_bytes} B shared "
             "memory per block (static sm_90a compile, ptxas -v)")
    by = occ.blocks_by_limit
    if n != occ.blocks_per_sm:  # no direction: on a whole number it would hand over the count in a few tries
        return ExerciseResult(name, "wrong", f"{n} per SM does not follow from {facts}. Work out all four "
                              "limits (the rules in the markdown above) and take the smallest.", answer=n)
    if key not in occ.binding:
        return ExerciseResult(name, "wrong", f"your count is right, but {_LIMIT_WORDS[key]} alone would allow "
                              f"{by[key]} per SM, not the count you found: it is not the limit that binds ({facts}).",
                              answer=limiter)
    return ExerciseResult(name, "passed", f"{facts}: {occ.blocks_per_sm} per SM, bound by "
                          f"{' and '.join(_LIMIT_WORDS[k] for k in occ.binding)} ({occ.occupancy_pct:.0f}% "
                          "occupancy)" + ("; a block this small runs out of slots before the register file fills."
                                          if "blocks" in occ.binding else "."))


def _softmax_reports(block: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SOFTMAX_WARPS, pool.map(lambda w: softmax_report(block, w), SOFTMAX_WARPS)))


def warps_reference(block: int, warps=None) -> Reference:
    """What passes :func:`check_warps_choice`: the warps count(s) with the highest occupancy, and it."""
    reps = _softmax_reports(block)
    occ = {w: r.occupancy(w) for w, r in reps.items() if not r.skipped and not r.n_spills}
    if not occ:
        return Reference(how="no warps count compiled without spills here")
    best = max(o.occupancy_pct for o in occ.values())
    ws = [w for w, o in occ.items() if o.occupancy_pct == best]
    return Reference({"warps": ws[0] if len(ws) == 1 else ws, "occupancy %": best},
                     how=f"each thread holds {block} / (32 x warps) elements of the row; fewer warps means more "
                         "registers per thread, more warps fewer blocks")


@graded(warps_reference)
def check_warps_choice(block: int, warps) -> ExerciseResult:
    """Exercise 02, part 2: the learner's warps count for the row softmax at ``block`` elements
    per row must compile without spills and reach the highest theoretical occupancy of
    :data:`SOFTMAX_WARPS` (each compiled for sm_90a and put through the occupancy calculator)."""
    name = "warps for the long row"
    if warps is None:
        return not_done(name, f"Set MY_WARPS to one of {SOFTMAX_WARPS}.")
    if isinstance(warps, bool) or not isinstance(warps, int) or warps not in SOFTMAX_WARPS:
        return ExerciseResult(name, "wrong", f"MY_WARPS = {warps!r}: this kernel's knob is the warps count per "
                              f"program, one of {SOFTMAX_WARPS} (the block stays the row, {block} elements)")
    problem = toolchain_problem(static_compile=True)
    if problem:
        return environment_problem(name, problem)
    reps = _softmax_reports(block)
    for rep in reps.values():
        bad = _report_problem(name, rep)
        if bad:
            return bad
    occ = {w: r.occupancy(w) for w, r in reps.items() if not r.n_spills}
    mine = reps[warps]
    facts = (f"{warps} warp(s): {mine.n_regs} registers/thread, {mine.n_spills} spill slots (static sm_90a "
             "compile, ptxas -v)")
    if mine.n_spills:
        return ExerciseResult(name, "wrong", f"{warps} warp(s) spill: part of every row lives in local memory.",
                              answer=warps)
    best = max(o.occupancy_pct for o in occ.values())
    o = occ[warps]
    if o.occupancy_pct < best:  # no figure of this try: trying every count must not read off the answer
        return ExerciseResult(name, "wrong", f"{warps} warp(s) is not the count with the best occupancy of those allowed. Each "
                              f"thread holds {block} / (32 x warps) elements of the row: what does that do to "
                              "its registers, and the registers to the blocks that fit? Work it out from the compile "
                              "rules above before trying another count.", answer=warps)
    msg = (f"{facts}: {o.blocks_per_sm} per SM bound by {' and '.join(_LIMIT_WORDS[k] for k in o.binding)}, "
           f"{o.active_warps} active warps = {o.occupancy_pct:.0f}% occupancy")
    return ExerciseResult(name, "passed", msg + ", the highest of the warps counts tried.", answer=warps)
