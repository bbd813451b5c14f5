#!/usr/bin/env bash
# The genomics GPU checks and figures on a GPU machine, in one command (outputs under $OUT):
#   1. the genomics tests on the GPU (GPU results equal to the CPU's), then the rest of the GPU suite;
#   2. the genotype-counting kernels' GB/s beside a device copy;
#   3. a VCF Zarr store from `pipeline demo --kind genomics` (timed), and pipeline (GPU, CPU) against
#      sgkit on it (benchmarks/genomics_sgkit.py) where sgkit is importable (SGKIT_PATH).
# Usage: OUT=dir SAMPLES=25000 VARIANTS=20000 bash benchmarks/run_genomics_gpu.sh [tests|bench|all]
# A larger store: REPS=10 repeats the demo store 10 times along variants (benchmarks/tile_genomics.py;
# 25,000 x 200,000 is 10 GB of genotypes). Other settings: GROUPS_, TOOLS (pipeline-gpu@3.4GB: under
# that device budget), PCA_ALGO (tsqr, randomized), SGKIT_RUNS (1: sgkit's first run only),
# DIST_SAMPLES, DIST_VARIANTS, BENCH_TIMEOUT (seconds for the whole comparison), SGKIT_PYTHON (a
# Python with sgkit and its pinned dependencies, for sgkit's processes).
# The functions added for sgkit 0.10's API, pipeline's GPU against sgkit's first run:
#   SAMPLES=10000 VARIANTS=20000 GROUPS_=frequencies,haplotypes,relatedness,regenie TOOLS=pipeline-gpu,sgkit \
#   SGKIT_RUNS=1 DIST_SAMPLES=1000 DIST_VARIANTS=4000 SGKIT_PYTHON=venv/bin/python bash benchmarks/run_genomics_gpu.sh bench
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
what=${1:-all}
SAMPLES=${SAMPLES:-25000}; VARIANTS=${VARIANTS:-20000}; STORE=${STORE:-/tmp/genomics.vcz}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import scipy, sys; print('scipy', scipy.__version__)" > "$OUT/env.txt" 2>&1
python3 -c "import sklearn; print('sklearn', sklearn.__version__)" >> "$OUT/env.txt" 2>&1
REPS=${REPS:-1}
if [ ! -d "$STORE" ] && [ "$what" != tests ]; then
  base=$STORE; [ "$REPS" -gt 1 ] && base=$STORE.base
  ( /usr/bin/time -v python3 -m pipeline demo --kind genomics "$base" --samples "$SAMPLES" --variants "$VARIANTS" &&
    if [ "$REPS" -gt 1 ]; then python3 benchmarks/tile_genomics.py "$base" "$STORE" --reps "$REPS"; fi ) > "$OUT/demo.txt" 2>&1 &
  demo=$!
fi
if [ "$what" != bench ]; then
  timeout 240 python3 -m pytest -q -m "gpu or cudasim" tests/test_genomics_*.py -x -p no:cacheprovider > "$OUT/gpu_genomics_tests.txt" 2>&1
  tail -3 "$OUT/gpu_genomics_tests.txt"
  timeout 150 python3 benchmarks/genotype_counts.py --backend gpu --variants 20000 --samples 20000 --json "$OUT/counts.json" > "$OUT/counts.txt" 2>&1
  tail -12 "$OUT/counts.txt"
fi
if [ "$what" = all ] || [ "$what" = suite ]; then
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider --deselect tests/test_genomics_io.py > "$OUT/gpu_suite.txt" 2>&1
  tail -4 "$OUT/gpu_suite.txt"
fi
if [ -n "${demo:-}" ]; then wait "$demo"; fi
grep -E "Elapsed|Maximum resident|genotype_bytes" "$OUT/demo.txt"; du -sh "$STORE" 2>/dev/null
if [ "$what" != tests ] && [ -d "$STORE" ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/genomics_sgkit.py "$STORE" ${SGKIT_PATH:+--sgkit "$SGKIT_PATH"} \
    ${SGKIT_PYTHON:+--sgkit-python "$SGKIT_PYTHON"} \
    --groups "${GROUPS_:-counting,popgen,gwas,pca,distance}" --tools "${TOOLS:-pipeline-gpu,pipeline-cpu,sgkit}" \
    --pca-algorithm "${PCA_ALGO:-tsqr}" --sgkit-runs "${SGKIT_RUNS:-2}" \
    --distance-samples "${DIST_SAMPLES:-2000}" --distance-variants "${DIST_VARIANTS:-20000}" \
    --json "$OUT/genomics_sgkit.json" 2>&1 | tee "$OUT/genomics_sgkit.txt"
fi
