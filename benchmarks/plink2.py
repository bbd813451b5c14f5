"""pipeline against PLINK 2 on the same msprime genotypes, each tool reading its own format.

The genotypes (``--samples`` x ``--variants``, 25,000 x 200,000 by default) are simulated once by
msprime (:func:`pipeline.demo_genomics.simulate`: the demo's three populations), keeping the
first ``--variants`` biallelic sites, and written once as a PLINK 1 fileset (``data.bed``, the
alternate allele as A1). A VCF of 25,000 samples is 20 GB of text for 200,000 variants, and
bio2zarr's vcf2zarr reads an unindexed VCF in one process, which is why the genotypes travel as
the .bed (1.25 GB). A fraction ``--missing-variants`` of the variants (chosen by the seed) has
calls missing whole at the rate ``--missing``; the other variants are complete. A quantitative
trait (the alternate-allele dosage at ten causal variants, three covariates and noise) is
simulated from the seed into ``samples.tsv`` (for pipeline, attached to the store at load by
:func:`pipeline.sources.samples.attach`, inside the timed process) and into PLINK's
``trait.pheno`` and ``covar.cov`` (the same values). Then, untimed:

- ``bio2zarr.plink.convert`` (bio2zarr's ``plink2zarr`` with its defaults: Zarr v2, chunks of
  1,000 variants x 10,000 samples), which makes the VCF Zarr that pipeline reads;
- ``plink2 --bfile data --make-pgen`` (PLINK 2's .pgen/.pvar/.psam).

Everything is kept under ``--workdir`` and reused by a later run with the same sizes and seed.
Each operation is then timed as a whole process, first run, one process after the other:

============  =====================================  ==============================================
operation     PLINK 2 (``--threads`` all cores)      pipeline (a fresh process on ``--backend``)
============  =====================================  ==============================================
freq          ``--freq``                             ``count_variant_alleles``
missing       ``--missing``                          ``variant_stats`` + ``sample_stats``
hardy         ``--hardy``                            ``hardy_weinberg_test``
pca           ``--pca approx 10``                    ``filter_variants`` (polymorphic),
                                                     ``count_call_alternate_alleles``,
                                                     ``impute_mean``, ``pca`` (randomized, 10)
glm           ``--glm hide-covar`` with ``--pheno``  ``count_call_alternate_alleles``,
              and ``--covar``                        ``impute_mean``, ``gwas_linear_regression``
============  =====================================  ==============================================

and the results compared:

- alternate-allele frequencies and missing rates (variants and samples): equal to PLINK 2's
  printed rounding (6 significant digits: relative 1e-5);
- HWE p-values: both are Wigginton, Cutler and Abecasis's exact test (PLINK 2's two-sided
  p-value, sgkit's algorithm): relative 1e-4 where p > 1e-300 (PLINK 2 prints 6 digits, and sums
  the probabilities in its own order, with a tolerance for ties of 1 + 1e-7);
- PCA: PLINK 2's eigenvalues are those of the GRM (standardized by ``sqrt(2p(1-p))``, divided by
  the variants M); sgkit's Patterson scaling divides by ``sqrt(p(1-p))`` and its explained
  variance is the variance of the projections (divided by the samples n), so PLINK 2's
  eigenvalue is ``n / (2 M)`` times pipeline's explained variance. Both mean-impute missing calls
  and both are approximate: PLINK 2's block Krylov method, and a randomized SVD here with
  ``n_iter=8`` power iterations and a subspace of 60 columns (``n_oversamples=50``, where dask's
  and sgkit's default subspace is 20). Past the 2 axes of the 3 populations the eigenvalues are
  a noise floor of close values, where a narrow subspace converges slowly. At 5,000 samples x
  50,000 variants (seed 0; a 2-core host, no GPU, shared, 2026-11-29): pipeline's 10 eigenvalues
  within 3.0e-4 of PLINK 2's approximate ones (and within 0.04 % of pipeline's exact
  ``algorithm="tsqr"``), where the default subspace left the first 2 within 3.0e-4 and the rest
  up to 1.9 % below (``n_oversamples=30``: 0.26 %; 50 with 4 iterations: 0.94 %).
  PLINK 2's exact ``--pca 10`` (203 s on the 2 threads) is 0.35-0.39 % above both its approximate
  eigenvalues and pipeline's exact ones, the same factor for all ten: a normalization of its own,
  not an approximation error. The pipeline process (its wall time less the warm run) took
  20-22 s with the default subspace, 25 s with the wide one; PLINK 2's ``--pca approx 10``,
  32-34 s. Held to: all 10 within 1 %;
- GLM: betas and p-values of the trait on the variants with no missing call within relative
  1e-3 (print rounding; the t-test is the same). Where calls are missing PLINK 2 leaves the
  samples out of that variant's regression and pipeline imputes the variant's mean, so those
  variants are reported (the correlation of their betas) but not held to the tolerance.

It prints one table: operation, PLINK 2 seconds, pipeline seconds, speed-up, the phases of
pipeline's process, agreement. pipeline's process runs the operation twice and times its phases
(import, open with the sample table, first run, warm run); its seconds in the table are the
process's wall time less the warm run: the process as a user's, which stops after one run.

    python benchmarks/plink2.py --workdir /tmp/plink2-bench --backend gpu --json plink2.json

Verified small run (CPU backend, 2 cores, PLINK v2.00a3.5 from Debian 12 on OpenBLAS; not the issue's size,
which is meant for the GPU machine):

    python benchmarks/plink2.py --samples 500 --variants 5000 --backend cpu --workdir p2

    operation  PLINK 2 s  pipeline s  speed-up  import  open  first   warm  agreement
    freq            0.02        2.10     0.01x    0.57  0.47   0.39   0.02  ok: alt_freq 4.8e-06
    missing         0.02        2.15     0.01x    0.57  0.48   0.40   0.02  ok: variant_missing 9.6e-16, sample_missing 1.1e-13
    hardy           0.02        2.01     0.01x    0.59  0.42   0.42   0.02  ok: hwe_p 4.5e-06
    pca             0.65        1.80     0.36x    0.43  0.25   0.68   0.34  ok: eigenvalues: first 2 2.0e-04, all 10 2.0e-04
    glm             0.03        2.62     0.01x    0.58  0.45   0.85   0.06  ok: beta 4.9e-06, p 4.4e-06 (4500 complete variants); 500 with missing calls: correlation of betas 0.9999

The pca row is a later run (``--ops pca``, with ``n_oversamples=50``; the default subspace gave
all 10 within 4.7e-03 there). At this size each pipeline process is mostly Python's imports and
the opening of the store (about 1.5 s): the speed-ups say nothing of the target size, only that
every comparison holds.

PLINK 2 on the GPU machine (no downloads there): on a machine with Debian's packages,
``apt-get download plink2 liblapack3 libblas3 libgfortran5 libquadmath0 libdeflate0
libopenblas0-pthread`` (the last for multi-threaded BLAS, which the script puts first; ``apt-cache
depends plink2``: libblas3 and liblapack3, libdeflate0, libzstd1, zlib1g and libc6;
``ldd /usr/lib/plink2/plink2-avx2`` adds libgfortran5 and libquadmath0 through LAPACK), carry the
.deb files over and unpack them all into one folder with ``for f in *.deb; do dpkg -x $f
plink2pkg; done``. ``plink2pkg/usr/bin/plink2`` is Debian's dispatch script (it picks
``plink2pkg/usr/lib/plink2/plink2-avx2`` on an AVX2 machine); ``--plink2
plink2pkg/usr/bin/plink2`` runs it with ``LD_LIBRARY_PATH`` set to the unpacked libraries
(``usr/lib/x86_64-linux-gnu`` and its ``blas`` and ``lapack`` folders), which this script adds
itself where the binary sits in such a tree. The image must supply libc6 (glibc 2.34 or later:
the newest symbol version the binary and libgfortran5 ask for), zlib1g, libzstd1 and libgcc-s1.
msprime, tskit and bio2zarr are needed there too, carried as wheels. On
the GPU machine, then:

    python3 benchmarks/plink2.py --backend gpu --plink2 plink2pkg/usr/bin/plink2 --workdir /tmp/p2 --json plink2.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OPS = ("freq", "missing", "hardy", "pca", "glm")
COVARIATES = ("age", "sex", "normal")
CAUSAL = 10
BLOCK = 256  # variants formatted at a time
PCA_ITERATIONS = 8  # power iterations of the randomized SVD: see the module docstring
PCA_OVERSAMPLES = 50  # its subspace: 10 + 50 columns, where dask's and sgkit's default is 20
PHASES = ("import", "open", "first", "warm")
TOLERANCES = {"freq": 1e-5, "missing": 1e-5, "hardy": 1e-4, "pca": 0.01, "glm": 1e-3}


# --- the data ---------------------------------------------------------------------------------------


def _biallelic_sites(samples: int, variants: int, seed: int):
    """The tree sequence, and the ids of its first ``variants`` biallelic sites."""
    from pipeline.demo_genomics import simulate

    n = int(variants * 1.02) + 10  # about 1 % of msprime's sites have more than one mutation
    while True:
        ts = simulate(samples, n, seed)
        one = np.bincount(ts.mutations_site, minlength=ts.num_sites) == 1  # one mutation: two alleles
        sites = np.flatnonzero(one)
        if len(sites) >= variants:
            return ts, sites[:variants]
        n = int(n * 1.1) + 10


# PLINK 1's two bits for an alternate-allele dosage (A1, the alternate allele, counted):
# 0b00 two A1, 0b10 one, 0b11 none, 0b01 missing
BED_CODE = np.array([0b11, 0b10, 0b00], dtype=np.uint8)
MISSING_CODE = 0b01


def _bed_rows(dosage: np.ndarray) -> np.ndarray:
    """(variants, samples) dosages (-1 missing) packed four samples a byte, the first sample in
    the lowest bits (PLINK 1's variant-major .bed)."""
    code = np.where(dosage < 0, MISSING_CODE, BED_CODE[np.clip(dosage, 0, 2)]).astype(np.uint8)
    pad = (-code.shape[1]) % 4
    code = np.pad(code, ((0, 0), (0, pad))).reshape(code.shape[0], -1, 4)  # the padding bits are 0
    return code[..., 0] | (code[..., 1] << 2) | (code[..., 2] << 4) | (code[..., 3] << 6)


def write_data(work: Path, samples: int, variants: int, seed: int, missing: float, missing_variants: float) -> bool:
    """The genotypes as a PLINK 1 fileset (``data.bed``/``.bim``/``.fam``), and the trait and
    covariates (for pipeline and PLINK 2), once for these arguments (False where they were there
    already)."""
    params = dict(samples=samples, variants=variants, seed=seed, missing=missing, missing_variants=missing_variants)
    done = work / "data.json"
    if done.exists() and json.loads(done.read_text()) == params:
        return False
    for name in ("data.bed", "data.bim", "data.fam", "data.vcz", "data.pgen", "data.pvar", "data.psam",
                 "samples.tsv", "plink2", "pipeline"):
        path = work / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    ts, sites = _biallelic_sites(samples, variants, seed)
    rng = np.random.default_rng([seed, 45])
    with_missing = np.sort(rng.choice(variants, size=round(missing_variants * variants), replace=False))
    causal = np.sort(rng.choice(np.setdiff1d(np.arange(variants), with_missing), size=min(CAUSAL, variants),
                                replace=False))
    effects = rng.normal(scale=0.5, size=len(causal))
    ids = [f"tsk_{i}" for i in range(samples)]
    dosage = np.zeros(samples)
    wanted = np.full(ts.num_sites, -1, dtype=np.int64)
    wanted[sites] = np.arange(variants)
    missing_row = np.zeros(variants, dtype=bool)
    missing_row[with_missing] = True
    effect = dict(zip(causal.tolist(), effects))
    rows = np.empty((BLOCK, samples), dtype=np.int8)
    with open(work / "data.bed", "wb") as bed, open(work / "data.bim", "w") as bim:
        bed.write(b"\x6c\x1b\x01")
        n = 0
        for v in ts.variants():
            k = wanted[v.site.id]
            if k < 0:
                continue
            d = v.genotypes.reshape(samples, 2).sum(axis=1, dtype=np.int8)
            if k in effect:
                dosage += effect[k] * d
            if missing_row[k]:
                d[rng.random(samples) < missing] = -1
            rows[n] = d
            n += 1
            ref, alt = v.alleles
            bim.write(f"1\tv{k}\t0\t{int(v.site.position) + 1}\t{alt}\t{ref}\n")
            if n == BLOCK or k == variants - 1:
                bed.write(_bed_rows(rows[:n]).tobytes())
                n = 0
    with open(work / "data.fam", "w") as fam:
        fam.writelines(f"{name}\t{name}\t0\t0\t0\t-9\n" for name in ids)
    covariates = np.column_stack([rng.normal(size=samples), rng.integers(0, 2, size=samples), rng.normal(size=samples)])
    trait = dosage + covariates @ rng.normal(scale=0.3, size=3) + rng.normal(size=samples)
    with open(work / "samples.tsv", "w") as tsv, open(work / "trait.pheno", "w") as pheno, \
            open(work / "covar.cov", "w") as cov:
        tsv.write("sample_id\ttrait\t" + "\t".join(COVARIATES) + "\n")
        pheno.write("#FID\tIID\ttrait\n")
        cov.write("#FID\tIID\t" + "\t".join(COVARIATES) + "\n")
        for i, name in enumerate(ids):
            c = "\t".join(repr(float(x)) for x in covariates[i])
            tsv.write(f"{name}\t{float(trait[i])!r}\t{c}\n")
            pheno.write(f"{name}\t{name}\t{float(trait[i])!r}\n")
            cov.write(f"{name}\t{name}\t{c}\n")
    done.write_text(json.dumps(params))
    return True


def plink2_env(binary: str) -> dict:
    """The environment for ``binary``: with the libraries of a Debian package tree it sits in
    (unpacked by ``dpkg -x``) on ``LD_LIBRARY_PATH``."""
    env = dict(os.environ)
    path = shutil.which(binary)
    if path is None:
        raise SystemExit(f"{binary}: no such PLINK 2 binary (--plink2; the module docstring says how to unpack one)")
    # usr/bin/plink2 -> usr/lib/plink2/simd-dispatch: the tree's root is two levels above usr/bin
    root = Path(path).absolute().parent.parent
    # OpenBLAS first where it was unpacked too: Debian's plink2 links the reference BLAS and LAPACK
    # (one thread), which took 280 s for --pca approx at 25,000 x 200,000 on 16 cores
    libs = [root / "lib" / "x86_64-linux-gnu" / sub for sub in ("openblas-pthread", "", "blas", "lapack")]
    libs = [str(p) for p in libs if p.is_dir() and root != Path("/usr")]
    if libs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    return env


def convert(work: Path, plink2: str, env: dict, workers: int) -> dict:
    """VCF Zarr (bio2zarr's ``plink2zarr``, its defaults: chunks of 1,000 variants x 10,000
    samples) and .pgen (``plink2 --bfile --make-pgen``) from the one PLINK 1 fileset, untimed but
    reported; each made once."""
    seconds = {}
    if not (work / "data.vcz").exists():
        t = time.perf_counter()
        _run([sys.executable, "-c", "import sys; from bio2zarr import plink; "
              "plink.convert(sys.argv[1], sys.argv[2], worker_processes=int(sys.argv[3]))",
              str(work / "data"), str(work / "data.vcz.partial"), str(workers)])
        (work / "data.vcz.partial").rename(work / "data.vcz")
        seconds["bio2zarr"] = time.perf_counter() - t
    if not (work / "data.pgen").exists():
        t = time.perf_counter()
        _run([plink2, "--bfile", str(work / "data"), "--make-pgen", "--threads", str(os.cpu_count()),
              "--out", str(work / "data")], env=env)
        seconds["make_pgen"] = time.perf_counter() - t
    return seconds


def _run(cmd: list[str], env: dict | None = None) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


# --- PLINK 2 ----------------------------------------------------------------------------------------

PLINK_ARGS = {
    "freq": ["--freq"],
    "missing": ["--missing"],
    "hardy": ["--hardy"],
    "pca": ["--pca", "approx", "10"],
    "glm": ["--glm", "hide-covar", "--pheno", "trait.pheno", "--covar", "covar.cov"],
}


def run_plink2(op: str, work: Path, plink2: str, env: dict) -> float:
    out = work / "plink2" / op
    out.parent.mkdir(exist_ok=True)
    args = [a if not a.endswith((".pheno", ".cov")) else str(work / a) for a in PLINK_ARGS[op]]
    cmd = [plink2, "--pfile", str(work / "data"), *args, "--threads", str(os.cpu_count()), "--out", str(out)]
    t = time.perf_counter()
    _run(cmd, env=env)
    return time.perf_counter() - t


def _table(path: Path) -> dict:
    """A PLINK 2 output table, by column (numbers as float64 where they are numbers)."""
    lines = path.read_text().splitlines()
    names = lines[0].lstrip("#").split("\t")
    rows = [ln.split("\t") for ln in lines[1:]]
    out = {}
    for i, name in enumerate(names):
        col = [r[i] for r in rows]
        try:
            out[name] = np.array([np.nan if x == "NA" else float(x) for x in col])
        except ValueError:
            out[name] = np.array(col)
    return out


def read_plink2(op: str, work: Path) -> dict:
    base = work / "plink2" / op
    if op == "freq":
        return {"alt_freq": _table(base.with_suffix(".afreq"))["ALT_FREQS"]}
    if op == "missing":
        return {"variant_missing": _table(base.with_suffix(".vmiss"))["F_MISS"],
                "sample_missing": _table(base.with_suffix(".smiss"))["F_MISS"]}
    if op == "hardy":
        return {"hwe_p": _table(base.with_suffix(".hardy"))["P"]}
    if op == "pca":
        return {"eigenvalues": np.loadtxt(base.with_suffix(".eigenval"), ndmin=1)}
    t = _table(Path(f"{base}.trait.glm.linear"))
    sign = np.where(t["A1"] == t["ALT"], 1.0, -1.0)  # the effect of the alternate allele
    return {"beta": t["BETA"] * sign, "p": t["P"]}


# --- pipeline (in a process of its own) ---------------------------------------------------------------


def _analysis(op: str, sg, ds) -> tuple[dict, dict]:
    """pipeline's side of ``op`` on the opened dataset: (arrays to compute, host scalars)."""
    if op == "freq":
        ac = sg.count_variant_alleles(ds, merge=False).variant_allele_count
        return {"alt_freq": ac[:, 1] / ac.sum("alleles")}, {}
    if op == "missing":
        return {"variant_missing": 1 - sg.variant_stats(ds, merge=False).variant_call_rate,
                "sample_missing": 1 - sg.sample_stats(ds, merge=False).sample_call_rate}, {}
    if op == "hardy":
        return {"hwe_p": sg.hardy_weinberg_test(ds, merge=False).variant_hwe_p_value}, {}
    if op == "pca":
        # Patterson's scale needs variation: the variants polymorphic among the called samples
        ds = sg.filter_variants(ds, min_maf=1e-12)
    ds = sg.impute_mean(sg.count_call_alternate_alleles(ds))
    if op == "pca":
        ds = ds.assign(call_alternate_allele_count=ds.call_alternate_allele_count.chunk({"samples": -1}))
        r = sg.pca(ds, n_components=10, algorithm="randomized", n_iter=PCA_ITERATIONS,
                   n_oversamples=PCA_OVERSAMPLES, merge=False)
        return {"explained_variance": r.sample_pca_explained_variance}, {"variants": ds.sizes["variants"]}
    r = sg.gwas_linear_regression(ds, dosage="call_alternate_allele_count", traits=["sample_trait"],
                                  covariates=[f"sample_{c}" for c in COVARIATES], merge=False)
    return {"beta": r.variant_linreg_beta[:, 0], "p": r.variant_linreg_p_value[:, 0]}, {}


def pipeline_one(op: str, store: str, backend: str, out: str) -> None:
    """``op`` in this (fresh) process, twice: the seconds of its phases go into ``out`` with the
    results (``phases``: import, open (with the sample table), first run, warm run)."""
    t0 = time.perf_counter()
    import pipeline
    import pipeline.genomics as sg
    from pipeline.sources import samples

    t1 = time.perf_counter()
    ds = sg.load_dataset(store, backend=backend)
    ds = samples.attach(ds, samples.read_table(Path(store).parent / "samples.tsv"))
    t2 = time.perf_counter()
    phases = [t1 - t0, t2 - t1]
    for _ in range(2):
        t = time.perf_counter()
        result, scalars = _analysis(op, sg, ds)
        values = pipeline.compute([v.data for v in result.values()])
        values = [np.asarray(pipeline.to_numpy(v), dtype=np.float64) for v in values]
        phases.append(time.perf_counter() - t)
    np.savez(out, phases=np.array(phases), **scalars, **dict(zip(result, values)))


def run_pipeline(op: str, work: Path, backend: str) -> float:
    out = work / "pipeline" / f"{op}.npz"
    out.parent.mkdir(exist_ok=True)
    cmd = [sys.executable, __file__, "--one", op, "--workdir", str(work), "--backend", backend]
    t = time.perf_counter()
    _run(cmd)
    return time.perf_counter() - t


# --- the comparison -----------------------------------------------------------------------------------


def _rel(a: np.ndarray, b: np.ndarray, floor: float = 0.0) -> float:
    """Largest relative difference where both are finite (inf where they are NaN in different places)."""
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return np.inf
    ok = ~np.isnan(a) & (np.abs(b) > floor)
    if not ok.any():
        return 0.0
    return float(np.max(np.abs(a[ok] - b[ok]) / np.maximum(np.abs(b[ok]), 1e-12)))


def compare(op: str, plink: dict, ours: dict, complete: np.ndarray, samples: int, variants: int) -> tuple[bool, str]:
    """(agrees, the words for the table)."""
    if op == "pca":
        ev = ours["explained_variance"] * samples / (2 * ours["variants"])
        rel = np.abs(ev - plink["eigenvalues"]) / plink["eigenvalues"]
        return bool(rel.max() < TOLERANCES[op]), f"eigenvalues: first 2 {rel[:2].max():.1e}, all 10 {rel.max():.1e}"
    if op == "glm":
        beta, p = _rel(ours["beta"][complete], plink["beta"][complete]), _rel(ours["p"][complete], plink["p"][complete], 1e-300)
        rest = ~complete
        other = ""
        if rest.any():
            a, b = ours["beta"][rest], plink["beta"][rest]
            both = np.isfinite(a) & np.isfinite(b)  # PLINK 2 gives NA where the called samples do not vary
            other = f"; {rest.sum()} with missing calls: correlation of betas {np.corrcoef(a[both], b[both])[0, 1]:.4f}"
        return bool(max(beta, p) < TOLERANCES[op]), f"beta {beta:.1e}, p {p:.1e} ({complete.sum()} complete variants){other}"
    worst = {k: _rel(ours[k], plink[k], 1e-300 if op == "hardy" else 0.0) for k in plink}
    return bool(max(worst.values()) < TOLERANCES[op]), ", ".join(f"{k} {v:.1e}" for k, v in worst.items())


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=25_000)
    p.add_argument("--variants", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--missing", type=float, default=0.02, help="fraction of calls missing in the variants that have some")
    p.add_argument("--missing-variants", type=float, default=0.1, help="fraction of variants with missing calls")
    p.add_argument("--workdir", default="plink2-bench", help="the data and results (reused where they match)")
    p.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--plink2", default="plink2", help="the PLINK 2 binary (default plink2 on PATH)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="bio2zarr's processes for the import")
    p.add_argument("--json")
    p.add_argument("--prepare-only", action="store_true", help="make the data and the two formats, time nothing")
    p.add_argument("--one", choices=OPS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    work = Path(a.workdir).absolute()
    if a.one:
        pipeline_one(a.one, str(work / "data.vcz"), a.backend, str(work / "pipeline" / f"{a.one}.npz"))
        return {}
    env = plink2_env(a.plink2)
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    written = write_data(work, a.samples, a.variants, a.seed, a.missing, a.missing_variants)
    prepared = ({"simulate_and_bed": time.perf_counter() - t} if written else {}) | convert(work, a.plink2, env, a.workers)
    if prepared:
        print("prepared (untimed in the table): " + ", ".join(f"{k} {v:.1f} s" for k, v in prepared.items()), flush=True)
    if a.prepare_only:
        return {}
    vmiss = None
    rows = []
    print(f"{'operation':9s} {'PLINK 2 s':>10s} {'pipeline s':>11s} {'speed-up':>9s}  "
          f"{'import':>6s} {'open':>5s} {'first':>6s} {'warm':>6s}  agreement", flush=True)
    for op in a.ops.split(","):
        plink_s = run_plink2(op, work, a.plink2, env)
        print(f"  {op}: PLINK 2 {plink_s:.2f} s", flush=True)  # kept if a time limit stops what follows
        wall = run_pipeline(op, work, a.backend)
        print(f"  {op}: pipeline's process {wall:.2f} s", flush=True)
        plink = read_plink2(op, work)
        with np.load(work / "pipeline" / f"{op}.npz") as z:
            ours = dict(z)
        phases = dict(zip(PHASES, ours.pop("phases").tolist()))
        ours_s = wall - phases["warm"]  # the process as if it had stopped after its first run
        if vmiss is None:  # the variants with no missing call, from PLINK 2's own count
            if not (work / "plink2" / "missing.vmiss").exists():
                run_plink2("missing", work, a.plink2, env)
            vmiss = read_plink2("missing", work)["variant_missing"]
        ok, words = compare(op, plink, ours, vmiss == 0, a.samples, a.variants)
        rows.append({"operation": op, "plink2_seconds": plink_s, "pipeline_seconds": ours_s,
                     "speedup": plink_s / ours_s, "pipeline_phases": phases, "agrees": ok, "agreement": words})
        print(f"{op:9s} {plink_s:10.2f} {ours_s:11.2f} {plink_s / ours_s:8.2f}x  "
              + " ".join(f"{phases[k]:{w}.2f}" for k, w in zip(PHASES, (6, 5, 6, 6)))
              + f"  {'ok' if ok else 'DIFFERS'}: {words}", flush=True)
    out = {"samples": a.samples, "variants": a.variants, "backend": a.backend, "threads": os.cpu_count(),
           "prepared_seconds": prepared, "rows": rows, "ok": all(r["agrees"] for r in rows)}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    sys.exit(0 if main().get("ok", True) else 1)
