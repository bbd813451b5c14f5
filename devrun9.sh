python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl-g/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
timeout 560 python3 -m pytest -v -m gpu -p no:cacheprovider -x > $OUT/full.txt 2>&1
echo "rc=$?"
grep -n -E "PASSED|FAILED|ERROR" $OUT/full.txt | tail -4
grep -n -A45 -E "Fatal Python error" $OUT/full.txt | grep -v "site-packages/_pytest\|pluggy" | head -70
tail -5 $OUT/full.txt | cut -c1-300
