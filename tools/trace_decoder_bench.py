"""Benchmark (not a test): the JSON decoders a trace reader could use, on a real per-rank trace.

    .venv/bin/python tools/trace_decoder_bench.py [--out FILE]

Times (CPU, median of 7) on ``sampled_rank-0.json.gz`` (``$HWLAB_TRACE_DATA`` or
``../shared/data/traces``): the standard library, orjson and msgspec decoding the whole file and
each event alone; ijson (incremental, its C backend where built) yielding the events; gzip; and the kit's streaming reader (:func:`hwlab.traces.trace_stream.iter_trace`)
and :func:`hwlab.traces.kineto.read_trace`, which decode with the standard library's
``raw_decode`` over chunks so that memory stays bounded by the chunk and the kept events.
orjson and msgspec decode a whole document (no incremental decoding of one array's items), so
they keep the memory bound only if the reader first finds each event's end itself; the figures
say what that would have to cost to pay. Missing decoders are recorded as not installed.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HWLAB_TRACE_DATA", ROOT / ".." / "shared" / "data")) / "traces"
TRACE = DATA / "sampled_rank-0.json.gz"


def _t(f, n: int = 7) -> float:
    xs = []
    for _ in range(n):
        c = time.process_time()
        f()
        xs.append(time.process_time() - c)
    return sorted(xs)[n // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tools" / "results" / "rank_scale" / "decoders_cpu_vm.json"))
    a = ap.parse_args()
    from hwlab.traces import kineto, trace_stream
    raw = gzip.open(TRACE).read()
    text = raw.decode()
    events = [json.dumps(e) for e in json.loads(text)["traceEvents"]]
    res: dict = {"trace": TRACE.name, "mb_json": len(raw) / 1e6, "n_events": len(events),
                 "loadavg_1_5_15": list(os.getloadavg()), "cpu_s": {}}
    c = res["cpu_s"]
    c["gzip_decompress"] = _t(lambda: gzip.decompress(gzip.compress(raw, 1)))
    c["stdlib_whole"] = _t(lambda: json.loads(text))
    c["stdlib_per_event"] = _t(lambda: [json.loads(e) for e in events])
    c["hwlab_iter_trace_streaming"] = _t(lambda: sum(1 for _ in trace_stream.iter_trace(TRACE)))
    c["hwlab_read_trace"] = _t(lambda: kineto.read_trace(TRACE))
    for name, mod, dec in (("orjson", "orjson", lambda m: m.loads), ("msgspec", "msgspec", lambda m: m.json.Decoder().decode)):
        try:
            m = __import__(mod)
        except ImportError:
            res[name] = "not installed"
            continue
        d = dec(m)
        res[name] = getattr(m, "__version__", "?")
        c[f"{name}_whole"] = _t(lambda: d(raw))
        c[f"{name}_per_event"] = _t(lambda: [d(e) for e in events])
    try:  # ijson: incremental, items of the traceEvents array one at a time (its C backend where built)
        import io
        import ijson
        res["ijson"] = f"{ijson.__version__} ({ijson.backend})"
        c["ijson_streaming_items"] = _t(lambda: sum(1 for _ in ijson.items(io.BytesIO(raw), "traceEvents.item",
                                                                           use_float=True)))
    except ImportError:
        res["ijson"] = "not installed"
    c["streaming_overhead_over_stdlib_whole"] = c["hwlab_iter_trace_streaming"] - c["stdlib_whole"]
    res["decode_share_of_read_trace"] = c["hwlab_iter_trace_streaming"] / c["hwlab_read_trace"]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
