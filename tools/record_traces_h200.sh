# One device call (issue 39): a single-rank NCCL trace on the H200, the NVML sampler, hwlab bundle.
# Run from the repository root with PYTHONPATH=src (no Jupyter stack needed); writes under $OUT.
set -u
mkdir -p $OUT/tr
python3 -m torch.distributed.run --standalone --nproc-per-node 1 examples/profiled_torchrun.py \
  --trace-dir $OUT/tr --gzip --steps 6 --iters 3 --numel 1048576 --size 1024 --work-ms 2 --nvml --ops all \
  > $OUT/job.log 2>&1; echo "job rc=$?"
tail -5 $OUT/job.log
ls -la $OUT/tr
python3 -m hwlab ranks --traces $OUT/tr --json > $OUT/ranks.json; echo "ranks rc=$?"
python3 -m hwlab ranks --traces $OUT/tr | head -20
python3 - <<'PY'
import glob, gzip, json, collections
import os
for p in glob.glob(os.environ["OUT"] + "/tr/*.json.gz"):
    d = json.load(gzip.open(p))
    ev = d["traceEvents"]
    c = collections.Counter((e.get("cat"), e.get("name")[:70]) for e in ev if e.get("ph") == "X"
                            and ("nccl" in str(e.get("name")).lower() or "comms" in str(e.get("name")) or e.get("cat") == "kernel"))
    for k, v in c.most_common(25): print(v, k)
    for e in ev:
        if e.get("name") == "record_param_comms" or str(e.get("name", "")).startswith("nccl"):
            print(json.dumps(e)[:900]); break
    print({k: d.get(k) for k in ("distributedInfo", "schemaVersion")})
PY
python3 -m hwlab bundle $OUT/bundle.tar.gz --run-dir $OUT/tr --json > $OUT/bundle_manifest.json; echo "bundle rc=$?"
tar tzf $OUT/bundle.tar.gz | head -30
cd $OUT && tar czf traces.tgz tr && rm -rf tr
