"""Write the small synthetic Kineto traces under tests/data/traces/<behaviour>/ (run from the repo
root: ``python tests/data/traces/make_fixtures.py``). Each reproduces one format feature of traces
other tools and other jobs write, built from the fields torch.profiler writes (no file from another
project is copied): NCCL kernels named ``SendRecv`` whose collective is known only from the host
ops around their launch (``record_param_comms`` with PG and ``Seq``), issued in different orders on
two ranks; names as other tools write them; a job's second rank truncated; two jobs in one folder;
device work that runs after the host step (launch correlation ids); a training job (backward ops,
optimizer steps). Times are in microseconds on each trace's own clock."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
T0 = 5_000_000_000.0  # a monotonic clock's microseconds, as Kineto writes with baseTimeNanoseconds


class Trace:
    def __init__(self, rank=None, world=None, device="NVIDIA H100 80GB HBM3", base_ns=1733357000 * 10**9,
                 pg_config=None, backend="nccl"):
        self.ev, self.corr, self.pid = [], 1000, 4000 + (rank or 0)
        self.head = {"schemaVersion": 1,
                     "deviceProperties": [{"id": 0, "name": device, "totalGlobalMem": 85 * 2**30,
                                           "computeMajor": 9, "computeMinor": 0, "numSms": 132}]}
        if rank is not None:
            self.head["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world,
                                            "pg_config": pg_config or []}
        self.tail = {"traceName": f"/tmp/libkineto_activities_{self.pid}.json", "displayTimeUnit": "ms",
                     "baseTimeNanoseconds": base_ns}

    def x(self, cat, name, ts_ms, dur_ms, tid, pid=None, **args):
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid if pid is None else pid, "tid": tid,
                        "ts": round(T0 + ts_ms * 1e3, 3), "dur": round(dur_ms * 1e3, 3), "args": args})

    def step(self, n, ts_ms, dur_ms):
        self.x("user_annotation", f"ProfilerStep#{n}", ts_ms, dur_ms, 1)

    def kernel(self, name, host_ms, gpu_ms, dur_ms, stream=7, **kargs):
        self.corr += 1
        self.x("cuda_runtime", "cudaLaunchKernel", host_ms, 0.005, 1, correlation=self.corr)
        self.x("kernel", name, gpu_ms, dur_ms, stream, pid=0, device=0, stream=stream, correlation=self.corr,
               **kargs)

    def op(self, name, ts_ms, dur_ms):
        self.x("cpu_op", name, ts_ms, dur_ms, 1)

    def coll(self, name, pg, seq, nelems, host_ms, gpu_ms, dur_ms, stream, *, on_kernel=False, group=2):
        meta = {"Collective name": name, "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "Float",
                "Process Group Name": pg, "Process Group Description": f"pg{pg}", "Group size": group,
                "Seq": seq}
        self.op(f"c10d::{name}_", host_ms, 0.04)
        self.x("cpu_op", "record_param_comms", host_ms + 0.002, 0.036, 1, **meta)
        self.x("user_annotation", f"nccl:{name}", host_ms + 0.004, 0.03, 1)
        self.kernel(SENDRECV, host_ms + 0.01, gpu_ms, dur_ms, stream, **(meta if on_kernel else {}))

    def write(self, path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        obj = {**self.head, "traceEvents": sorted(self.ev, key=lambda e: e["ts"]), **self.tail}
        text = json.dumps(obj, separators=(",", ":"))
        if path.name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode(), mtime=0))
        else:
            path.write_text(text)
        return path


PGS = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": [0, 1]},
       {"pg_name": "1", "pg_desc": "dp", "backend_config": "cuda:nccl", "ranks": [0, 1]}]

#: per step and rank: (collective, PG, seq offset, host issue ms, kernel start ms); every kernel of one
#: collective ends at the same moment on both ranks (the last rank's arrival releases everyone)
ORDER = {0: [("all_to_all", "0", 1, 10.0, 11.0), ("all_reduce", "1", 1, 12.0, 20.0), ("all_gather", "0", 2, 60.0, 61.0)],
         1: [("all_reduce", "1", 1, 5.0, 19.75), ("all_to_all", "0", 1, 20.0, 43.0), ("all_gather", "0", 2, 62.0, 63.0)]}
ENDS = {"all_to_all": 50.0, "all_reduce": 30.0, "all_gather": 80.0}
NELEMS = {"all_to_all": 1 << 20, "all_reduce": 1 << 22, "all_gather": 1 << 18}
STEP_MS, N_STEPS = 100.0, 2


def sendrecv_rank(rank, *, drop=()):
    t = Trace(rank, 2, pg_config=PGS)
    for s in range(N_STEPS):
        off = s * STEP_MS
        t.step(s + 1, off, STEP_MS)
        t.op("aten::mm", off + 0.5, 0.2)
        t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", off + 0.6, off + 1.0, 8.0)
        t.op("aten::mm", off + 84.0, 0.2)
        t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", off + 84.1, off + 85.0, 10.0)
        for name, pg, seq, host, start in ORDER[rank]:
            if (s, name) in drop:
                continue
            seq_n = seq if pg == "1" else seq + 2 * s
            seq_n = seq_n if pg == "0" else s + 1
            t.coll(name, pg, seq_n, NELEMS[name], off + host, off + start, ENDS[name] - start,
                   20 if pg == "0" else 21)
    return t


def main() -> None:
    d = HERE / "sendrecv_identity"
    for r in (0, 1):  # named as Kineto's on-demand/HTA examples name them
        sendrecv_rank(r).write(d / f"rank-{r}.Dec_05_00_20_00.{1101 + r}.pt.trace.json.gz")
    # names other tools use, beside the kit's own records and things that are not traces
    n = HERE / "named_by_others"
    sendrecv_rank(0).write(n / "rank-0.Jul_15_10_52_41.1074.pt.trace.json.gz")
    sendrecv_rank(1).write(n / "control.json.gz")
    (n / "host0").mkdir(parents=True, exist_ok=True)
    (n / "host0" / "rank-00000.json").write_text(json.dumps({"schema": "hwlab.capture", "schema_version": 1,
                                                              "rank": 0, "host": "host0"}))
    (n / "host0" / "steps-rank-00000.jsonl").write_text(json.dumps({"kind": "header", "schema": "hwlab.steplog"}) + "\n")
    (n / "empty_trace.json.gz").write_bytes(b"")
    (n / "model_et.json").write_text(json.dumps({"schema": "1.0.1", "pid": 1, "nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]"}]}))
    # a job's second rank cut off mid-file
    tr = HERE / "truncated_rank"
    sendrecv_rank(0).write(tr / "rank-0.Dec_05_00_20_00.1101.pt.trace.json.gz")
    text = json.dumps({**sendrecv_rank(1).head, "traceEvents": sendrecv_rank(1).ev})
    (tr / "rank-1.Dec_05_00_20_00.1102.pt.trace.json.gz").write_bytes(gzip.compress(text[: len(text) // 2].encode(), mtime=0))
    # two jobs: world size 2 and 8, recorded 8.5 days apart
    mj = HERE / "mixed_jobs"
    sendrecv_rank(0).write(mj / "trace_a.json.gz")
    b = sendrecv_rank(1)
    b.head["distributedInfo"].update(rank=3, world_size=8)
    b.tail["baseTimeNanoseconds"] += int(8.5 * 86400) * 10**9
    b.write(mj / "trace_b.json.gz")
    # device work after the host step: the device runs behind the host, kernels carry correlation ids
    lag = Trace(device="AMD Instinct MI300X", base_ns=1733358000 * 10**9)
    gpu_free = 1.0
    for s in range(2):
        lag.step(s + 1, 10.0 * s, 10.0)
        for k in range(8):
            host = 10.0 * s + 1.0 + k
            lag.op("aten::add", host - 0.05, 0.1)
            lag.kernel("elementwise_kernel", host, gpu_free, 2.5)
            lag.ev[-2]["name"] = "hipLaunchKernel"
            gpu_free += 2.5
    lag.write(HERE / "device_lag" / "mi300_minitoy_kineto.json.gz")
    # a training job: backward ops and optimizer steps, two ranks on time, collectives on the kernel's args
    for r in (0, 1):
        t = Trace(r, 2, pg_config=PGS[:1], base_ns=1733359000 * 10**9)
        t.pid = 4101 + r
        for s in range(4):
            off = 10.0 * s
            t.step(s + 1, off, 10.0)
            t.op("aten::mm", off + 0.2, 0.1)
            t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", off + 0.25, off + 0.5, 3.0)
            t.op("autograd::engine::evaluate_function: MmBackward0", off + 0.4, 0.2)
            t.op("MmBackward0", off + 0.45, 0.1)
            t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", off + 0.5, off + 3.5, 3.0)
            t.coll("all_reduce", "0", s + 1, 1 << 20, off + 0.6, off + 6.5, 2.0, 20, on_kernel=True)
            t.x("user_annotation", "Optimizer.step#SGD.step", off + 0.7, 0.1, 1)
        t.write(HERE / "training_two_ranks" / f"trainnode3_{4101 + r}.1733359000000000000.pt.trace.json.gz")


if __name__ == "__main__":
    main()
