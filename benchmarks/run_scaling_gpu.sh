#!/usr/bin/env bash
# Strong scaling over the GPUs of one machine, from the stores users have, in one command a stage
# (outputs under $OUT; stores under $WORK, reused while they exist):
#   data      (genomics-data: the second alone) the climate store as xarray writes it (Zarr v3, zarr's default zstd, 73 steps a chunk;
#             benchmarks/user_stores.py) of STEPS steps, and a VCF Zarr store: `pipeline demo --kind
#             genomics` (msprime, bio2zarr's layout) repeated REPS times along variants
#             (benchmarks/tile_genomics.py);
#   ceiling   what the host gives N GPUs: pipeline's reader alone over the climate store, and the bus
#             from pinned memory (benchmarks/host_read.py);
#   climate   the three climate flows on 1..N GPUs under a device budget (benchmarks/scaling.py);
#   genomics  pca and gwas_linear_regression on 1..N GPUs, same budget;
#   tests     the cluster tests on the GPU, and the fixed cost of a distributed run on a tiny flow;
#   compare   the user's command before and after a change, side by side: OLD_TREE holds an older
#             commit's pipeline/, benchmarks/ and flows/ (`git archive REV pipeline benchmarks flows |
#             tar -x -C DIR`); `processes`' table (one process of each configuration, traced) for the
#             old tree and this one in turn, ROUNDS (3) times, over LAYOUTS (SCALING_ARGS: more of
#             scaling.py's options); the tables, the JSON and the traces go to $OUT/compare.tgz;
#   processes the user's command (`pipeline run`, fresh processes, PROCS of each) on the three layouts
#             users have (Zarr v3 as xarray writes it, Zarr v2 Blosc, NetCDF4 zlib; STEPS steps each)
#             and a GWAS on the VCF Zarr store, without a cluster and with --cluster local-gpu on
#             1..N GPUs, every process traced: one table (benchmarks/scaling.py --user-stores), after
#             WARM (64GB) of host memory is touched once (virtual machines that back memory as it is first used).
# Usage: OUT=dir GPUS=1,2 bash benchmarks/run_scaling_gpu.sh data ceiling climate
set -u
OUT=${OUT:-out}; WORK=${WORK:-/tmp/scaling}; mkdir -p "$OUT" "$WORK"
GPUS=${GPUS:-1,2}; STEPS=${STEPS:-12100}; BUDGET=${BUDGET:-24GB}
SAMPLES=${SAMPLES:-10000}; VARIANTS=${VARIANTS:-20000}; REPS=${REPS:-125}
GBUDGET=${GBUDGET:-$BUDGET}; GTHREADS=${GTHREADS:-3}; VCHUNK=${VCHUNK:-5000}
CLIMATE="$WORK/${STEPS}x721x1440/v3-default.zarr"; BASE="$WORK/genomics_base.vcz"; GENOMICS="$WORK/genomics.vcz"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  case $stage in
    data|genomics-data)
      nvidia-smi topo -m > "$OUT/topology.txt" 2>&1; nproc >> "$OUT/topology.txt"
      if [ ! -d "$BASE" ]; then
        ( /usr/bin/time -v python3 -m pipeline demo --kind genomics "$BASE" --samples "$SAMPLES" --variants "$VARIANTS" ) > "$OUT/demo_genomics.txt" 2>&1 &
        demo=$!
      fi
      if [ "$stage" = data ]; then
        /usr/bin/time -v python3 benchmarks/user_stores.py --shape "$STEPS,721,1440" --workdir "$WORK" --only v3-default > "$OUT/climate_store.txt" 2>&1
        grep -E "v3-default|Elapsed" "$OUT/climate_store.txt"; du -sh "$CLIMATE"
      fi
      if [ -n "${demo:-}" ]; then wait "$demo"; fi
      grep -E "wrote|Elapsed" "$OUT/demo_genomics.txt"
      [ -d "$GENOMICS" ] || python3 benchmarks/tile_genomics.py "$BASE" "$GENOMICS" --reps "$REPS" 2>/dev/null
      du -sh "$GENOMICS" ;;
    ceiling)
      timeout 200 python3 benchmarks/host_read.py --store "$CLIMATE" --gpus "$GPUS" --stages pipeline --repeat 2 2>&1 | grep -v Warn | tee "$OUT/ceiling_read.txt"
      timeout 100 python3 benchmarks/host_read.py --store "$CLIMATE" --gpus "$GPUS" --stages h2d --repeat 3 --steps 2920 2>&1 | grep -v Warn | tee "$OUT/ceiling_bus.txt" ;;
    climate)
      timeout "${CLIMATE_TIMEOUT:-420}" python3 benchmarks/scaling.py --store "$CLIMATE" --gpus "$GPUS" --repeat 2 --threads 8 \
        --flows standardized_anomaly,monthly_anomaly,rolling --memory-limit "$BUDGET" --worker-saturation 1.0 \
        --json "$OUT/scaling_climate.json" > "$OUT/scaling_climate.txt" 2>&1
      grep -v -E "Warning|warn" "$OUT/scaling_climate.txt" | cut -c1-400 | tail -30 ;;
    genomics)
      timeout "${GENOMICS_TIMEOUT:-480}" python3 benchmarks/scaling.py --genomics-store "$GENOMICS" --gpus "$GPUS" --repeat "${GREPEAT:-2}" \
        --threads "$GTHREADS" --variant-chunk "$VCHUNK" --flows "${GFLOWS:-pca,gwas}" --memory-limit "$GBUDGET" --worker-saturation 1.0 \
        --json "$OUT/scaling_genomics.json" > "$OUT/scaling_genomics.txt" 2>&1
      grep -v -E "Warning|warn" "$OUT/scaling_genomics.txt" | cut -c1-400 | tail -30 ;;
    processes)
      timeout "${PROCESSES_TIMEOUT:-540}" python3 benchmarks/scaling.py --warm-memory "${WARM:-64GB}" --user-stores "${LAYOUTS:-v3-default,v2-blosc,zlib}" \
        --shape "$STEPS,721,1440" --workdir "$WORK" --genomics-store "$GENOMICS" --gpus "$GPUS" --processes "${PROCS:-2}" \
        --trace --json "$OUT/scaling_processes.json" > "$OUT/scaling_processes.txt" 2>&1
      grep -v -E "Warning|warn" "$OUT/scaling_processes.txt" | cut -c1-200 | tail -20 ;;
    compare)
      mkdir -p "$WORK/compare"; warm="--warm-memory ${WARM:-64GB}"
      for round in $(seq "${ROUNDS:-3}"); do
        for side in old new; do
          tree=$PWD; [ "$side" = old ] && tree=$(cd "$OLD_TREE" && pwd)
          name="$side$round"
          (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" timeout "${COMPARE_TIMEOUT:-200}" python3 benchmarks/scaling.py $warm \
            --user-stores "${LAYOUTS:-v2-blosc}" --shape "$STEPS,721,1440" --workdir "$WORK" --gpus "$GPUS" --processes 1 --trace \
            ${SCALING_ARGS:-} --json "$WORK/compare/$name.json" > "$WORK/compare/$name.txt" 2>&1)
          warm=""
          echo "== $name"; grep -E "^(v2|v3|zlib)" "$WORK/compare/$name.txt" | cut -c1-120
          mkdir -p "$WORK/compare/traces-$name"
          (cd "$WORK/scaling-processes" && tar cf - --exclude='*.zarr' .) | tar xf - -C "$WORK/compare/traces-$name"
          rm -rf "$WORK/scaling-processes"
        done
      done
      tar czf "$OUT/compare.tgz" -C "$WORK" compare ;;
    tests)
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attach.py tests/test_cluster.py tests/test_locality.py \
        tests/test_genomics_pca.py > "$OUT/cluster_tests.txt" 2>&1
      tail -5 "$OUT/cluster_tests.txt"
      for n in ${GPUS//,/ }; do
        timeout 100 python3 benchmarks/fixed_cost.py --cluster local-cuda --gpus "$n" --repeat 15 --json "$OUT/fixed_cost_${n}gpu.json" 2>&1 | grep -v -i warn | tail -14
      done ;;
  esac
done
