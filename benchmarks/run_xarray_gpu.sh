#!/usr/bin/env bash
# An analyst's xarray expressions on one GPU machine, in one command (outputs under $OUT):
#   1. the store (as xarray.to_zarr writes it; SHAPE, 6 GB of float32 by default) made in the
#      background while
#   2. the GPU tests of TESTS run (pytest -m gpu, WORKERS processes on the one GPU);
#   3. then benchmarks/xarray_gpu.py on ONLY (in-process first and warm, GPU and xarray + dask),
#      and PROCESSES as whole fresh processes; GPU_ONLY: expressions not run on the CPU; every
#      thread's stack sampled during the first expression's first GPU run ($OUT/first_stacks.json).
# Usage: OUT=dir bash benchmarks/run_xarray_gpu.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
SHAPE=${SHAPE:-1460,721,1440}; WORK=${WORK:-/tmp/xarray_gpu}
TESTS=${TESTS-tests/test_xarray_api.py tests/test_patches.py tests/test_generic_steps.py}
ONLY=${ONLY:-groupby_month_mean,groupby_season_std,groupby_anomaly,resample_YS_max,resample_MS_mean,rolling_mean_center,coarsen_mean,weighted_mean,polyfit,idxmax_lat,ffill,cumsum,count_above,where_mean,std}
PROCESSES=${PROCESSES:-groupby_month_mean,resample_YS_max,weighted_mean}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import xarray; from xarray.core.utils import module_available as m; print('xarray', xarray.__version__, 'flox', m('flox'), xarray.get_options()['use_flox'])" >> "$OUT/gpu.txt" 2>&1
( /usr/bin/time -v python3 benchmarks/xarray_gpu.py --shape "$SHAPE" --workdir "$WORK" --prepare-only ) > "$OUT/store.txt" 2>&1 &
store=$!
if [ -n "$TESTS" ]; then
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -n "${WORKERS:-6}" $TESTS -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -30; tail -2 "$OUT/gpu_tests.txt"
fi
wait "$store"
grep -E "ready|Elapsed|Error" "$OUT/store.txt"
timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/xarray_gpu.py --shape "$SHAPE" --workdir "$WORK" --only "$ONLY" \
  --repeat "${REPEAT:-2}" --processes "$PROCESSES" --gpu-only "${GPU_ONLY:-}" --stacks "$OUT/first_stacks.json" --json "$OUT/xarray_gpu.json" > "$OUT/xarray_gpu.txt" 2>&1
grep -v '^{' "$OUT/xarray_gpu.txt" | tail -30
