"""pipeline's genomics ops against sgkit on the same VCF Zarr store, in the same run.

The same analysis code runs twice, once with ``sg = sgkit`` and once with ``sg =
pipeline.genomics`` (the names and parameters are sgkit's), each in a fresh process per group:

- ``counting``: ``variant_stats`` + ``sample_stats`` + ``hardy_weinberg_test``;
- ``popgen``: ``window_by_variant`` (1,000 variants), then ``diversity`` + ``Fst`` by cohort;
- ``gwas``: ``gwas_linear_regression`` of ``sample_trait`` on the alternate-allele dosage with
  ``sample_covariate``;
- ``pca``: ``pca`` (10 components; ``--pca-algorithm`` tsqr or randomized) of the alternate-allele
  counts;
- ``distance``: ``pairwise_distance`` (euclidean) between the first ``--distance-samples``
  samples over the first ``--distance-variants`` variants.

The functions pipeline added for sgkit 0.10's API, in groups chosen with ``--groups`` (the default
is the five above):

- ``frequencies``: ``call_allele_frequencies``, ``cohort_allele_frequencies``,
  ``individual_heterozygosity``, ``observed_heterozygosity``, ``infer_call_ploidy``,
  ``infer_variant_ploidy``, ``filter_partial_calls``, ``convert_call_to_index``;
- ``haplotypes``: ``window_by_variant`` (1,000 variants), then ``Garud_H`` and ``pbs`` of the
  cohorts (0, 1, 2);
- ``relatedness``: ``identity_by_state``, ``Weir_Goudet_beta``, ``genomic_relationship`` (VanRaden,
  of the dosage, ancestral frequencies one half) and its ``invert_relationship_matrix``, and
  ``pc_relate`` (on the samples' 4 PCs from ``pca``);
- ``regenie``: ``regenie`` of ``sample_trait`` on the dosage with ``sample_covariate``, the variants
  split into two contigs, then ``regenie_loco_regression`` with its LOCO predictions;
- ``pedigree``: ``pedigree_kinship``, ``pedigree_inbreeding``, ``pedigree_inverse_kinship`` and
  ``pedigree_contribution`` of a random pedigree of the samples (the first tenth founders, each
  other sample's two parents drawn among the samples before it, the same for both tools), then
  ``hybrid_relationship`` and ``hybrid_inverse_relationship`` (Martini) of the pedigree's and the
  dosage's VanRaden relationships, every sample genotyped. The pedigree functions run on the host
  in both tools;
- ``conversion``: ``convert_probability_to_call`` of genotype probabilities made from the calls
  (0.55 to 0.955 for the called genotype, by position and dosage), ``infer_sample_ploidy``, and
  ``window_by_interval`` (an interval every 50 variants, 5 to 24 variants long), then ``diversity``
  of those windows;
- ``genee``: ``genee`` of the variants' ``gwas_linear_regression`` betas (as in ``gwas``) and their
  LD (the dosages' correlations), the genes ``conversion``'s intervals, by ``window_by_interval``;
- ``genedrop``: ``parent_indices`` of ``pedigree``'s random pedigree as sample identifiers,
  ``pedigree_sel`` (5 samples, 2 generations up, 1 down), ``simulate_genedrop`` (seed 0: both draw
  a variant's seed from it alike) of the store's calls, and ``display_pedigree`` where the
  graphviz library is installed;
- ``datasets``: ``create_genotype_call_dataset`` and ``create_genotype_dosage_dataset`` (of
  ``conversion``'s probabilities) of the store's arrays, the first written by ``save_dataset`` (to a
  new folder: the write is timed) and read again by ``load_dataset``, ``display_genotypes`` of it,
  and ``simulate_genotype_call_dataset`` (seed 0) of the store's sizes.

``relatedness``, ``regenie``, ``pedigree`` and ``genee`` work on the first ``--distance-samples``
samples and, of the variants polymorphic among those, the first ``--distance-variants``: sgkit's
matrices and ridge regressions take minutes beyond a few thousand.

Every group works on the store's biallelic variants (the HWE test and PCA need them); for ``pca``
and ``gwas`` missing calls count as the reference allele and monomorphic variants are left out,
as sgkit's PCA requires. That selection is made once, before any timing, the same for both. A
process times its import and opening, the first run of its group and a second (warm) run; the
parent times the whole process and checks that pipeline's results equal sgkit's (or, without
sgkit, the first tool's): value by value, NaN in the same places, for results of up to
``COMPARED`` values, otherwise by digests (sums, largest magnitudes, NaN counts). The difference
printed is the largest relative to the reference's largest magnitude, and names its result. A text
(a display's: ``display_genotypes``' ``repr``, ``display_pedigree``'s DOT source) or an array of
strings is compared as the bytes of its lines, ``genee``'s data frame column by column.

A tool named ``pipeline-gpu@4GB`` runs under that device budget (``pipeline.gpu.memory-limit``;
``pipeline-cpu@4GB``: ``pipeline.cpu.memory-limit``), to show an out-of-core run; pipeline's
processes report the most device memory CuPy's pool held and the host's peak resident set.
``--sgkit-runs 1`` times sgkit's first run only, where its runs on a large store take minutes.
``--processes 2`` runs each tool's process twice, one after the other: the second (``TOOL#2``)
finds in the disk caches the kernels the first compiled (Numba's, sgkit's included, and CuPy's),
as every process after a machine's first does, and is compared with sgkit's second.

sgkit 0.10 pins zarr<3; its code runs on current numpy/dask/xarray when installed without its
pins (``pip install --no-deps --target DIR sgkit==0.10.0 scikit-learn``; ``--sgkit DIR``), and
reads the store through xarray (zarr 3 reads Zarr v2 stores). On current xarray, though, sgkit's
``pc_relate`` is NaN everywhere (its arithmetic of xarray with Dask masked arrays loses the mask):
for ``relatedness``, ``--sgkit-python`` runs sgkit's processes with another interpreter, one with
sgkit's pinned dependencies (xarray 2025.3, zarr 2, which read the demo's Zarr v2 store).

    python benchmarks/genomics_sgkit.py STORE --sgkit DIR --json genomics.json

The added functions, pipeline on the GPU against sgkit's first run, store built in the same line
(about 130 s on 16 cores and one H200: the store about 10 s; sgkit's first runs, half of them
Numba compiling, about 70 s; pipeline's processes about 50 s):

    python -m pipeline demo --kind genomics data/added.vcz --samples 10000 --variants 20000 --no-progress && python benchmarks/genomics_sgkit.py data/added.vcz --sgkit-python SGKIT_VENV/bin/python --tools pipeline-gpu,sgkit --sgkit-runs 1 --groups frequencies,haplotypes,relatedness,regenie --distance-samples 1000 --distance-variants 4000 --json added.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

T_START = time.perf_counter()
GROUPS = ("counting", "popgen", "gwas", "pca", "distance")
# sgkit 0.10's functions added to pipeline.genomics: chosen with --groups, not run by default
ADDED = ("frequencies", "haplotypes", "relatedness", "regenie", "pedigree", "conversion", "genee", "genedrop",
         "datasets")
# the groups on the first --distance-samples samples and --distance-variants variants
SUBSET = ("relatedness", "regenie", "pedigree", "genee")
DOSAGE = ("gwas", "pca", "distance") + SUBSET
# results of up to this many values are compared value by value; larger ones by their digests
COMPARED = 1 << 25


def _select(ds, sg_name: str):
    """The biallelic variants, and the dosage (missing as reference) with its polymorphic
    variants: the same selection for both tools."""
    import numpy as np

    alleles = np.asarray(ds["variant_allele"].values)
    n_alleles = np.array([[bool(a) for a in row] for row in alleles]).sum(axis=1)
    ds = ds.isel(variants=np.flatnonzero(n_alleles == 2), alleles=slice(0, 2))
    return ds


def _dosage(ds, compute):
    import numpy as np

    # int8 throughout (a sum over the ploidy in NumPy's default int64 would be 8 bytes a call)
    ac = ds["call_genotype"].clip(0).sum("ploidy", dtype="int8")
    total = ac.sum("samples", dtype="int32").data
    (total,) = compute(total)
    total = np.asarray(total.get() if hasattr(total, "get") else total)
    keep = np.flatnonzero((total > 0) & (total < 2 * ds.sizes["samples"]))
    # the variants kept first, then the float64 dosage (8 bytes a call) from the kept counts
    ds = ds.assign(call_alternate_allele_count=ac).isel(variants=keep)
    return ds.assign(call_dosage=ds["call_alternate_allele_count"].astype("float64"))


def _subset(ds, distance_shape, compute):
    """The first samples, then the dosage with the variants polymorphic among them (PCA needs
    them), then the first variants of those."""
    nv, ns = distance_shape
    ds = _dosage(ds.isel(samples=slice(0, ns)), compute)
    return ds.isel(variants=slice(0, nv))


def _pedigree(ds):
    """``ds`` with a random pedigree ``parent`` (samples, parents): the first tenth of the samples
    founders (-1), every later sample's two parents distinct samples before it."""
    import numpy as np

    n = ds.sizes["samples"]
    rng = np.random.default_rng(0)
    parent = np.full((n, 2), -1, np.int64)
    i = np.arange(n // 10, n) if n >= 20 else np.arange(2, n)
    a = (rng.random(i.size) * i).astype(np.int64)
    b = (rng.random(i.size) * (i - 1)).astype(np.int64)
    parent[i] = np.stack([a, b + (b >= a)], axis=1)
    return ds.assign(parent=(("samples", "parents"), parent))


def _ancestral(ds):
    """The ancestral allele frequencies of the VanRaden relationships: one half at every variant
    (Forni et al. 2011's G05). Centred on the samples' own frequencies the matrix has rank one
    below the samples' number, and its inverse is rounding noise that LAPACK and cuSOLVER make
    differently."""
    import numpy as np
    import xarray as xr

    return xr.DataArray(np.full(ds.sizes["variants"], 0.5), dims="variants")


def _probabilities(ds):
    """Genotype probabilities of the calls (variants, samples, genotypes), the same for both tools:
    0.55 to 0.955 for the called genotype (by the variant's position and the call's dosage), the
    other two sharing the rest; NaN where an allele is missing."""
    import xarray as xr

    ac = ds.call_genotype.clip(0).sum("ploidy")
    p = 0.55 + 0.045 * ((ds.variant_position + 7 * ac) % 10)
    gp = xr.concat([xr.where(ac == k, p, (1 - p) / 2) for k in range(3)], dim="genotypes")
    return gp.transpose("variants", "samples", "genotypes").where((ds.call_genotype >= 0).all("ploidy"))


def _intervals(ds) -> dict:
    """Intervals of positions (``interval_contig_name``, ``interval_start``, ``interval_stop``),
    the same for both tools: one every 50 variants, from its position to that of the variant 5 to
    24 after it (exclusive), or one position where that is on another contig."""
    import numpy as np

    pos, contig = np.asarray(ds.variant_position.values), np.asarray(ds.variant_contig.values)
    names = _strings(ds.contig_id.values)
    start = np.arange(0, pos.size, 50)
    stop = np.minimum(start + 5 + np.arange(start.size) % 20, pos.size - 1)
    same = contig[stop] == contig[start]
    return {"interval_contig_name": ("intervals", names[contig[start]]), "interval_start": ("intervals", pos[start]),
            "interval_stop": ("intervals", np.where(same, pos[stop], pos[start] + 1))}


def _strings(x):
    """An array of strings or bytes (of NumPy's StringDType too, which sgkit's variable specs
    refuse) as an array of Python strings, as sgkit reads them."""
    import numpy as np

    x = np.asarray(x)
    return np.array([v.decode() if isinstance(v, bytes) else str(v) for v in x.ravel()], dtype=object).reshape(x.shape)


def _numbers(x):
    """A result as the float64 values compared: a text (a display's) or an array of strings as the
    UTF-8 bytes of its lines."""
    import numpy as np

    x = np.asarray(x)
    if x.dtype.kind in "OSUT":
        x = np.frombuffer("\n".join(_strings(x).ravel()).encode(), np.uint8)
    return x.astype(np.float64)


def _scratch() -> str:
    """A new folder, removed when the process exits."""
    import atexit
    import shutil

    path = tempfile.mkdtemp(prefix="genomics_sgkit.")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _analysis(group: str, sg, ds, distance_shape, pca_algorithm: str = "tsqr"):
    import numpy as np

    if group == "counting":
        v = sg.variant_stats(ds, merge=False)
        s = sg.sample_stats(ds, merge=False)
        h = sg.hardy_weinberg_test(ds, merge=False)
        return {"variant_call_rate": v.variant_call_rate, "variant_allele_frequency": v.variant_allele_frequency,
                "variant_n_het": v.variant_n_het, "sample_call_rate": s.sample_call_rate, "sample_n_het": s.sample_n_het,
                "variant_hwe_p_value": h.variant_hwe_p_value}
    if group == "popgen":
        w = sg.window_by_variant(ds, size=1000)
        return {"stat_diversity": sg.diversity(w, merge=False).stat_diversity, "stat_Fst": sg.Fst(w, merge=False).stat_Fst}
    if group == "gwas":
        r = sg.gwas_linear_regression(ds, dosage="call_dosage", covariates=["sample_covariate"], traits=["sample_trait"], merge=False)
        return {"variant_linreg_beta": r.variant_linreg_beta, "variant_linreg_p_value": r.variant_linreg_p_value}
    if group == "pca":
        d = ds.assign(call_alternate_allele_count=ds.call_alternate_allele_count.chunk({"samples": -1}))
        r = sg.pca(d, n_components=10, algorithm=pca_algorithm, merge=False)
        return {"sample_pca_explained_variance": r.sample_pca_explained_variance}
    if group == "distance":
        nv, ns = distance_shape
        x = ds.call_dosage[:nv, :ns].T.chunk({"variants": 1000})
        return {"distance": sg.pairwise_distance(x.data, metric="euclidean")}
    if group == "frequencies":
        cp = sg.infer_call_ploidy(ds)
        fp = sg.filter_partial_calls(ds, merge=False)
        return {"call_allele_frequency": sg.call_allele_frequencies(ds, merge=False).call_allele_frequency,
                "cohort_allele_frequency": sg.cohort_allele_frequencies(ds, merge=False).cohort_allele_frequency,
                "call_heterozygosity": sg.individual_heterozygosity(ds, merge=False).call_heterozygosity,
                "stat_observed_heterozygosity": sg.observed_heterozygosity(ds, merge=False).stat_observed_heterozygosity,
                "call_ploidy": cp.call_ploidy, "variant_ploidy": sg.infer_variant_ploidy(cp, merge=False).variant_ploidy,
                "call_genotype_complete": fp.call_genotype_complete,
                "call_genotype_complete_mask": fp.call_genotype_complete_mask,
                "call_genotype_index": sg.convert_call_to_index(ds, merge=False).call_genotype_index}
    if group == "haplotypes":
        w = sg.window_by_variant(ds, size=1000)
        h = sg.Garud_H(w, merge=False)
        return {k: h[k] for k in ("stat_Garud_h1", "stat_Garud_h12", "stat_Garud_h123", "stat_Garud_h2_h1")} | {
            "stat_pbs": sg.pbs(w, cohorts=[(0, 1, 2)], merge=False).stat_pbs}
    if group == "relatedness":
        ibs = sg.identity_by_state(ds)
        d = ds.assign(variant_ancestral_frequency=_ancestral(ds))
        grm = sg.genomic_relationship(d, call_dosage="call_dosage", estimator="VanRaden",
                                      ancestral_frequency="variant_ancestral_frequency", ploidy=2)
        inverse = sg.invert_relationship_matrix(grm, relationship="stat_genomic_relationship", merge=False)
        # pc_relate on the samples' PCs, as sgkit's documentation shows
        d = ds.assign(call_alternate_allele_count=ds.call_alternate_allele_count.chunk({"samples": -1}))
        pcs = sg.pca(d, n_components=4, algorithm=pca_algorithm, merge=False).sample_pca_projection
        phi = sg.pc_relate(ds.assign(sample_pca_projection=pcs), merge=False).pc_relate_phi
        return {"stat_identity_by_state": ibs.stat_identity_by_state,
                "stat_Weir_Goudet_beta": sg.Weir_Goudet_beta(ibs, merge=False).stat_Weir_Goudet_beta,
                "stat_genomic_relationship": grm.stat_genomic_relationship,
                "stat_inverse_relationship": inverse.stat_inverse_relationship, "pc_relate_phi": phi}
    if group == "pedigree":
        import xarray as xr

        d = _pedigree(ds)
        kinship = sg.pedigree_kinship(d, return_relationship=True, merge=False)
        inverse = sg.pedigree_inverse_kinship(d, return_relationship=True, merge=False)
        # the hybrid matrices of the dosage's VanRaden relationship (every sample genotyped) and the pedigree's
        d = d.assign(variant_ancestral_frequency=_ancestral(d))
        grm = sg.genomic_relationship(d, call_dosage="call_dosage", estimator="VanRaden",
                                      ancestral_frequency="variant_ancestral_frequency", ploidy=2, merge=False)
        ginv = sg.invert_relationship_matrix(grm, relationship="stat_genomic_relationship", merge=False)
        both = xr.merge([grm, ginv, kinship, inverse])
        hybrid = sg.hybrid_relationship(both, genomic_relationship="stat_genomic_relationship",
                                        pedigree_relationship="stat_pedigree_relationship", estimator="Martini",
                                        merge=False).stat_hybrid_relationship
        hybrid_inverse = sg.hybrid_inverse_relationship(
            both, genomic_inverse_relationship="stat_inverse_relationship",
            pedigree_inverse_relationship="stat_pedigree_inverse_relationship", estimator="Martini",
            merge=False).stat_hybrid_inverse_relationship
        return {"stat_pedigree_kinship": kinship.stat_pedigree_kinship,
                "stat_pedigree_inbreeding": sg.pedigree_inbreeding(d, merge=False).stat_pedigree_inbreeding,
                "stat_pedigree_inverse_kinship": inverse.stat_pedigree_inverse_kinship,
                "stat_pedigree_contribution": sg.pedigree_contribution(d, merge=False).stat_pedigree_contribution,
                "stat_hybrid_relationship": hybrid, "stat_hybrid_inverse_relationship": hybrid_inverse}
    if group == "regenie":
        # two contigs, the variants' halves: the LOCO predictions need more than one
        n = ds.sizes["variants"]
        d = ds.drop_dims("contigs").assign(variant_contig=("variants", (2 * np.arange(n) // n).astype(ds.variant_contig.dtype)))
        r = sg.regenie(d, dosage="call_dosage", covariates="sample_covariate", traits="sample_trait", merge=False)
        loco = sg.regenie_loco_regression(d.assign(regenie_loco_prediction=r.regenie_loco_prediction), dosage="call_dosage",
                                          covariates="sample_covariate", traits="sample_trait", merge=False)
        return {"regenie_base_prediction": r.regenie_base_prediction,
                "regenie_meta_prediction": r.regenie_meta_prediction,
                "regenie_loco_prediction": r.regenie_loco_prediction,
                "variant_linreg_beta": loco.variant_linreg_beta, "variant_linreg_p_value": loco.variant_linreg_p_value}
    if group == "conversion":
        calls = sg.convert_probability_to_call(ds.assign(call_genotype_probability=_probabilities(ds)), merge=False)
        w = sg.window_by_interval(ds.assign(_intervals(ds)))
        return {"call_genotype": calls.call_genotype, "call_genotype_mask": calls.call_genotype_mask,
                "sample_ploidy": sg.infer_sample_ploidy(ds, merge=False).sample_ploidy,
                "window_start": w.window_start, "window_stop": w.window_stop,
                "stat_diversity": sg.diversity(w, merge=False).stat_diversity}
    if group == "genee":
        import xarray as xr

        # as sgkit's tests: the variants' GWAS betas, their LD (correlations), genes as windows
        beta = sg.gwas_linear_regression(ds, dosage="call_dosage", covariates=["sample_covariate"],
                                         traits=["sample_trait"], merge=False).variant_linreg_beta[:, 0]
        x = ds.call_dosage
        z = (x - x.mean("samples")) / x.std("samples")
        ld = xr.dot(z, z.rename(variants="variants_1"), dim="samples") / ds.sizes["samples"]
        w = sg.window_by_interval(ds.assign(_intervals(ds)), merge=False).assign(beta=beta)
        df = sg.genee(w, ld.data)
        return {"window_start": w.window_start} | {c: df[c] for c in ("test_q", "q_var", "pval")}
    if group == "genedrop":
        import importlib.util

        # the random pedigree as sample identifiers (in memory, as sgkit's pedigree_sel wants them),
        # found again by parent_indices
        ids = _strings(ds.sample_id.values)
        parent = _pedigree(ds).parent
        d = ds.assign(sample_id=("samples", ids),
                      parent_id=parent.copy(data=np.where(parent.values >= 0, ids[parent.values], ".")))
        d = sg.parent_indices(d.assign_coords(samples=ids))
        n = ds.sizes["samples"]
        sel = sg.pedigree_sel(d, samples=ids[n // 2: n // 2 + 5], ancestor_depth=2, descendant_depth=1)
        # sgkit's gene drop wants the samples in one chunk
        drop = sg.simulate_genedrop(d.assign(call_genotype=d.call_genotype.chunk({"samples": -1})), seed=0, merge=False)
        out = {"parent": d.parent, "pedigree_sel_parent": sg.parent_indices(sel, merge=False).parent,
               "call_genotype": drop.call_genotype}
        # a graphviz.Digraph: its DOT text, where the graphviz library is installed
        if importlib.util.find_spec("graphviz"):
            out["display_pedigree"] = sg.display_pedigree(d).source
        return out
    if group == "datasets":
        # the store's arrays as a dataset of calls and one of dosages (from _probabilities), the
        # first saved and read again, and a simulated dataset of the store's sizes
        names = _strings(ds.contig_id.values).tolist()
        arrays = {"variant_contig_names": names, "variant_contig": ds.variant_contig.data,
                  "variant_position": ds.variant_position.data, "variant_allele": _strings(ds.variant_allele.values),
                  "sample_id": _strings(ds.sample_id.values)}
        calls = sg.create_genotype_call_dataset(**arrays, call_genotype=ds.call_genotype.data,
                                                call_genotype_phased=ds.call_genotype_phased.data)
        gp = _probabilities(ds)
        dosage = sg.create_genotype_dosage_dataset(**arrays, call_dosage=(gp[..., 1] + 2 * gp[..., 2]).data,
                                                   call_genotype_probability=gp.data)
        path = os.path.join(_scratch(), "calls.zarr")
        sg.save_dataset(calls, path, auto_rechunk=True)
        saved = sg.load_dataset(path)
        sim = sg.simulate_genotype_call_dataset(n_variant=ds.sizes["variants"], n_sample=ds.sizes["samples"],
                                                n_contig=len(names), seed=0, missing_pct=0.05, phased=False)
        return {"call_genotype_mask": calls.call_genotype_mask, "call_dosage_mask": dosage.call_dosage_mask,
                "call_genotype_probability_mask": dosage.call_genotype_probability_mask,
                "saved_call_genotype": saved.call_genotype, "saved_call_genotype_phased": saved.call_genotype_phased,
                "saved_variant_position": saved.variant_position, "saved_sample_id": saved.sample_id,
                "saved_variant_allele": saved.variant_allele,
                "simulated_call_genotype": sim.call_genotype, "simulated_variant_position": sim.variant_position,
                "simulated_variant_contig": sim.variant_contig, "simulated_variant_allele": sim.variant_allele,
                "display_genotypes": repr(sg.display_genotypes(calls))}
    raise ValueError(group)


def one(tool: str, group: str, store: str, distance_shape, pca_algorithm: str = "tsqr", runs: int = 2,
        values_dir: str | None = None) -> dict:
    """Run ``group`` with ``tool`` in this process: seconds of import + open, first run, warm run
    (None where ``runs`` is 1). The results of up to ``COMPARED`` values go to
    ``values_dir/TOOL.GROUP.npz``, for the parent to compare value by value."""
    import numpy as np

    base = tool.split("@")[0]
    if base == "sgkit":
        import dask
        import sgkit as sg
        import xarray as xr

        ds = xr.open_zarr(store, concat_characters=False, mask_and_scale=False)
        compute = dask.compute
        to_numpy = np.asarray
    else:
        import pipeline
        import pipeline.genomics as sg

        ds = pipeline.open_dataset(store, backend=base.removeprefix("pipeline-"))
        compute, to_numpy = (lambda *xs: pipeline.compute(list(xs))), pipeline.to_numpy
    t_ready = time.perf_counter()
    ds = _select(ds, tool)
    if group in SUBSET:
        ds = _subset(ds, distance_shape, compute)
    elif group in DOSAGE:
        ds = _dosage(ds, compute)
    t_selected = time.perf_counter()
    times, values = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = _analysis(group, sg, ds, distance_shape, pca_algorithm)
        keys = list(out)
        results = compute(*[v.data if hasattr(v, "dims") else v for v in out.values()])
        times.append(time.perf_counter() - t)
        if len(times) == 1 and base != "sgkit":
            from pipeline.kernels.launch import compile_seconds

            compile_first = compile_seconds()  # compiling (or loading) kernels, in the first run
        values = {k: _numbers(to_numpy(r)) for k, r in zip(keys, results)}
    if values_dir:
        np.savez(_values_path(values_dir, tool, group), **{k: v for k, v in values.items() if v.size <= COMPARED})
    memory = {}
    if base != "sgkit":
        from pipeline.exec.memory import usage

        memory = usage(base.removeprefix("pipeline-")) | {"compile_first_seconds": compile_first}
    return {"tool": tool, "group": group, "import_open_seconds": t_ready - T_START,
            "select_seconds": t_selected - t_ready, "first_seconds": times[0],
            "warm_seconds": times[1] if len(times) > 1 else None, "memory": memory,
            "values": {k: v.tolist() if v.size <= 64 else None for k, v in values.items()},
            "digest": {k: [float(np.nansum(v)), float(np.nanmax(np.abs(v))) if np.isfinite(v).any() else 0.0,
                           int(np.isnan(v).sum()), list(v.shape)] for k, v in values.items()}}


def _values_path(values_dir: str, tool: str, group: str) -> str:
    return os.path.join(values_dir, f"{tool}.{group}.npz")


def _agree(a: dict, b: dict, values_dir: str | None = None) -> str:
    """Worst difference relative to the largest magnitude of the reference, value by value where
    both saved the values (NaN in the same places), otherwise of the digests (sums, largest
    magnitudes, NaN counts)."""
    import numpy as np

    only = sorted(set(a["digest"]) ^ set(b["digest"]))  # display_pedigree where one has no graphviz
    if only:
        return f"{only[0]}: in one tool's results only"
    saved = [np.load(_values_path(values_dir, r["tool"], r["group"])) if values_dir else {} for r in (a, b)]
    worst, worst_key = 0.0, ""
    for k, (s1, m1, n1, sh1) in a["digest"].items():
        s2, m2, n2, sh2 = b["digest"][k]
        if sh1 != sh2 or n1 != n2:
            return f"{k}: shapes {sh1}/{sh2} or NaNs {n1}/{n2} differ"
        scale = max(abs(m2), 1e-300)
        if k in saved[0] and k in saved[1]:
            x, y = saved[0][k], saved[1][k]
            if not (np.isnan(x) == np.isnan(y)).all():
                return f"{k}: NaNs in other places"
            diff = float(np.nanmax(np.abs(x - y), initial=0.0)) / scale
        else:
            diff = max(abs(s1 - s2) / max(abs(s2), 1e-300), abs(m1 - m2) / scale)
        if diff > worst or not worst_key:
            worst, worst_key = diff, k
    return f"{worst:.1e} ({worst_key})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--sgkit", help="a folder holding sgkit (prepended to sgkit's PYTHONPATH)")
    p.add_argument("--groups", default=",".join(GROUPS))
    p.add_argument("--sgkit-python", default=sys.executable,
                   help="the Python that runs sgkit's processes (one with sgkit's pinned dependencies)")
    p.add_argument("--tools", default="pipeline-gpu,pipeline-cpu,sgkit")
    p.add_argument("--distance-variants", type=int, default=20_000)
    p.add_argument("--distance-samples", type=int, default=2_000)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--pca-algorithm", choices=("tsqr", "randomized"), default="tsqr")
    p.add_argument("--sgkit-runs", type=int, choices=(1, 2), default=2,
                   help="runs of sgkit in each process (1: its first only)")
    p.add_argument("--processes", type=int, default=1,
                   help="fresh processes per tool and group, one after the other: the second and later "
                        "find the kernels their first compiled in the disk caches (labelled TOOL#2, ...)")
    p.add_argument("--json")
    p.add_argument("--one", nargs=2, metavar=("TOOL", "GROUP"), help=argparse.SUPPRESS)
    p.add_argument("--values-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    shape = (a.distance_variants, a.distance_samples)
    if a.one:
        runs = a.sgkit_runs if a.one[0] == "sgkit" else 2
        r = one(a.one[0], a.one[1], a.store, shape, a.pca_algorithm, runs, a.values_dir)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    with tempfile.TemporaryDirectory() as values_dir:
        rows = _compare(a, shape, values_dir)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _compare(a, shape, values_dir: str) -> list:
    rows = []
    for group in a.groups.split(","):
        by_tool = {}
        for tool, k in ((t, k) for t in a.tools.split(",") for k in range(a.processes)):
            label = tool if k == 0 else f"{tool}#{k + 1}"
            env = dict(os.environ)
            if "@" in tool:  # a budget: pipeline-gpu@4GB
                side = "GPU" if tool.startswith("pipeline-gpu") else "CPU"
                env[f"DASK_PIPELINE__{side}__MEMORY_LIMIT"] = tool.split("@", 1)[1]
            if tool.startswith("pipeline-"):  # the default backend too: that of a store saved and read again
                env["DASK_PIPELINE__BACKEND"] = tool.split("@")[0].removeprefix("pipeline-")
            if tool == "sgkit" and a.sgkit:
                env["PYTHONPATH"] = os.pathsep.join([a.sgkit, env.get("PYTHONPATH", "")])
            cmd = [a.sgkit_python if tool == "sgkit" else sys.executable, __file__, a.store, "--one", tool, group, "--distance-variants", str(shape[0]),
                   "--distance-samples", str(shape[1]), "--pca-algorithm", a.pca_algorithm,
                   "--sgkit-runs", str(a.sgkit_runs), "--values-dir", values_dir]
            t = time.perf_counter()
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                print(f"{group:11s} {label:15s} timed out after {a.timeout:.0f} s", flush=True)
                continue
            wall = time.perf_counter() - t
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not line:
                print(f"{group:11s} {label:15s} failed: {proc.stderr.strip()[-1500:]}", flush=True)
                continue
            r = json.loads(line[-1][7:]) | {"process_seconds": wall, "label": label}
            by_tool[label] = r
            rows.append(r)
            warm = "-" if r["warm_seconds"] is None else f"{r['warm_seconds']:7.3f}"
            held = ""
            if "compile_first_seconds" in r["memory"]:
                held = f", compiling in the first run {r['memory']['compile_first_seconds']:.2f} s"
            if r["memory"].get("gpu_pool_peak_bytes"):
                held += f", device pool peak {r['memory']['gpu_pool_peak_bytes'] / 1e9:.2f} GB"
            if r["memory"].get("host_peak_rss_bytes"):
                held += f", host peak RSS {r['memory']['host_peak_rss_bytes'] / 1e9:.2f} GB"
            print(f"{group:11s} {label:15s} process {wall:7.2f} s  first {r['first_seconds']:7.3f} s  warm {warm} s"
                  f"  (import+open {r['import_open_seconds']:.2f} s, selection {r['select_seconds']:.2f} s{held})", flush=True)
        for label, r in by_tool.items():
            # each process against the reference's process of the same rank (its first where it ran once)
            rank = label[label.index("#"):] if "#" in label else ""
            ref_tool = "sgkit" if any(t.startswith("sgkit") for t in by_tool) else next(iter(by_tool)).split("#")[0]
            ref_name = ref_tool + rank if ref_tool + rank in by_tool else ref_tool
            ref = by_tool.get(ref_name)
            if ref is None or label.split("#")[0] == ref_tool:
                continue
            r["agrees_with"] = ref_name
            r["agrees_with_sgkit" if ref_tool == "sgkit" else "agrees_with_first"] = diff = _agree(r, ref, values_dir)
            # sgkit's warm run, or its only run where it ran once
            ref_warm = ref["warm_seconds"] or ref["first_seconds"]
            warm = f"{ref_warm / r['warm_seconds']:.1f}x" if r["warm_seconds"] else "-"
            print(f"{group:11s} {label:15s} vs {ref_name}: first {ref['first_seconds'] / r['first_seconds']:.1f}x, "
                  f"warm {warm}, process {ref['process_seconds'] / r['process_seconds']:.1f}x; "
                  f"results differ by {diff}", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
