python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl-g/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider -x 2>&1 | tail -15 | tee $OUT/gpu_tests.txt
