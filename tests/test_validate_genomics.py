"""`pipeline validate` on flows of Dataset ops (the genomics ops): each step's variables checked
from the store's metadata by what each op declares it reads and adds (its ``@register``'s
``variables``, :mod:`pipeline.ops.genomics.variables`), and those declarations checked against
what the ops do and against sgkit's specs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline import ops as ops_registry
from pipeline.errors import FlowError, InputError
from pipeline.flows import check_data, parse_flow
from pipeline.ops.genomics import variables as gv

from .genomics_data import FIXTURES, dataset
from .test_cli import cli

REPO = Path(__file__).resolve().parent.parent
ALT = "call_alternate_allele_count"
HEAVY = ("dask.array", "numba", "cupy")


# --- the declarations against the ops -----------------------------------------------------------------


def _small():
    """The shared test data cut to 120 variants x 24 samples (chunks of 60 variants), fill values
    (-2) as missing calls (-1) for the genotype counts, and without the ``contigs`` attribute (so
    that contig_id is what names the contigs)."""
    ds = dataset("bi", {"variants": 60}).isel(variants=slice(0, 120), samples=slice(0, 24))
    ds = ds.assign(call_genotype=ds.call_genotype.where(ds.call_genotype >= -1, -1).astype("int8"))
    ds.attrs = {k: v for k, v in ds.attrs.items() if k != "contigs"}
    return ds


WINDOWS = [("window_by_variant", {"size": 20})]
DOSAGE = [("count_call_alternate_alleles", {}), ("impute_mean", {})]
GWAS = {"dosage": ALT, "covariates": ["sample_covariate"], "traits": ["sample_trait"]}

# (op, params, the ops run first to make its input)
CASES = [
    ("count_call_alleles", {}, []),
    ("count_variant_alleles", {}, []),
    ("count_variant_alleles", {"using": "call_genotype"}, []),
    ("count_variant_alleles", {}, [("count_call_alleles", {})]),
    ("count_variant_alleles", {"call_allele_count": "my_counts"}, []),
    ("variant_stats", {}, []),
    ("variant_stats", {"merge": False}, []),
    ("variant_stats", {}, [("count_variant_alleles", {"using": "call_genotype"})]),
    ("sample_stats", {}, []),
    ("count_variant_genotypes", {}, []),
    ("count_variant_genotypes", {"assign_coords": False}, []),
    ("count_variant_genotypes", {"merge": False}, []),
    ("hardy_weinberg_test", {}, []),
    ("hardy_weinberg_test", {"ploidy": 2, "alleles": 2}, []),
    ("filter_variants", {"max_alleles": 2}, []),
    ("filter_variants", {"min_call_rate": 0.5, "min_maf": 0.01}, []),
    ("filter_variants", {"min_hwe_p": 1e-12}, []),
    ("filter_variants", {"min_maf": 0.01}, [("variant_stats", {})]),
    ("filter_samples", {"min_call_rate": 0.5}, []),
    ("impute_mean", {}, [("count_call_alternate_alleles", {})]),
    ("window_by_variant", {"size": 20}, []),
    ("window_by_position", {"size": 5000}, []),
    ("window_by_position", {"size": 5000, "window_start_position": "variant_position"}, []),
    ("window_by_genome", {}, []),
    ("window_by_variant", {"size": 20, "merge": False}, []),
    ("count_call_alternate_alleles", {}, []),
    ("pca", {"n_components": 3}, []),
    ("pca", {"n_components": 3}, DOSAGE),
    ("pca", {"n_components": 3, "variable": "call_dosage"}, []),
    ("pca", {"n_components": 3, "merge": False}, []),
    ("sample_distance", {}, []),
    ("ld_matrix", {"dosage": ALT}, WINDOWS + DOSAGE),
    ("ld_prune", {"dosage": ALT}, WINDOWS + DOSAGE),
    ("count_cohort_alleles", {}, []),
    ("count_cohort_alleles", {}, [("count_call_alleles", {})]),
    ("diversity", {}, []),
    ("diversity", {}, WINDOWS),
    ("divergence", {}, WINDOWS),
    ("Fst", {}, []),
    ("Fst", {}, WINDOWS),
    ("Tajimas_D", {}, []),
    ("Tajimas_D", {}, WINDOWS + [("diversity", {})]),
    ("gwas_linear_regression", GWAS, DOSAGE),
    ("gwas_linear_regression", {**GWAS, "covariates": "sample_cohort"}, DOSAGE),
]


def _actual(op: str, params: dict, ds):
    """The op's result on ``ds`` (None for a table), or the error it raises."""
    try:
        out = ops_registry.get(op).func(ds, **params)
    except (InputError, KeyError) as e:
        return e
    except ValueError as e:  # sizes that do not align (stat_Fst's "windows" of variants beside window_stop's)
        if type(e).__name__ != "AlignmentError":
            raise
        return SIZES
    return None if not hasattr(out, "data_vars") else gv.State.of(out)


