#!/usr/bin/env bash
# The GPU measurements of benchmarks/RESULTS.md in one go, each part under its own time limit, logs
# and JSON under OUTDIR. PARTS (default all): tests, fit, ooc, scaling (scaling needs 2+ GPUs).
#
#   bash benchmarks/run_gpu.sh OUTDIR [PARTS...]      # e.g. bash benchmarks/run_gpu.sh out fit ooc
set -uo pipefail
out=${1:?usage: run_gpu.sh OUTDIR [tests|fit|ooc|scaling ...]}
shift
parts=${*:-tests fit ooc scaling}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
work=${WORKDIR:-/tmp/pipeline-bench}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

for part in $parts; do
  stamp "$part"
  case $part in
    tests)
      # the whole GPU suite took 108 s on 14 workers of the H200 machine (2026-11-29); one process
      # did not finish it in 300 s
      timeout 300 python3 -m pytest -m gpu -q -n "${WORKERS:-12}" -p no:cacheprovider tests > "$out/tests.txt" 2>&1
      echo "exit $?" >> "$out/tests.txt"; tail -3 "$out/tests.txt" ;;
    fit)
      timeout 420 python3 benchmarks/peers.py --sizes fit --repeat 3 --max-seconds 20 --workdir "$work" \
        --peers cpu-peer,naive-gpu-peer,pipeline-cpu,pipeline-gpu,pipeline-gpu-sharded,pipeline-gpu-raw \
        --json "$out/fit.json" > "$out/fit.txt" 2>&1
      echo "exit $?" >> "$out/fit.txt"; grep -E "^(fit|---|\*)|exit|FAILED" "$out/fit.txt" ;;
    ooc)
      timeout 420 python3 benchmarks/peers.py --sizes ooc --repeat 2 --max-seconds 15 --workdir "$work" \
        --peers cpu-peer,pipeline-gpu-sharded,pipeline-gpu-unlimited --json "$out/ooc.json" > "$out/ooc.txt" 2>&1
      echo "exit $?" >> "$out/ooc.txt"; grep -E "^(ooc|---|\*)|budget|exit|FAILED" "$out/ooc.txt" ;;
    scaling)
      gpus=$(python3 -c "import cupy; n = cupy.cuda.runtime.getDeviceCount(); print(','.join(str(k) for k in (1, 2, 4, 8) if k <= n))")
      # UCX where distributed-ucxx is installed: GPU to GPU between the workers, not through host memory
      protocol=$(python3 -c "import importlib.util as u; print('ucx' if u.find_spec('distributed_ucxx') else 'tcp')")
      timeout 420 python3 benchmarks/scaling.py --workdir "$work" --shape 4380,721,1440 --gpus "$gpus" --protocol "$protocol" \
        --flows standardized_anomaly,monthly_anomaly,rolling --repeat 2 --threads 8 --json "$out/scaling.json" > "$out/scaling.txt" 2>&1
      echo "exit $?" >> "$out/scaling.txt"; grep -v -i warn "$out/scaling.txt" | tail -12 ;;
    *) echo "unknown part $part (tests, fit, ooc, scaling)"; exit 2 ;;
  esac
done
stamp done
