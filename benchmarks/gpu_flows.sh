#!/usr/bin/env bash
# Every shipped flow over a demo dataset of SIZE, on the GPU and on the CPU, one after the other
# on the same store, then on the GPU again over the copy that `pipeline convert` writes (shards
# of zstd frames that nvCOMP decodes on the GPU; the demo store's chunks are decoded on the
# host); the results are compared with the CPU's. With CLUSTER=1 in the environment, the first
# flow also runs on the local-gpu profile (a dask-cuda LocalCUDACluster). Logs and reports go to
# OUTDIR.
#
#   bash benchmarks/gpu_flows.sh OUTDIR [SIZE]      # SIZE of the whole demo dataset, default 10.5GB
set -uo pipefail
out=${1:?usage: gpu_flows.sh OUTDIR [SIZE]}
size=${2:-10.5GB}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cli() { python3 -m pipeline.cli "$@"; }

cli demo data/demo.zarr --size "$size" --overwrite 2>&1 | tee "$out/demo.txt"
for flow in climate_anomaly monthly_anomaly heatwave_days detrended_quantiles; do
  for backend in gpu cpu; do
    cli run "flows/$flow.yaml" --backend "$backend" --output "out/$flow-$backend.zarr" \
        --report "$out/$flow-$backend.json" --no-progress 2>&1 | tee -a "$out/runs.txt"
  done
done

cli convert data/demo.zarr data/demo_sharded.zarr --overwrite 2>&1 | tee "$out/convert.txt"
for flow in climate_anomaly monthly_anomaly heatwave_days detrended_quantiles; do
  cli run "flows/$flow.yaml" --backend gpu --input data/demo_sharded.zarr --output "out/$flow-sharded.zarr" \
      --report "$out/$flow-sharded.json" --no-progress 2>&1 | tee -a "$out/runs.txt"
done

if [ "${CLUSTER:-0}" = 1 ]; then
  cli run flows/climate_anomaly.yaml --backend gpu --cluster local-gpu --output out/climate_anomaly-cluster.zarr \
      --report "$out/climate_anomaly-cluster.json" --no-progress 2>&1 | tee -a "$out/runs.txt"
fi

python3 - "$out" <<'PY' 2>&1 | tee "$out/compare.txt"
import json, sys, warnings
import numpy as np, xarray as xr
warnings.simplefilter("ignore")
out = sys.argv[1]
for flow in ("climate_anomaly", "monthly_anomaly", "heatwave_days", "detrended_quantiles"):
    cpu = xr.open_zarr(f"out/{flow}-cpu.zarr")
    for run in ("gpu", "sharded"):
        gpu = xr.open_zarr(f"out/{flow}-{run}.zarr")
        for v in cpu.data_vars:
            a, b = cpu[v].values.astype(np.float64), gpu[v].values.astype(np.float64)
            scale = np.nanmax(np.abs(a))
            print(f"{flow}/{v} ({run}): shape {a.shape} max|gpu-cpu| {np.nanmax(np.abs(a - b)):.3e} (max|cpu| {scale:.3e}) "
                  f"NaN equal {np.array_equal(np.isnan(a), np.isnan(b))}")
    for b in ("gpu", "sharded", "cpu"):
        r = json.load(open(f"{out}/{flow}-{b}.json"))
        print(f"  {b}: wall {r['wall_seconds']:.2f} s, read {r['bytes_read'] / 1e9:.2f} GB, {r['throughput_GBps']} GB/s")
PY