SIZES = "sizes"  # a result that sizes alone refuse, which validation leaves alone


def _declared(op: str, params: dict, ds):
    assert gv.DECLARED[op] is ops_registry.get(op).variables
    try:
        return gv.apply(op, ops_registry.get(op).params(**params).model_dump(), gv.State.of(ds))
    except gv.Problem as e:
        return e


def _variants(ds):
    """``ds`` and, for each of its variables, ``ds`` without it, with it transposed (2 or more
    dimensions), and with it of another kind of values (numbers): what an op that reads it refuses."""
    yield "as is", ds
    for name, v in ds.variables.items():
        yield f"without {name}", ds.drop_vars(name)
        if v.ndim >= 2:
            yield f"{name} transposed", ds.assign({name: v.transpose(*v.dims[::-1])})
        if v.dtype.kind in "iu":
            yield f"{name} as floats", ds.assign({name: v.astype("float32")})
        elif v.dtype.kind == "f":
            yield f"{name} as integers", ds.assign({name: v.astype("int64")})


def _describe(state):
    if state is None or isinstance(state, Exception):
        return state
    return {k: (v.dims, v.coord) for k, v in state.variables.items()}


@pytest.mark.parametrize("op, params, before", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_op_declares_what_it_reads_and_adds(op, params, before):
    """For each op, on a small dataset as it is and with each variable removed, transposed or of
    another type in turn: its declaration refuses exactly what the op refuses, and where both
    accept, it gives the op's result: the same variables, dimensions, coordinates and kinds of
    values."""
    base = _small()
    for name, p in before:
        base = ops_registry.get(name).func(base, **p)
    for what, ds in _variants(base):
        actual, declared = _actual(op, params, ds), _declared(op, params, ds)
        if actual is SIZES:
            continue
        assert isinstance(actual, Exception) == isinstance(declared, Exception), (
            f"{op}({params}) on the dataset {what}: the op gives {actual!r}, its declaration {declared!r}")
        if isinstance(actual, Exception) or actual is None or declared is None:
            assert (actual is None) == (declared is None), f"{op}: a table on one side only ({what})"
            continue
        assert _describe(actual) == _describe(declared), f"{op}({params}) on the dataset {what}"
        for k, v in declared.variables.items():
            assert actual.variables[k].kind in v.kind, f"{op}: {k} is {actual.variables[k].dtype}, declared {v.kind}"


def test_every_dataset_op_declares_its_variables():
    """Every Dataset op declares its variables (and no op of one variable does); the view by name
    holds the ops' declarations and the steps within them."""
    assert gv.undeclared(ops_registry.all_ops()) == []
    dataset_ops = {o.name for o in ops_registry.all_ops() if o.dataset}
    assert set(gv.DECLARED) == dataset_ops | {"genotype_coords"}
    assert all(o.variables is None for o in ops_registry.all_ops() if not o.dataset)
    with pytest.raises(ValueError, match="only a Dataset op declares variables"):
        ops_registry.register(kernels=(), variables=gv.Declared())(lambda x: x)


def _items(entry):
    for item in (*entry.needs, *entry.adds):
        if isinstance(item, (gv.Read, gv.Add)) and item.dims is not None:
            yield item


def _each(dims):
    """Each tuple of dimension names that ``dims`` stands for: ROWS, or a set of a spec's, for each
    of its names."""
    from itertools import product

    return set(product(*({gv.V, gv.W} if d == gv.ROWS else d - {None} if isinstance(d, set) else {d} for d in dims)))


def test_the_declarations_agree_with_sgkits_specs():
    """Where sgkit's specs describe a variable an op reads by its default name or adds, the
    declaration agrees: what it adds has dimensions and a kind the spec allows; what it reads may
    have every dimensions and kind the spec allows (and may take more)."""
    from pipeline.ops.genomics import specs

    registered = specs.SgkitVariables.registered_variables
    checked = 0
    for op, entry in gv.DECLARED.items():
        defaults = gv.defaults(op)
        for item in _items(entry):
            name = gv._resolve(item.name, defaults)
            spec = registered.get(name)
            if spec is None or spec.dims is None:
                continue
            kinds = set(spec.kind) if spec.kind is not None else None
            if isinstance(item, gv.Add):
                for dims in _each(item.dims):
                    assert len(specs.match_dims(dims, spec.dims)) == 1, f"{op}: adds {name} {dims}, sgkit's spec {spec.dims}"
                assert kinds is None or item.kind in kinds, f"{op}: adds {name} of kind {item.kind}, sgkit's {spec.kind}"
            else:
                options = [o for dims in ([item.dims] if isinstance(item.dims, tuple) else item.dims) for o in _each(dims)]
                for dims in _each(spec.dims):
                    assert any(gv._dims_match(dims, o) for o in options), f"{op}: reads {name} {item.dims}, sgkit's {dims}"
                assert kinds is None or kinds <= set(item.kind), f"{op}: reads {name} of kinds {item.kind}, sgkit's {spec.kind}"
            checked += 1
    assert checked > 40, checked


# --- flows -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A folder holding ``data/genomics.vcz``: a small store written by msprime and bio2zarr with
    their defaults (the shipped flows' source path, relative to it)."""
    pytest.importorskip("msprime")
    pytest.importorskip("bio2zarr")
    from pipeline.demo_genomics import write_genomics_demo

    root = tmp_path_factory.mktemp("validate")
    write_genomics_demo(root / "data" / "genomics.vcz", samples=30, variants=300, seed=1)
    return root


def _flow(name: str, root: Path, mutate=None, *, store: Path | None = None) -> dict:
    data = yaml.safe_load((REPO / "flows" / f"{name}.yaml").read_text())
    data["source"]["path"] = str(store or root / "data" / "genomics.vcz")
    data["source"].pop("demo")
    data["sink"]["path"] = str(root / "out" / f"{name}.zarr")
    if mutate is not None:
        mutate(data)
    return data


def _step(data: dict, op: str) -> dict:
    return next(s for s in data["steps"] if s["op"] == op)


def _unlisted(*names):
    """Leave ``names`` out of source.variables."""
    return lambda d: d["source"].__setitem__("variables", [v for v in d["source"]["variables"] if v not in names])


def test_the_shipped_flows_validate_against_a_store_importing_no_array_library(root):
    """Both shipped flows of Dataset ops check clean against a store written by bio2zarr, from its
    metadata: dask.array, Numba and CuPy are not imported."""
    flows = [str(REPO / "flows" / f"{n}.yaml") for n in ("genomics_qc", "gwas")]
    probe = ("import atexit, sys; atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules "
             f"if m == 'dask.array' or m.split('.')[0] in {HEAVY!r}), file=sys.stderr)); "
             f"sys.argv = ['pipeline', 'validate', *{flows!r}]; import runpy; runpy.run_module('pipeline', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("checked against data/genomics.vcz") == 2, r.stdout
    assert r.stderr.split("LOADED", 1)[1].strip() == "[]", r.stderr


def test_without_the_store_the_steps_are_checked_by_name(tmp_path):
    """A flow whose demo store is not written yet: validate writes nothing, and still checks the
    steps' variables against the names in source.variables."""
    flows = [REPO / "flows" / f"{n}.yaml" for n in ("genomics_qc", "gwas")]
    bad = yaml.safe_load(flows[1].read_text())
    _step(bad, "gwas_linear_regression")["params"]["covariates"] = ["sample_covariat"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    r = cli("validate", *flows, "bad.yaml", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stdout.count("data checks skipped; the steps' variables checked by name against source.variables") == 2
    assert "bad.yaml: steps[3].params.covariates: no variable 'sample_covariat'" in r.stderr
    assert not (tmp_path / "data").exists()


# each mistake: the flow, how it is changed, and what the message must say (the key first)
MISTAKES = {
    "covariate": ("gwas", lambda d: _step(d, "gwas_linear_regression")["params"].__setitem__("covariates", ["sample_covariat"]),
                  ["steps[3].params.covariates: no variable 'sample_covariat' in the dataset at this step",
                   "(source.variables and earlier steps give: sample_covariate, "]),
    "not_opened": ("gwas", _unlisted("sample_trait"),
                   ["steps[3].params.traits: no variable 'sample_trait'", "it is in the store: add it to source.variables"]),
    "pca_dosage": ("genomics_qc", lambda d: _step(d, "pca")["params"].__setitem__("variable", "call_dosage"),
                   ["steps[6].params.variable: no variable 'call_dosage'", "under its default name, 'call_alternate_allele_count'"]),
    "pca_genotypes": ("genomics_qc", lambda d: (_unlisted("call_genotype")(d), d.__setitem__("steps", [{"op": "pca"}])),
                      ["steps[0] (pca): no variable 'call_genotype'",
                       "needed by count_call_alternate_alleles to compute call_alternate_allele_count for pca",
                       "it is in the store: add it to source.variables"]),
    "sink": ("gwas", lambda d: d["sink"]["variables"].append("variant_linreg_betta"),
             ["sink.variables: no variable 'variant_linreg_betta' in the result of the steps",
              "(the source and steps give: variant_linreg_beta, "]),
    "sink_nothing_added": ("gwas", lambda d: (d.__setitem__("steps", [{"op": "filter_variants", "params": {"max_alleles": 2}}]),
                                              d["sink"].pop("variables")),
                           ["sink.variables: the steps add no variable"]),
    "not_windowed": ("genomics_qc", lambda d: d["steps"].remove(_step(d, "window_by_variant")),
                     ["steps[3] (ld_prune): no variable 'window_start'", "window_by_variant or window_by_position"]),
    "dims": ("gwas", lambda d: _step(d, "gwas_linear_regression")["params"].__setitem__("traits", "call_genotype"),
             ["steps[3].params.traits: variable 'call_genotype' has dimensions (variants, samples, ploidy), "
              "expected (samples,) or (samples, <any>)"]),
    "dtype": ("gwas", lambda d: (d["source"]["variables"].append("sample_id"),
                                 _step(d, "gwas_linear_regression")["params"].__setitem__("covariates", ["sample_id"])),
              ["steps[3].params.covariates: variable 'sample_id' has values of type", "expected signed integers or unsigned "
               "integers or floats or booleans"]),
    "no_alleles": ("gwas", lambda d: (_unlisted("variant_allele")(d), d["steps"][0]["params"].pop("max_alleles")),
                   ["steps[0] (filter_variants): the dataset has no 'alleles' dimension",
                    "variant_allele has it in the store: add it to source.variables"]),
    "no_contigs": ("genomics_qc", _unlisted("contig_id"),
                   ["steps[2] (window_by_variant): the dataset names no contigs", "contig_id is in the store: add it to source.variables"]),
    "merge_false": ("gwas", lambda d: d["steps"][1].__setitem__("params", {"merge": False}),
                    ["steps[3].params.covariates: no variable 'sample_covariate'",
                     "steps[1] (count_call_alternate_alleles) has merge: false"]),
    "table": ("genomics_qc", lambda d: d["steps"].__setitem__(4, {"op": "ld_matrix", "params": {"dosage": ALT}}),
              ["steps[4] (ld_matrix): returns a table", "not a Dataset"]),
}


def test_each_mistake_exits_2_naming_the_file_the_key_and_the_variable(root, tmp_path):
    """Each mistake in a flow of Dataset ops, alone in its file, is refused with exit status 2 and
    a message naming the file, the key and the variable; the command line reports every file."""
    from pipeline import cli as pipeline_cli

    files = {}
    for name, (flow, mutate, _) in MISTAKES.items():
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(_flow(flow, root, mutate)))
        with pytest.raises(FlowError) as e:
            check_data(parse_flow(_flow(flow, root, mutate), str(files[name])))
        for text in MISTAKES[name][2]:
            assert text in str(e.value), f"{name}: {e.value}"
        assert str(e.value).startswith(f"{files[name]}: "), e.value
        assert pipeline_cli.main(["validate", str(files[name])]) == 2, name
    r = cli("validate", *files.values(), cwd=root)
    assert r.returncode == 2, r.stderr
    for name, path in files.items():
        assert f"{path}: {MISTAKES[name][2][0]}" in r.stderr, f"{name}: {r.stderr}"


def test_a_store_written_by_sgkit_validates_and_builds(tmp_path):
    """sgkit's own store (``save_dataset``: variant_allele as |S1, the contigs as an attribute, no
    contig_id among the variables opened): a flow of QC, windows, LD pruning, PCA and the cohort
    statistics checks clean, and its graph builds; without sample_cohort in source.variables,
    diversity is refused naming it."""
    from pipeline.flows import build_flow

    store = tmp_path / "sgkit.zarr"
    shutil.copytree(FIXTURES / "sgkit_store.zarr", store)
    data = {
        "name": "sgkit_store",
        "source": {"path": str(store), "variables": ["call_genotype", "variant_allele", "variant_position",
                                                      "variant_contig", "sample_cohort"]},
        "steps": [
            {"op": "filter_variants", "params": {"min_call_rate": 0.8, "min_maf": 0.01}},
            {"op": "window_by_position", "params": {"size": 2000}},
            {"op": "count_call_alternate_alleles"},
            {"op": "ld_prune", "params": {"dosage": ALT}},
            {"op": "pca", "params": {"n_components": 2}},
            {"op": "diversity"},
            {"op": "Fst"},
            {"op": "Tajimas_D"},
        ],
        "sink": {"path": str(tmp_path / "out.zarr"),
                 "variables": ["sample_pca_projection", "stat_diversity", "stat_Fst", "stat_Tajimas_D", "window_contig"]},
    }
    flow = parse_flow(data, "sgkit.yaml")
    assert check_data(flow)["alleles"] == 3
    built = build_flow(flow, "cpu")
    assert set(built.result.data_vars) == set(data["sink"]["variables"])
    assert built.result.stat_diversity.dims == ("windows", "cohorts")
    data["source"]["variables"].remove("sample_cohort")
    with pytest.raises(FlowError, match=r"sgkit.yaml: steps\[5\] \(diversity\): no variable 'sample_cohort'.*"
                                        "it is in the store: add it to source.variables"):
        check_data(parse_flow(data, "sgkit.yaml"))


def test_what_the_table_accepts_the_ops_build():
    """What validation accepts from the table is what the ops accept: a long chain of the ops on the
    shared test data (every op that returns a Dataset), checked then built."""
    ds = _small()
    state = gv.State.of(ds)
    chain = [("sample_stats", {}), ("filter_samples", {"min_call_rate": 0.5}),
             ("filter_variants", {"max_alleles": 2, "min_call_rate": 0.5, "min_maf": 0.01, "min_hwe_p": 1e-12}),
             ("window_by_variant", {"size": 20}), ("count_call_alternate_alleles", {}),
             ("ld_prune", {"dosage": ALT}), ("impute_mean", {}), ("pca", {"n_components": 3}),
             ("sample_distance", {}), ("divergence", {}), ("Fst", {}), ("Tajimas_D", {}),
             ("gwas_linear_regression", GWAS)]
    for op, params in chain:
        state = gv.apply(op, ops_registry.get(op).params(**params).model_dump(), state)
        ds = ops_registry.get(op).func(ds, **params)
        assert set(state.variables) == set(map(str, ds.variables)), op
    assert {k: v.dims for k, v in state.variables.items()} == {k: tuple(v.dims) for k, v in ds.variables.items()}
    assert np.isfinite(ds.variant_linreg_beta.values).any()


def test_run_checks_the_steps_before_any_filter_reads_the_data(root, tmp_path, monkeypatch, capsys):
    """`pipeline run` makes the same checks as the source opens, before the filters compute their
    statistics over the data: a mistake in the last step exits 2 with validate's message (the op
    itself would say otherwise, after the filters' passes), and nothing is computed or written."""
    from pipeline import cli as pipeline_cli
    from pipeline.ops.genomics import qc

    mutate, texts = MISTAKES["covariate"][1:]
    path = tmp_path / "late.yaml"
    data = _flow("gwas", root, mutate)
    data["sink"]["path"] = str(tmp_path / "out.zarr")
    path.write_text(yaml.safe_dump(data))
    computed = []
    monkeypatch.setattr(qc, "_computed", lambda *a, **k: computed.append(1))  # a filter's statistics
    assert pipeline_cli.main(["run", str(path), "--backend", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {texts[0]}" in err, err
    assert not computed and not (tmp_path / "out.zarr").exists()
