"""Lab 4's serving stream: a seeded queue of requests with mixed prompt and output lengths,
served with continuous batching by one precision path, timed step by step on the device.

What a service sees, rather than one decode step at one shape: requests of a context bucket
(prompt lengths drawn from half the bucket's context to all of it, output lengths from
``out_tokens``) wait in a queue; up to ``max_batch`` are live at once, each in its own
KV-cache slot (:meth:`.model.KVCache.slot`). A new request is prefilled alone (its first
token: TTFT) as soon as a slot frees; every decode step then serves the live requests, each
at its own position (per-row lengths read on the device), so the batch changes as requests
finish and the queue empties. The schedule depends only on the lengths, so every path serves
the same sequence of batches.

Timing (the protocol of :mod:`hwlab.core.measure`): on a GPU every decode step replays a CUDA graph
captured for its batch size (the fixed-bucket TPOT in :func:`.run.time_prefill_decode` does
the same), prefills run eagerly, and each operation is bracketed by CUDA events read after
one final synchronise; before the stream the full batch is replayed for
:data:`hwlab.core.measure.GPU_WARMUP_S` so clocks have settled, and every prompt shape is
prefilled once untimed (a first call of a shape pays one-off host costs). A timed prefill is
preceded by a GPU sleep longer than the host needs to enqueue it (:class:`_HostLead`), so its
events time the device's work, not Python's launches (without it, the host's time to enqueue
a few hundred eager kernels lands inside a prefill's events). On a CPU each operation runs
eagerly under ``time.perf_counter`` (labelled; CPU times say nothing about a GPU). Moving a
slot when a request finishes with the queue empty (compaction) is host bookkeeping plus a
copy a paged cache would not make: it is left off the clock and said so.

Per token, two figures: **TPOT** is the device time of the decode step that produced it (one
sample per live request per step, so p50/p99 are token-weighted); **ITL** (inter-token
latency) also counts the prefills that ran between a request's two tokens (a service
without chunked prefill stalls its decodes for them): the tail a user feels.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hwlab.core.measure import GPU_WARMUP_S, poison_, quantile
from hwlab.labs.fp8.model import FP8, Decoder, QLinear


@dataclass(frozen=True)
class StreamSpec:
    """One context bucket's stream: ``n_requests`` prompts of ``ctx // 2 .. ctx`` tokens, each
    generating ``out_tokens[0] .. out_tokens[1]`` tokens, at most ``max_batch`` live."""
    ctx: int
    max_batch: int
    n_requests: int
    out_tokens: tuple[int, int] = (8, 64)
    seed: int = 0

    @property
    def max_len(self) -> int:
        """The cache length a slot needs: the longest prompt plus the longest output."""
        return self.ctx + self.out_tokens[1]


def default_streams(device, long: bool = False) -> list[StreamSpec]:
    """Two context buckets, as a service sees them: many short requests served 16 at a time (the
    decode step mostly reads weights) and a few long-context ones served 4 at a time (mostly KV
    cache). Twice the requests of a batch, so each stream runs full, then drains; sized so four
    paths fit a notebook's minute and a half on an H200. ``long``: three times the requests."""
    k = 3 if long else 1
    if torch.device(device).type == "cuda":
        return [StreamSpec(1024, 16, 32 * k, (16, 64), seed=1), StreamSpec(16384, 4, 8 * k, (16, 64), seed=2)]
    return [StreamSpec(32, 16, 20 * k, (2, 5), seed=1), StreamSpec(128, 4, 5 * k, (2, 5), seed=2)]


@dataclass(frozen=True)
class Request:
    id: int
    prompt_len: int
    out_len: int


