python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl-g/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_encode.py 2>&1 | tail -3 | cut -c1-400
