#!/usr/bin/env bash
# End-to-end check on a GPU machine: the GPU tests, then the main flow over a demo dataset of SIZE
# on the CPU, on one GPU (dask threads) and on a LocalCUDACluster (configs/local-gpu.yaml); the
# results are compared with each other. Writes logs and JSON reports to OUTDIR.
#
#   bash benchmarks/gpu_e2e.sh OUTDIR [SIZE]      # SIZE of the whole demo dataset, default 10.5GB
set -uo pipefail
out=${1:?usage: gpu_e2e.sh OUTDIR [SIZE]}
size=${2:-10.5GB}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cli() { python3 -m pipeline.cli "$@"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
cli info | tee "$out/info.txt"
python3 -m pytest -m "gpu or cudasim" -q -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.txt" | tail -40

cli demo data/demo.zarr --size "$size" --overwrite 2>&1 | tee "$out/demo.txt"
for run in cpu gpu gpu-warm; do
  backend=${run%-warm}
  cli run flows/climate_anomaly.yaml --backend "$backend" --output "out/anomaly-$backend.zarr" \
      --report "$out/report-$run.json" --no-progress 2>&1 | tee -a "$out/runs.txt"
done
cli run flows/climate_anomaly.yaml --backend gpu --cluster local-gpu --output out/anomaly-gpu-cluster.zarr \
    --report "$out/report-gpu-cluster.json" --no-progress 2>&1 | tee -a "$out/runs.txt"

python3 - "$out" <<'PY' 2>&1 | tee "$out/compare.txt"
import json, sys, numpy as np, xarray as xr
out = sys.argv[1]
ref = xr.open_zarr("out/anomaly-cpu.zarr")["tas"].values.astype(np.float64)
for name in ("gpu", "gpu-cluster"):
    got = xr.open_zarr(f"out/anomaly-{name}.zarr")["tas"].values.astype(np.float64)
    print(f"{name} vs cpu: n={ref.size} max|diff|={np.nanmax(np.abs(got - ref)):.3e} "
          f"max|cpu|={np.nanmax(np.abs(ref)):.3e} nan-equal={np.array_equal(np.isnan(got), np.isnan(ref))}")
for run in ("cpu", "gpu", "gpu-warm", "gpu-cluster"):
    r = json.load(open(f"{out}/report-{run}.json"))
    print(f"{run:12s} wall {r['wall_seconds']:8.2f} s  read {r['bytes_read']/1e9:6.2f} GB  "
          f"{r['throughput_GBps']} GB/s  steps " + ", ".join(f"{s['op']}={s['task_seconds']:.2f}s" for s in r["steps"]))
PY
