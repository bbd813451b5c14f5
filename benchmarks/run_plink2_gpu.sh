#!/usr/bin/env bash
# PLINK 2 against pipeline on one GPU machine, in one command (outputs under $OUT):
#   1. PLINK 2 unpacked from Debian's .deb files in $DEBS (benchmarks/plink2.py's docstring says
#      which), the genotypes simulated and converted (PLINK 1 -> .pgen, and bio2zarr's VCF Zarr),
#      in the background while
#   2. the genomics GPU tests run (TESTS, a pytest selection);
#   3. then the timed comparison (BACKEND: gpu, or cpu to try it), each operation a whole fresh process (benchmarks/plink2.py);
#      at 25,000 x 200,000 PLINK 2's --pca approx takes about 270 s on 16 cores, so give the whole
#      comparison BENCH_TIMEOUT=600 or run pca apart (OPS=pca).
# Usage: OUT=dir DEBS=dir SAMPLES=25000 VARIANTS=200000 [OPS=pca,glm] bash benchmarks/run_plink2_gpu.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
SAMPLES=${SAMPLES:-25000}; VARIANTS=${VARIANTS:-200000}; WORK=${WORK:-/tmp/plink2-bench}
TESTS=${TESTS-tests/test_genomics_sgkit_a.py tests/test_genomics_sgkit_b.py tests/test_genomics_sgkit_c.py tests/test_sample_tables.py}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
pkg=/tmp/plink2pkg; mkdir -p "$pkg"
for f in "${DEBS:-.extra}"/*.deb; do dpkg -x "$f" "$pkg"; done
args=(--samples "$SAMPLES" --variants "$VARIANTS" --workdir "$WORK" --backend "${BACKEND:-gpu}" --plink2 "$pkg/usr/bin/plink2")
( /usr/bin/time -v python3 benchmarks/plink2.py "${args[@]}" --prepare-only ) > "$OUT/prepare.txt" 2>&1 &
prep=$!
if [ -n "$TESTS" ]; then
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -m gpu $TESTS -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
  tail -5 "$OUT/gpu_tests.txt"
fi
wait "$prep"
grep -E "prepared|Elapsed|Maximum resident|Error|error" "$OUT/prepare.txt" | head -20
du -sh "$WORK"/data.* 2>/dev/null
timeout "${BENCH_TIMEOUT:-600}" python3 benchmarks/plink2.py "${args[@]}" --ops "${OPS:-freq,missing,hardy,pca,glm}" --json "$OUT/plink2.json" 2>&1 | tee "$OUT/plink2.txt"
