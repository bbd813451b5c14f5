"""A realistic VCF Zarr store of any size, deterministic from a seed (``pipeline demo --kind
genomics``), and VCF files converted to VCF Zarr (``pipeline import-vcf``).

The demo store is simulated by msprime and written by bio2zarr, so it is what a user's own data
look like when bio2zarr converts them:

1. **Ancestry and mutations** (msprime): three populations (A, B, C) of 5,000 diploids that split
   2,000 generations ago from an ancestral population of 10,000, with symmetric migration of
   1e-4 per generation; recombination 1e-8 and mutation 1.25e-8 per base per generation, with
   msprime's default nucleotide model (JC69: a few sites have three or four alleles). The
   samples are split evenly between the three populations.
2. **Exactly** ``variants`` **sites**: the sequence is made long enough from the expected number
   of segregating sites (Watterson's ``4 N mu L sum_{i<2n} 1/i``, with N the ancestral size, is
   0.9 to 1.3 times what this demography gives), with a margin, and simulated longer (from a seed
   derived from the same one) in the rare case that it falls short; the first ``variants`` sites
   are kept and the contig ends after the last of them. VCF positions are 1-based.
3. **Written by bio2zarr** (``bio2zarr.tskit.convert``) in its own layout: Zarr v2 by default,
   Blosc zstd level 7, bit shuffle for genotypes and booleans, chunks of 1,000 variants x 10,000
   samples. bio2zarr encodes a chunk of variants at a time, so a store larger than memory is
   written in bounded memory.
4. **Missing calls**: each call is missing whole (-1, -1) with probability ``missing``, and one
   allele of it (-1 in one slot) with a tenth of that, decided by the seed, the variant and the
   sample alone (a random stream per variant), so the same calls are missing whatever the
   chunks. ``call_genotype`` and ``call_genotype_mask`` are rewritten chunk by chunk through
   zarr, with the store's own codec (threads, each holding one chunk).
5. **For the cohort and association ops**, three arrays that are *not* part of the VCF Zarr
   specification: ``sample_cohort`` (samples) int64, the population (0, 1, 2);
   ``sample_covariate`` (samples, covariates) float64: a standardized age, a sex (0 or 1) and a
   standard normal; ``sample_trait`` (samples, traits) float64: two quantitative traits, each the
   additive effect of the alternate-allele dosage at ten causal variants, the covariates, a shift
   by population (stratification, as real cohorts have) and noise.

All or nothing: everything is written in a hidden sibling directory that is renamed into place
when complete (:func:`pipeline.sinks.zarr.staged`); a failure or an interrupt removes it, and
nothing pipeline did not write is ever replaced.

msprime and bio2zarr (and cyvcf2, for VCF files) are optional (the ``genomics`` extra:
``python -m pip install -e ".[genomics]"`` in a checkout), imported only here, inside the functions; without them these functions
raise an :class:`~pipeline.errors.InputError` saying what to install (the command exits with 2).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .errors import InputError
from .sinks.zarr import staged

POPULATIONS = ("A", "B", "C")
POPULATION_SIZE = 5_000
ANCESTRAL_SIZE = 10_000
SPLIT_TIME = 2_000
MIGRATION_RATE = 1e-4
RECOMBINATION_RATE = 1e-8
MUTATION_RATE = 1.25e-8
LENGTH_MARGIN = 1.5  # the sequence simulated: this many times the expected length for the sites
HALF_MISSING = 0.1  # calls missing one allele, as a fraction of those missing whole
CAUSAL_VARIANTS = 10
TRAITS = 2
COVARIATES = ("age", "sex", "normal")
VARIANT_CHUNK = 1_000  # bio2zarr's defaults
SAMPLE_CHUNK = 10_000
INSTALL = "python -m pip install msprime 'bio2zarr[tskit,vcf]' (in a checkout: python -m pip install -e \".[genomics]\")"


def _require(*names: str) -> None:
    """InputError naming what to install where one of the optional packages ``names`` is missing."""
    import importlib

    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise InputError(f"{' and '.join(missing)} not installed: the genomics demo and VCF import need them ({INSTALL})")


# --- simulation -------------------------------------------------------------------------------------


def _demography():
    import msprime

    d = msprime.Demography()
    for name in POPULATIONS:
        d.add_population(name=name, initial_size=POPULATION_SIZE)
    d.add_population(name="ANC", initial_size=ANCESTRAL_SIZE)
    d.add_population_split(time=SPLIT_TIME, derived=list(POPULATIONS), ancestral="ANC")
    d.set_symmetric_migration_rate(list(POPULATIONS), MIGRATION_RATE)
    return d


def _msprime_seeds(seed: int, attempt: int) -> tuple[int, int]:
    """Two seeds for msprime (1 to 2**32 - 1) from the demo's seed and the attempt."""
    state = np.random.SeedSequence([seed, attempt]).generate_state(2, dtype=np.uint64)
    return tuple(int(s % (2**32 - 1)) + 1 for s in state)