def make_requests(spec: StreamSpec) -> list[Request]:
    """The stream's requests, from ``spec.seed`` alone (the same for every path)."""
    g = torch.Generator().manual_seed(spec.seed)
    lo = max(1, spec.ctx // 2)
    p = torch.randint(lo, spec.ctx + 1, (spec.n_requests,), generator=g)
    o = torch.randint(spec.out_tokens[0], spec.out_tokens[1] + 1, (spec.n_requests,), generator=g)
    return [Request(i, int(a), int(b)) for i, (a, b) in enumerate(zip(p, o))]


def percentile(values: list[float], q: float, weights: list[int] | None = None) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``, each counted ``weights[i]``
    times (token-weighted step times), by the core's one definition
    (:func:`hwlab.core.measure.quantile`, ``method="nearest"``). None for no samples. Nearest rank,
    so a recorded p99 is one of the recorded samples; the recorded streams were made with it."""
    return quantile(values, q / 100.0, weights, method="nearest")


class _HostLead:
    """Keeps the GPU ahead of the host for an eager prefill: ``hold()`` enqueues a GPU sleep of
    twice the host time one (warm) prefill takes to enqueue, so the GPU reaches the prefill's
    start event only once the host has queued all of it, and the events time the device's work
    alone (not Python launching ~300 kernels). Calibrated once per stream: the sleep's cycles
    per ms are timed with events, the enqueue time with ``perf_counter`` over a prefill of the
    first prompt (its shape already warm). The sleep is off the stream's clock."""

    def __init__(self, m: Decoder, prompt: torch.Tensor, cache):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(1_000_000)
        b.record()
        torch.cuda.synchronize()
        cycles_per_ms = 1_000_000 / max(a.elapsed_time(b), 1e-3)
        torch.cuda._sleep(int(cycles_per_ms * 50))  # keep the GPU busy while the host enqueues
        t0 = time.perf_counter()
        m(prompt, cache.slot(0))
        host_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        self.host_ms, self.cycles = host_ms, int(cycles_per_ms * 2 * host_ms)

    def hold(self):
        torch.cuda._sleep(self.cycles)


class _Timer:
    """Device-timed operations: CUDA events on a GPU (read once at the end), perf_counter on a CPU."""

    def __init__(self, device: torch.device):
        self.gpu = device.type == "cuda"
        self.marks: list[Any] = []

    def run(self, fn) -> int:
        if self.gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            self.marks.append((a, b))
        else:
            t0 = time.perf_counter()
            fn()
            self.marks.append((time.perf_counter() - t0) * 1e3)
        return len(self.marks) - 1

    def durations_ms(self) -> list[float]:
        if self.gpu:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.marks]
        return list(self.marks)


#: relative logit error allowed between a continuous-batching step and each request decoded
#: alone: the same math through different kernels (per-row attention vs SDPA or the uniform
#: kernel, GEMMs at another batch size) differs by bf16 rounding (~1e-2 after a few layers); a
#: row attending over another row's cache or the wrong length is off by order 1
ROWS_CHECK_TOL = 5e-2
#: the same for a path that quantizes activations to FP8: with one dynamic scale per batch
#: (``fp8_mm``) the batch's largest activation sets every row's rounding, and with static scales
#: a bf16 difference of a rounding step flips an element to the next FP8 value (~6%), so a row's
#: logits move with its neighbours by up to the FP8 logit-error bound (:data:`.model.LOGIT_ERROR_BOUND`)
ROWS_CHECK_TOL_FP8_ACT = 0.15


def check_rows_step(m: Decoder, max_len: int, prompt_lens: tuple[int, ...] = (5, 17, 11), seed: int = 7) -> float:
    """Correctness before timing: requests of different lengths prefilled into their slots,
    then two continuous-batching decode steps (per-row positions), against each request
    decoded alone in the uniform path. Returns the largest relative logit error; raises if it
    exceeds :data:`ROWS_CHECK_TOL`."""
    dev = m.device
    g = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    toks = [torch.randint(0, m.cfg.vocab, (1, p + 2), generator=g).to(dev) for p in prompt_lens]
    cache = m.new_cache(n, max_len)
    for t in cache.k + cache.v:  # NaN past every row's length: a row that reads beyond it fails the check
        if t.dtype == FP8:
            t.view(torch.uint8).fill_(0x7F)  # e4m3fn's NaN, written as bytes (fill_ of FP8 is not everywhere)
        else:
            poison_(t)
    cache.row_len = torch.zeros(n, dtype=torch.int32, device=dev)
    errs = []
    with torch.no_grad():
        for i, p in enumerate(prompt_lens):
            m(toks[i][:, :p], cache.slot(i))
            cache.row_len[i:i + 1].fill_(p)
            cache.scale_frozen = True
        batched = []
        for j in range(2):
            step_tok = torch.cat([t[:, p + j:p + j + 1] for t, p in zip(toks, prompt_lens)])
            batched.append(m(step_tok, cache.rows(n)).float())
        for i, p in enumerate(prompt_lens):
            solo = m.new_cache(1, max_len)
            solo.scale, solo.scale_frozen = [s.clone() for s in cache.scale], True  # the stream's KV scale
            m(toks[i][:, :p], solo)
            for j in range(2):
                ref = m(toks[i][:, p + j:p + j + 1], solo).float()
                errs.append(torch.linalg.vector_norm(batched[j][i] - ref[0]) / torch.linalg.vector_norm(ref[0]))
    worst = float(torch.stack(errs).max())  # NaN (a poisoned position read) propagates
    fp8_act = any(isinstance(q, QLinear) and q.mode in ("fp8_mm", "fp8_static") for q in m.modules())
    tol = ROWS_CHECK_TOL_FP8_ACT if fp8_act else ROWS_CHECK_TOL
    if not worst <= tol:
        raise AssertionError(f"continuous-batching decode disagrees with decoding each request alone: relative "
                             f"logit error {worst:.3g} > {tol} (path {m.path}); not timed")
    return worst


