python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl-g/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_encode.py 2>&1 | tail -30 | cut -c1-400
timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider --deselect tests/test_gpu_encode.py > $OUT/full.txt 2>&1
echo "rc=$?"
tail -6 $OUT/full.txt | cut -c1-300
grep -n -A3 "Current thread" $OUT/full.txt | head