def expected_length(samples: int, variants: int) -> int:
    """Bases that hold ``variants`` segregating sites, by Watterson's estimate with a margin."""
    harmonic = float(np.sum(1.0 / np.arange(1, 2 * samples)))
    per_base = 4 * ANCESTRAL_SIZE * MUTATION_RATE * max(harmonic, 1.0)
    return max(100, math.ceil(LENGTH_MARGIN * variants / per_base))


def simulate(samples: int, variants: int, seed: int = 0):
    """The tree sequence of ``samples`` diploids with exactly ``variants`` sites (deterministic)."""
    import msprime

    per_population = [samples // 3 + (k < samples % 3) for k in range(3)]
    length = expected_length(samples, variants)
    for attempt in range(10):
        ancestry_seed, mutation_seed = _msprime_seeds(seed, attempt)
        ts = msprime.sim_ancestry(
            samples={p: n for p, n in zip(POPULATIONS, per_population) if n}, demography=_demography(),
            sequence_length=length, recombination_rate=RECOMBINATION_RATE, random_seed=ancestry_seed,
        )
        ts = msprime.sim_mutations(ts, rate=MUTATION_RATE, random_seed=mutation_seed)
        if ts.num_sites >= variants:
            return _first_sites(ts, variants)
        length = math.ceil(length * LENGTH_MARGIN * variants / max(1, ts.num_sites))
    raise RuntimeError(f"msprime gave fewer than {variants} sites after 10 tries")  # pragma: no cover


def _first_sites(ts, n: int):
    """``ts`` cut after its ``n``-th site (positions are integers: msprime's discrete genome)."""
    end = int(ts.sites_position[n - 1]) + 1
    if end < ts.sequence_length:
        ts = ts.delete_intervals([[end, ts.sequence_length]], simplify=False).rtrim()
    assert ts.num_sites == n, (ts.num_sites, n)
    return ts


def _vcf_model(ts):
    """tskit's VCF model of ``ts`` with 1-based positions (tskit's default rounds them, which
    leaves a site at 0 on position 0); the contig keeps its length."""
    import dataclasses

    mapping = ts.map_to_vcf_model(position_transform=lambda x: np.round(np.asarray(x)).astype(np.int64) + 1)
    return dataclasses.replace(mapping, contig_length=int(ts.sequence_length))


# --- missing calls ----------------------------------------------------------------------------------


def call_uniforms(seed: int, variants: range, samples: slice) -> np.ndarray:
    """A uniform number in [0, 1) for each call of ``variants`` x ``samples``: draws of a PCG64
    stream of its own for each variant (from the seed and the variant), jumped ahead to the
    first sample, so each call's number is the same whatever the chunks that hold it. (A hash of
    each call in NumPy took 0.9 s for 1,000 x 10,000 calls, this 0.1 s.)"""
    out = np.empty((len(variants), samples.stop - samples.start))
    for k, v in enumerate(variants):
        bits = np.random.PCG64(np.random.SeedSequence([seed, 0x6D15, v]))
        bits.advance(samples.start)
        out[k] = np.random.Generator(bits).random(out.shape[1])
    return out


def set_missing(calls: np.ndarray, u: np.ndarray, rate: float) -> None:
    """Set calls missing in place (``u``: :func:`call_uniforms` of the same calls): whole where
    ``u < rate``; one allele where ``u`` is in the next ``rate * HALF_MISSING``, the first
    allele in the lower half of that range and the second in the upper half."""
    calls[u < rate] = -1
    half = rate * HALF_MISSING
    vi, si = np.nonzero((u >= rate) & (u < rate + half))
    calls[vi, si, (u[vi, si] >= rate + half / 2).astype(np.intp)] = -1


ROWS = 256  # variants at a time within a chunk: the temporaries of a thread stay small


def _set_missing(root: Path, seed: int, rate: float, threads: int) -> None:
    """Rewrite ``call_genotype`` and ``call_genotype_mask`` chunk by chunk with the missing calls."""
    import zarr

    g = zarr.open_array(root / "call_genotype", mode="r+")
    m = zarr.open_array(root / "call_genotype_mask", mode="r+")
    n_variants, n_samples, _ = g.shape
    cv, cs = g.chunks[0], g.chunks[1]

    def one(coords):
        i, j = coords
        rows, cols = slice(i * cv, min((i + 1) * cv, n_variants)), slice(j * cs, min((j + 1) * cs, n_samples))
        calls = g[rows, cols]
        for start in range(rows.start, rows.stop, ROWS):
            part = range(start, min(start + ROWS, rows.stop))
            set_missing(calls[part.start - rows.start:part.stop - rows.start], call_uniforms(seed, part, cols), rate)
        g[rows, cols] = calls
        m[rows, cols] = calls < 0

    grid = [(i, j) for i in range(-(-n_variants // cv)) for j in range(-(-n_samples // cs))]
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for _ in pool.map(one, grid):  # in order; the first error stops the demo
            pass


# --- the arrays beyond the specification --------------------------------------------------------------


def _sample_arrays(root: Path, ts, mapping, seed: int) -> dict[str, tuple[np.ndarray, tuple[str, ...], str]]:
    """sample_cohort, sample_covariate and sample_trait: name -> (values, dimensions, description)."""
    import zarr

    cohort = ts.nodes_population[mapping.individuals_nodes[:, 0]].astype(np.int64)
    n = len(cohort)
    rng = np.random.default_rng([seed, 7])
    covariates = np.column_stack([rng.normal(size=n), rng.integers(0, 2, size=n).astype(np.float64), rng.normal(size=n)])
    g = zarr.open_array(root / "call_genotype", mode="r")
    causal = np.sort(rng.choice(g.shape[0], size=min(CAUSAL_VARIANTS, g.shape[0]), replace=False))
    calls = g.get_orthogonal_selection((causal, slice(None), slice(None)))
    dosage = (calls > 0).sum(axis=2).astype(np.float64)  # alternate alleles among the called ones
    effects = rng.normal(scale=0.5, size=(len(causal), TRAITS))
    beta = rng.normal(scale=0.3, size=(len(COVARIATES), TRAITS))
    shift = rng.normal(scale=0.5, size=(len(POPULATIONS) + 1, TRAITS))  # + the ancestral population's index
    traits = dosage.T @ effects + covariates @ beta + shift[cohort] + rng.normal(size=(n, TRAITS))
    note = "not part of the VCF Zarr specification; pipeline's genomics demo"
    return {
        "sample_cohort": (cohort, ("samples",), f"Population of each sample (0, 1, 2: {', '.join(POPULATIONS)}); {note}"),
        "sample_covariate": (covariates, ("samples", "covariates"),
                             f"Covariates of each sample ({', '.join(COVARIATES)}); {note}"),
        "sample_trait": (traits, ("samples", "traits"),
                         f"Quantitative traits: causal variants {causal.tolist()}, covariates, population and noise; {note}"),
    }


def _write_table(root: Path, table) -> None:
    """A sample table's variables, matched to the store's samples, beside bio2zarr's arrays."""
    import zarr

    from .sources.samples import variables

    group = zarr.open_group(root, mode="r")
    ids = group["sample_id"]
    found = variables(table, ids[...].tolist(), set(group.array_keys()))
    arrays = {name: (values, ("samples",), attrs.pop("description")) for name, (values, attrs) in found.items()}
    _write_arrays(root, arrays, ids.chunks[0], attrs={name: attrs for name, (_, attrs) in found.items()})


def _write_arrays(root: Path, arrays: dict, samples_chunk: int, attrs: dict | None = None) -> None:
    """Each array beside bio2zarr's, in the store's Zarr format, with bio2zarr's default codec
    (``attrs``: more attributes of some arrays, by name)."""
    import numcodecs
    import zarr

    group = zarr.open_group(root, mode="r+")
    v2 = group.metadata.zarr_format == 2
    for name, (values, dims, description) in arrays.items():
        if v2:
            codec = numcodecs.Blosc(cname="zstd", clevel=7, shuffle=numcodecs.Blosc.SHUFFLE)
            extra = {}
        else:
            from zarr.codecs import BloscCodec

            codec = BloscCodec(cname="zstd", clevel=7, shuffle="shuffle")
            extra = {"dimension_names": dims}
        chunks = (min(samples_chunk, values.shape[0]), *values.shape[1:])
        # no fill value, as bio2zarr writes its arrays: xarray would read one as a CF _FillValue (a
        # Zarr v2 default of 0 would make cohort 0 NaN for readers that mask, as sgkit's does)
        arr = group.create_array(name, shape=values.shape, dtype=values.dtype, chunks=chunks, compressors=[codec],
                                 fill_value=None, **extra)
        arr[...] = values
        arr.attrs["description"] = description
        arr.attrs.update((attrs or {}).get(name, {}))
        if v2:
            arr.attrs["_ARRAY_DIMENSIONS"] = list(dims)


def _consolidate(root: Path) -> None:
    """Consolidated metadata: readers open the store from one file, without listing it (where
    zarr would warn of the manifest pipeline keeps beside the arrays)."""
    import warnings

    import zarr

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        zarr.consolidate_metadata(str(root))


# --- the demo --------------------------------------------------------------------------------------


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be a positive whole number, got {value!r}")
    return int(value)


def write_genomics_demo(
    path: str | os.PathLike,
    *,
    samples: int = 1_000,
    variants: int = 10_000,
    seed: int = 0,
    variant_chunk: int = VARIANT_CHUNK,
    sample_chunk: int = SAMPLE_CHUNK,
    zarr_format: int = 2,
    missing: float = 0.01,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Simulate ``samples`` diploids at exactly ``variants`` sites and write them as a VCF Zarr
    store at ``path``, all or nothing (the module docstring says how); return the path.

    ``variant_chunk`` x ``sample_chunk``: the stored chunks (bio2zarr's 1,000 x 10,000 by default;
    fewer where the store is smaller). ``zarr_format``: 2 (bio2zarr's default) or 3.
    ``missing``: the fraction of calls missing whole. ``overwrite`` replaces only a demo store
    pipeline wrote. The same arguments always give the same values.
    """
    samples, variants = _positive("samples", samples), _positive("variants", variants)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a whole number of 0 or more, got {seed!r}")
    variant_chunk, sample_chunk = _positive("variant_chunk", variant_chunk), _positive("sample_chunk", sample_chunk)
    if zarr_format not in (2, 3):
        raise InputError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    if not 0 <= missing * (1 + HALF_MISSING) <= 1:
        raise InputError(f"missing must be a fraction of calls between 0 and {1 / (1 + HALF_MISSING):.3f}, got {missing!r}")
    _require("msprime", "bio2zarr.tskit")
    import bio2zarr.tskit

    if progress:
        import sys

        print(f"writing the genomics demo, {samples} samples x {variants} variants (msprime, bio2zarr), to {path}", file=sys.stderr)
    params = dict(samples=samples, variants=variants, seed=seed, missing=missing)
    with staged(path, mode="overwrite" if overwrite else "fail", kind="demo", demo=dict(params, kind="genomics")) as partial:
        ts = simulate(samples, variants, seed)
        mapping = _vcf_model(ts)
        bio2zarr.tskit.convert(
            ts, partial, model_mapping=mapping, variants_chunk_size=min(variant_chunk, variants),
            samples_chunk_size=min(sample_chunk, samples), zarr_format=zarr_format, show_progress=progress,
        )
        _set_missing(partial, seed, missing, threads=os.cpu_count() or 1)
        _write_arrays(partial, _sample_arrays(partial, ts, mapping, seed), min(sample_chunk, samples))
        _consolidate(partial)
    return Path(path)


def import_vcf(
    vcf: str | os.PathLike,
    path: str | os.PathLike,
    *,
    variant_chunk: int | None = None,
    sample_chunk: int | None = None,
    zarr_format: int = 2,
    workers: int = 0,
    overwrite: bool = False,
    progress: bool = False,
    samples_table: str | os.PathLike | None = None,
) -> Path:
    """Convert a VCF (or BCF) file to a VCF Zarr store at ``path`` with bio2zarr's ``explode``
    and ``encode`` (``vcf2zarr``), all or nothing; return the path.

    ``vcf`` is plain or bgzipped; a file of several contigs must be bgzipped and indexed (``.tbi``
    or ``.csi`` beside it), as bio2zarr requires. Chunks default to bio2zarr's (1,000 variants x
    10,000 samples); ``workers`` processes encode in parallel (0: this one). The intermediate
    (columnar) copy is written beside the output, in a hidden directory removed at the end.
    ``samples_table``: a sample table (:mod:`pipeline.sources.samples`) whose variables
    (``sample_cohort``, traits, covariates) are written into the store with the rest.
    A missing, unreadable or invalid file raises InputError naming it.
    """
    vcf = Path(vcf)
    if not vcf.exists():
        raise InputError(f"{vcf}: no such file")
    if not vcf.is_file():
        raise InputError(f"{vcf}: not a file (expected a VCF or BCF file, plain or bgzipped)")
    for name, value in (("variant_chunk", variant_chunk), ("sample_chunk", sample_chunk)):
        if value is not None:
            _positive(name, value)
    if zarr_format not in (2, 3):
        raise InputError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise InputError(f"workers must be 0 (this process) or a number of processes, got {workers!r}")
    table = None
    if samples_table is not None:  # checked on its own before the (long) conversion
        from .sources.samples import read_table

        table = read_table(samples_table)
    _require("bio2zarr.vcf", "cyvcf2")
    import bio2zarr.vcf

    final = Path(path)
    # the intermediate copy goes to the sink's scratch folder, which a later run removes if this one is killed
    with staged(final, mode="overwrite" if overwrite else "fail", kind="vcf-import", scratch=True,
                source=str(vcf.resolve())) as (partial, scratch):
        icf = scratch / "icf"
        try:
            bio2zarr.vcf.explode(icf, [vcf], worker_processes=workers, show_progress=progress)
            bio2zarr.vcf.encode(
                icf, partial, variants_chunk_size=variant_chunk, samples_chunk_size=sample_chunk,
                zarr_format=zarr_format, worker_processes=workers, show_progress=progress,
            )
        except (ValueError, OSError, KeyError, IndexError) as e:
            raise InputError(f"{vcf}: could not be converted to VCF Zarr ({type(e).__name__}: {e})") from e
        if table is not None:
            _write_table(partial, table)
        _consolidate(partial)
    return final


__all__ = ["import_vcf", "simulate", "write_genomics_demo"]