def serve(m: Decoder, spec: StreamSpec, graph: bool | None = None, progress=None) -> dict[str, Any]:
    """Serve ``spec``'s stream on ``m``; returns the per-step and per-request record.

    ``steps``: one entry per decode step: ``n`` live requests, ``kv_positions`` (the cache
    positions the step's attention reads, summed over rows, this step's included),
    ``t_ms`` its device time, ``prefill_ms_before`` the prefills run since the previous step.
    ``requests``: prompt and output length, TTFT (its prefill's device time) and its ITL
    samples' p50/max. ``host_lead_ms``: the host enqueue time of one prefill the GPU sleeps
    twice over before each timed prefill (GPU only). ``tpot_ms_p50/p99`` (token-weighted over steps), ``itl_ms_p50/p99``,
    ``ttft_ms_p50/p99``."""
    dev = m.device
    graph = dev.type == "cuda" if graph is None else graph
    say = progress or (lambda s: None)
    rows_err = check_rows_step(m, spec.max_len)
    reqs = make_requests(spec)
    cache = m.new_cache(spec.max_batch, spec.max_len)
    cache.row_len = torch.zeros(spec.max_batch, dtype=torch.int32, device=dev)
    tok = torch.zeros(spec.max_batch, 1, dtype=torch.long, device=dev)
    g = torch.Generator().manual_seed(spec.seed + 1000)
    prompts = {r.id: torch.randint(0, m.cfg.vocab, (1, r.prompt_len), generator=g).to(dev) for r in reqs}

    def step(n: int):
        logits = m(tok[:n], cache.rows(n))
        tok[:n].copy_(logits.argmax(-1))

    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    with torch.no_grad():
        if graph:
            graphs = _capture_decode_graphs(spec, cache, tok, step, say)
        # every prompt shape once, untimed: a first call of a shape pays one-off host costs (library
        # heuristics, kernel selection) that a long-running server has paid already; the first one
        # also fixes an FP8 cache's per-layer K/V scale, which every request then uses
        say(f"warm {len(reqs)} prefill shapes")
        for r in reqs:
            m(prompts[r.id], cache.slot(0))
            cache.scale_frozen = True
        lead = _HostLead(m, prompts[reqs[0].id], cache) if graph else None
        tok.zero_()

        timer = _Timer(dev)
        queue = deque(reqs)
        slots: list[Request] = []  # slots[i]: the request live in cache slot i
        left: dict[int, int] = {}
        ops: list[tuple[str, Any]] = []  # ("prefill", request id) or ("step", [request ids])

        def admit(i: int, r: Request):
            def prefill():
                view = cache.slot(i)
                logits = m(prompts[r.id], view)
                tok[i:i + 1].copy_(logits.argmax(-1))
            if lead is not None:
                lead.hold()  # the GPU waits while the host enqueues the prefill: device time only
            ops.append(("prefill", r.id, timer.run(prefill)))
            cache.row_len[i:i + 1].fill_(r.prompt_len)
            left[r.id] = r.out_len - 1  # the prefill produced the first token

        def move(src: int, dst: int):  # compaction: untimed (a paged cache would not copy)
            for t in cache.k + cache.v:
                t[dst].copy_(t[src])
            cache.row_len[dst:dst + 1].copy_(cache.row_len[src:src + 1])
            tok[dst].copy_(tok[src])

        while queue and len(slots) < spec.max_batch:
            r = queue.popleft()
            admit(len(slots), r)
            slots.append(r)
        n_steps = 0
        while slots:
            live = [r for r in slots if left[r.id] > 0]
            if len(live) == len(slots):
                n = len(slots)
                kv = sum(r.prompt_len + r.out_len - left[r.id] for r in slots)  # positions read, this one included
                if graph:
                    idx = timer.run(graphs[n].replay)
                else:
                    idx = timer.run(lambda: step(n))
                ops.append(("step", [r.id for r in slots], idx, kv))
                for r in slots:
                    left[r.id] -= 1
                n_steps += 1
                if n_steps % 200 == 0:
                    say(f"ctx {spec.ctx}: {n_steps} steps, {len(queue)} queued")
                continue
            # some requests are done: refill their slots from the queue, else compact
            for i in range(len(slots) - 1, -1, -1):
                if left[slots[i].id] > 0:
                    continue
                if queue:
                    r = queue.popleft()
                    slots[i] = r
                    admit(i, r)
                else:
                    last = len(slots) - 1
                    if i != last:
                        move(last, i)
                    slots[i] = slots[last]
                    slots.pop()
        ms = timer.durations_ms()
    return {**_summarise(spec, reqs, ops, ms, graph, dev), "rows_check_rel_err": rows_err,
            "host_lead_ms": lead.host_ms if lead is not None else None}


