#!/usr/bin/env bash
# Record examples/straggler_torchrun.py on real GPUs over NCCL (issue 20): the startup capture
# (nvidia-smi topo -m, rank -> GPU by PCI bus id through NVML, NUMA, affinity, NCCL's route log,
# a probe baseline per GPU) and CUDA-event step logs, then `hwlab ranks` on the run directory.
#
#   PYTHONPATH=src bash tools/record_straggler_nccl.sh OUT   # NPROC, SIZE, STEPS override (CPU check: SIZE=256)
#
# Writes OUT/straggler_nccl/ (the run directory) and OUT/straggler_nccl_report.json.
set -euo pipefail
OUT=${1:?usage: record_straggler_nccl.sh OUT}
N=${NPROC:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
SLOW=$(( N > 1 ? N - 1 : -1 ))   # one GPU: no slow rank (a smoke test of capture and step log)
# NVLink multicast stays off on the lent machines
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m torch.distributed.run --standalone --nproc-per-node "$N" examples/straggler_torchrun.py \
    --run-dir "$OUT/straggler_nccl" --slow-rank "$SLOW" --slow-ms 20 --spike-every 10 --spike-ms 40 \
    --steps "${STEPS:-80}" --size "${SIZE:-4096}" --layers 4
rc=0
python3 -c "import sys; from hwlab.cli import main; sys.exit(main(sys.argv[1:]))" \
    ranks "$OUT/straggler_nccl" --json > "$OUT/straggler_nccl_report.json" || rc=$?
echo "hwlab ranks exit code: $rc (1 = a tail or mapping finding, expected with a slow rank)"
python3 -c "import sys; from hwlab.cli import main; sys.exit(main(sys.argv[1:]))" ranks "$OUT/straggler_nccl" || true
