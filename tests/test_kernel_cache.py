"""Numba's disk cache of kernels made by factories (``launch.cpu_jit`` closures): two
specializations compiled in two processes, then loaded together in a third, each give their own
results. Numba names a compiled function's symbol by its qualified name and a per-process count:
before ``launch._named_by_closure``, the third process sent the second specialization's calls to
the first one's inner function (a detrending twin of degree 2 ran degree 3's solve)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

FACTORY = textwrap.dedent('''
    import sys
    import numpy as np
    from pipeline.kernels import launch

    def make(d):
        m = d + 1

        @launch.cpu_jit
        def inner(s, b):  # a loop LLVM does not inline: its caller calls it by its symbol
            for k in range(m):
                b[k] = 0.0
            for i in range(s.shape[0]):
                for k in range(m):
                    b[k] += s[i] ** k
            if b[0] > 1e300:
                raise ValueError("too large")

        @launch.cpu_jit
        def outer(x):
            b = np.zeros(8)
            inner(x, b)
            return b

        return outer

    x = np.arange(5.0)
    for d in map(int, sys.argv[1:]):
        want = np.zeros(8)
        want[:d + 1] = [(x ** k).sum() for k in range(d + 1)]
        print(d, np.array_equal(make(d)(x), want))
''')


def test_two_specializations_from_two_processes_load_together(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("NUMBA_DISABLE_JIT", None)

    def run(*degrees) -> list[str]:
        r = subprocess.run([sys.executable, str(tmp_path / "factory.py"), *map(str, degrees)], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout.split("\n")[:-1]

    assert run(2) == ["2 True"]  # compiled and saved, each in a process of its own
    assert run(3) == ["3 True"]
    assert len(list((tmp_path / "numba").rglob("*.nbc"))) == 4
    assert run(3, 2) == ["3 True", "2 True"]  # both loaded from the cache in one process
    assert run(2, 3) == ["2 True", "3 True"]