def _capture_decode_graphs(spec: StreamSpec, cache, tok, step, say) -> dict:
    """One CUDA graph per batch size, captured before the stream on throw-away lengths, then
    replayed for ``GPU_WARMUP_S`` so the timed stream starts in sustained state
    (hwlab.core.measure's warm-up rule)."""
    say(f"capture {spec.max_batch} decode graphs")
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    cache.row_len.fill_(max(1, spec.ctx // 2))
    pool = torch.cuda.graph_pool_handle()
    s = torch.cuda.Stream()
    for n in range(1, spec.max_batch + 1):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step(n)
                cache.row_len.fill_(max(1, spec.ctx // 2))
        torch.cuda.current_stream().wait_stream(s)
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg, pool=pool):
            step(n)
        graphs[n] = cg
        cache.row_len.fill_(max(1, spec.ctx // 2))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < GPU_WARMUP_S:
        for _ in range(10):
            graphs[spec.max_batch].replay()
            cache.row_len.fill_(max(1, spec.ctx // 2))
        torch.cuda.synchronize()
    cache.row_len.zero_()
    tok.zero_()
    return graphs


def _summarise(spec: StreamSpec, reqs: list[Request], ops, ms: list[float], graph: bool, dev) -> dict[str, Any]:
    clock = 0.0
    last_token_at: dict[int, float] = {}
    ttft: dict[int, float] = {}
    itl: dict[int, list[float]] = {r.id: [] for r in reqs}
    steps = []
    pending_prefill = 0.0
    for op in ops:
        t = ms[op[2]]
        clock += t
        if op[0] == "prefill":
            ttft[op[1]] = t
            last_token_at[op[1]] = clock
            pending_prefill += t
        else:
            ids, kv = op[1], op[3]
            steps.append({"n": len(ids), "kv_positions": kv, "t_ms": t, "prefill_ms_before": pending_prefill})
            pending_prefill = 0.0
            for i in ids:
                itl[i].append(clock - last_token_at[i])
                last_token_at[i] = clock
    all_itl = [x for v in itl.values() for x in v]
    t_steps, n_steps = [s["t_ms"] for s in steps], [s["n"] for s in steps]
    return {
        "spec": {**asdict(spec), "out_tokens": list(spec.out_tokens)}, "graph": graph,
        "timer": "cuda events" if dev.type == "cuda" else "cpu perf_counter",
        "compaction": "slot moves after the queue empties are off the clock",
        "steps": steps,
        "requests": [{"id": r.id, "prompt_len": r.prompt_len, "out_len": r.out_len, "ttft_ms": ttft[r.id],
                      "itl_ms_p50": percentile(itl[r.id], 50), "itl_ms_max": max(itl[r.id], default=None)}
                     for r in reqs],
        "n_tokens": sum(r.out_len for r in reqs), "n_steps": len(steps), "clock_ms": clock,
        "tpot_ms_p50": percentile(t_steps, 50, n_steps), "tpot_ms_p99": percentile(t_steps, 99, n_steps),
        "itl_ms_p50": percentile(all_itl, 50), "itl_ms_p99": percentile(all_itl, 99),
        "ttft_ms_p50": percentile(list(ttft.values()), 50), "ttft_ms_p99": percentile(list(ttft.values()), 99),
    }
