#!/usr/bin/env bash
# On a GPU machine: the CUDA C instantiations that the shipped flows, the genomics ops and the
# stores users have (benchmarks/user_stores.py) compile, recorded into FILE (JSON lines). Then, on
# a machine with nvcc: `python -m pipeline.kernels.build add FILE`, then `... build` (see
# pipeline/kernels/build.py). Small data: the instantiations depend on types, not sizes.
#
#   bash benchmarks/record_kernels.sh FILE [WORKDIR]
set -euo pipefail
record=$(realpath -m "${1:?usage: record_kernels.sh FILE [WORKDIR]}")
work=${2:-$(mktemp -d)}
mkdir -p "$work"
export PIPELINE_RECORD_KERNELS=$record DASK_PIPELINE__GPU__PREBUILT_KERNELS=false
cli() { python3 -m pipeline "$@" --no-progress 2>&1 | tail -n 2; }
quiet() { "$@" > "$work/log.txt" 2>&1 || { tail -n 20 "$work/log.txt"; return 1; }; }

quiet python3 -m pipeline demo "$work/demo.zarr" --size 256MB --overwrite
for flow in climate_anomaly monthly_anomaly heatwave_days detrended_quantiles; do
  cli run "flows/$flow.yaml" --backend gpu --input "$work/demo.zarr" --output "$work/$flow.zarr"
done
quiet python3 -m pipeline convert "$work/demo.zarr" "$work/demo_sharded.zarr" --overwrite
cli run flows/climate_anomaly.yaml --backend gpu --input "$work/demo_sharded.zarr" --output "$work/sharded.zarr"

quiet python3 benchmarks/user_stores.py --shape 73,721,1440 --workdir "$work/us" --only v3-default,v2-blosc,zlib
for store in "$work"/us/*/*; do
  cli run flows/climate_anomaly.yaml --backend gpu --input "$store" --output "$work/us-$(basename "$store").zarr"
done

quiet python3 -m pipeline demo --kind genomics "$work/g.vcz" --samples 2000 --variants 3000
for flow in genomics_qc gwas; do
  cli run "flows/$flow.yaml" --backend gpu --input "$work/g.vcz" --output "$work/$flow.zarr"
done
quiet python3 benchmarks/genomics_sgkit.py "$work/g.vcz" --tools pipeline-gpu
quiet python3 benchmarks/genomics_sgkit.py "$work/g.vcz" --tools pipeline-gpu --groups pca --pca-algorithm randomized
sort -u "$record" -o "$record"
wc -l "$record"
