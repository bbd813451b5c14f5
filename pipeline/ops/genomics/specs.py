"""sgkit's ``variables`` module: the specs of the variables of a genotype dataset (name, kind of
values, dimensions, documentation) and ``validate``, which checks a dataset against them, as
sgkit 0.10's ``sgkit.variables`` (``import pipeline.genomics as sg``; ``sg.variables``).

The specs are sgkit's own, one for each variable sgkit registers; their ``__doc__`` is what
``annotate`` (and so ``create_genotype_call_dataset``) sets as a variable's ``comment``. A
mismatch is an :class:`~pipeline.errors.InputError` (a ``ValueError``, as sgkit's) naming the
variable and what was expected; dimensions of other names only warn (:class:`DimensionWarning`),
as in sgkit.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from itertools import product
from typing import Hashable, Mapping, Set, Tuple, Union

import numpy as np
import xarray as xr

from ...errors import InputError

__all__ = ["DIM_ALLELE", "DIM_PLOIDY", "DIM_SAMPLE", "DIM_VARIANT"]

DIM_CONTIG = "contigs"
DIM_VARIANT = "variants"
DIM_SAMPLE = "samples"
DIM_PLOIDY = "ploidy"
DIM_ALLELE = "alleles"
DIM_GENOTYPE = "genotypes"
DIM_FILTER = "filters"


class DimensionWarning(UserWarning):
    """A variable's dimensions are not named as its spec names them."""


@dataclass(frozen=True, eq=False)
class Spec:
    """A variable's spec: its name by default and its documentation."""

    default_name: str
    __doc__: str

    __hash__ = None  # type: ignore[assignment]  # as sgkit: a spec is not a key


@dataclass(frozen=True, eq=False)
class ArrayLikeSpec(Spec):
    """An array's spec: ``kind`` (NumPy kind letters, one or a set), ``ndim`` (one or a set) and
    ``dims`` (names; a set of names for alternatives, ``None`` in a set for an optional
    dimension, ``"*"`` for any name). ``ndim`` follows from ``dims`` where not given."""

    kind: Union[None, str, Set[str]] = None
    ndim: Union[None, int, Set[int]] = None
    dims: Union[None, Tuple[Union[Set[Union[None, str]], str], ...]] = None

    def __post_init__(self):
        if self.dims:
            optional = sum(None in d for d in self.dims if isinstance(d, set))
            ndim = len(self.dims) if not optional else {len(self.dims) - i for i in range(optional + 1)}
            if self.ndim and self.ndim != ndim:
                raise ValueError(f"Specified ndim '{self.ndim}' does not match dims {self.dims}")
            object.__setattr__(self, "ndim", ndim)


class SgkitVariables:
    """The registry of specs, by default name, and the checks of a dataset against them."""

    registered_variables: dict[Hashable, Spec] = {}

    @classmethod
    def register_variable(cls, spec: Spec) -> Tuple[str, Spec]:
        if spec.default_name in cls.registered_variables:
            raise ValueError(f"`{spec.default_name}` already registered")
        cls.registered_variables[spec.default_name] = spec
        return spec.default_name, spec

    @classmethod
    def _validate(cls, xr_dataset: xr.Dataset, *specs) -> xr.Dataset:
        return cls._check_dataset(xr_dataset, False, *specs)

    @classmethod
    def _annotate(cls, xr_dataset: xr.Dataset, *specs) -> xr.Dataset:
        return cls._check_dataset(xr_dataset, True, *specs)

    @classmethod
    def _check_dataset(cls, xr_dataset: xr.Dataset, add_comment_attr: bool, *specs) -> xr.Dataset:
        if not isinstance(xr_dataset, xr.Dataset):
            raise InputError(f"validate: expected an xarray.Dataset, got {type(xr_dataset).__name__}")
        for s in specs or tuple(xr_dataset.variables):
            if isinstance(s, Spec):
                cls._check_field(xr_dataset, s, s.default_name, add_comment_attr)
            elif isinstance(s, Mapping):
                for name, spec in s.items():
                    cls._check_field(xr_dataset, spec, name, add_comment_attr)
            elif s:
                if s in cls.registered_variables:
                    cls._check_field(xr_dataset, cls.registered_variables[s], s, add_comment_attr)
                elif s not in xr_dataset.indexes:  # an index without a spec is fine, as in sgkit
                    raise InputError(f"validate: no spec is registered for variable {s!r}")
        return xr_dataset

    @classmethod
    def _check_field(cls, xr_dataset: xr.Dataset, spec: Spec, name: Hashable, add_comment_attr: bool = False) -> None:
        if not isinstance(spec, ArrayLikeSpec):
            raise InputError(f"validate: the spec of {name!r} is a {type(spec).__name__}, not an ArrayLikeSpec")
        if name not in xr_dataset.variables:
            raise InputError(f"validate: the dataset has no variable {name!r} "
                             f"(its variables: {', '.join(map(str, xr_dataset.variables)) or 'none'})")
        arr = xr_dataset[name]
        problem = _mismatch(arr, spec)
        if problem:
            raise InputError(f"validate: variable {name!r} does not match its spec: {problem}")
        if spec.dims is not None:
            n = len(match_dims(arr.dims, spec.dims))
            if n != 1:
                warnings.warn(f"Dimensions {arr.dims} of {name!r} " + ("do not match" if n < 1 else f"match {n} ways to")
                              + f" {spec.dims}", DimensionWarning, stacklevel=4)
        if add_comment_attr and spec.__doc__ is not None:
            arr.attrs["comment"] = spec.__doc__.strip()


def _mismatch(arr: xr.DataArray, spec: ArrayLikeSpec) -> str | None:
    """What of ``arr`` is not as ``spec`` says (sgkit's ``check_array_like``), or None."""
    kinds = spec.kind if isinstance(spec.kind, set) else {spec.kind} if spec.kind else None
    if kinds is not None and arr.dtype.kind not in kinds:
        return f"values of type {arr.dtype} (kind {arr.dtype.kind!r}), expected kind {' or '.join(map(repr, sorted(kinds)))}"
    ndims = spec.ndim if isinstance(spec.ndim, set) else {spec.ndim} if spec.ndim is not None else None
    if ndims is not None and arr.ndim not in ndims:
        return f"{arr.ndim} dimensions {tuple(map(str, arr.dims))}, expected {' or '.join(map(str, sorted(ndims)))}"
    return None


def _match_dim(dim: str, spec) -> bool:
    if isinstance(spec, set):
        return "*" in spec or dim in spec
    return spec == "*" or spec == dim


def match_dims(dims: Tuple[str, ...], spec) -> np.ndarray:
    """Every way ``dims`` map onto ``spec`` (sgkit's ``match_dims``): rows of indexes into ``spec``."""
    n_dims, n_spec = len(dims), len(spec)
    if n_dims == n_spec:
        ok = all(_match_dim(d, s) for d, s in zip(dims, spec))
        return np.arange(n_dims)[None, :] if ok else np.empty((0, n_dims), int)
    reqs = np.array([None not in s if isinstance(s, set) else True for s in spec])
    if n_dims == reqs.sum():
        path = np.where(reqs)[0]
        ok = all(_match_dim(d, spec[i]) for d, i in zip(dims, path))
        return path[None, :] if ok else np.empty((0, n_dims), int)
    matches = [[i for i, s in enumerate(spec) if _match_dim(d, s)] for d in dims]
    paths = np.array(list(product(*matches))).reshape(-1, n_dims)
    ascending = (np.diff(paths) > 0).all(axis=-1)
    return paths[ascending & (reqs[paths].sum(axis=-1) == reqs.sum())]


validate = SgkitVariables._validate
annotate = SgkitVariables._annotate


def _register(name: str, *, kind=None, dims=None, ndim=None, __doc__: str) -> Tuple[str, ArrayLikeSpec]:
    return SgkitVariables.register_variable(ArrayLikeSpec(name, __doc__, kind=kind, ndim=ndim, dims=dims))


# sgkit 0.10's specs (sgkit/variables.py), in its order

call_allele_count, call_allele_count_spec = _register(
    "call_allele_count", kind="u", dims=("variants", "samples", "alleles"),
    __doc__="""Allele counts. With shape (variants, samples, alleles) and values
corresponding to the number of non-missing occurrences of each allele.""")

call_allele_frequency, call_allele_frequency_spec = _register(
    "call_allele_frequency", kind="f", dims=("variants", "samples", "alleles"),
    __doc__="""Allele frequencies. With shape (variants, samples, alleles) and values
corresponding to the frequencies of non-missing occurrences of each allele.""")

call_dosage, call_dosage_spec = _register(
    "call_dosage", kind={"f", "i", "u"}, dims=("variants", "samples"),
    __doc__="""Dosages, encoded as floats, with NaN indicating a missing value.
Dosages can represent one of several possible quantities, e.g.:
- Alternate allele counts
- Recessive or dominant allele encodings
- True dosages as computed from imputed or probabilistic variant calls
- Any other custom encoding in a user-defined variable""")

call_dosage_mask, call_dosage_mask_spec = _register(
    "call_dosage_mask", kind="b", dims=("variants", "samples"),
    __doc__="""A flag for each call indicating which values are missing.""")

call_genotype, call_genotype_spec = _register(
    "call_genotype", kind="i", dims=("variants", "samples", "ploidy"),
    __doc__="""Call genotype. Encoded as allele values (0 for the reference, 1 for
the first allele, 2 for the second allele), -1 to indicate a
missing value, or -2 to indicate a non allele in mixed ploidy datasets.""")

call_genotype_mask, call_genotype_mask_spec = _register(
    "call_genotype_mask", kind="b", dims=("variants", "samples", "ploidy"),
    __doc__="""A flag for each call indicating which values are missing.""")

call_genotype_fill, call_genotype_fill_spec = _register(
    "call_genotype_fill", kind="b", dims=("variants", "samples", "ploidy"),
    __doc__="""A flag for each allele position within mixed ploidy call genotypes
indicating fill (non-allele) values of lower ploidy calls.""")

call_genotype_phased, call_genotype_phased_spec = _register(
    "call_genotype_phased", kind="b", dims=("variants", "samples"),
    __doc__="""A flag for each call indicating if it is phased or not. If omitted
all calls are unphased.""")

call_genotype_complete, call_genotype_complete_spec = _register(
    "call_genotype_complete", kind="i", dims=("variants", "samples", "ploidy"),
    __doc__="""Call genotypes in which partial genotype calls are replaced with
completely missing genotype calls.""")

call_genotype_complete_mask, call_genotype_complete_mask_spec = _register(
    "call_genotype_complete_mask", kind="b", dims=("variants", "samples", "ploidy"),
    __doc__="""A flag for each call indicating which values are missing.""")

call_genotype_index, call_genotype_index_spec = _register(
    "call_genotype_index", kind="i", dims=("variants", "samples"),
    __doc__="""Single integer values encoding each call genotype. Each unique integer corresponds
to a unique call genotype following the VCF specification for arrays of size "G".
For biallelic genotypes, this is the count of the alternate allele. Values of -1
indicate call genotypes with missing alleles.""")

call_genotype_index_mask, call_genotype_index_mask_spec = _register(
    "call_genotype_index_mask", kind="b", dims=("variants", "samples"),
    __doc__="""A flag for each call genotype index indicating missing indices (-1) which correspond
to call genotypes with missing alleles.""")

call_genotype_probability, call_genotype_probability_spec = _register(
    "call_genotype_probability", kind="f", dims=("variants", "samples", "genotypes"),
    __doc__="""Genotype probabilities.""")

call_genotype_probability_mask, call_genotype_probability_mask_spec = _register(
    "call_genotype_probability_mask", kind="b", dims=("variants", "samples", "genotypes"),
    __doc__="""A flag for each call indicating which values are missing.""")

call_heterozygosity, call_heterozygosity_spec = _register(
    "call_heterozygosity", kind="f", dims=("variants", "samples"),
    __doc__="""Observed heterozygosity of each call genotype.""")

call_ploidy, call_ploidy_spec = _register(
    "call_ploidy", kind="i", dims=("variants", "samples"),
    __doc__="""Call genotype ploidy.""")

cohort_allele_count, cohort_allele_count_spec = _register(
    "cohort_allele_count", kind="u", dims=("variants", "cohorts", "alleles"),
    __doc__="""Cohort allele counts.""")

cohort_allele_frequency, cohort_allele_frequency_spec = _register(
    "cohort_allele_frequency", kind="f", dims=("variants", "cohorts", "alleles"),
    __doc__="""Cohort Allele frequencies. With shape (variants, cohorts, alleles) and values
corresponding to the frequencies of non-missing occurrences of each allele.""")

contig_id, contig_id_spec = _register(
    "contig_id", kind={"O", "S", "U"}, dims=("contigs",),
    __doc__="""Contig identifiers.""")

covariates, covariates_spec = _register(
    "covariates", kind=None, ndim={1, 2},
    __doc__="""Covariate variable names. Must correspond to 1 or 2D dataset
variables of shape (samples[, covariates]). All covariate arrays
will be concatenated along the second axis (columns).""")

genotype_id, genotype_id_spec = _register(
    "genotype_id", kind={"S", "U"}, dims=("genotypes",),
    __doc__="""VCF style genotype strings for all possible genotypes given the size of the
ploidy and alleles dimensions. The ordering of genotype strings follows the
ordering outlined in the VCF specification for arrays of size "G".""")

interval_contig_name, interval_contig_name_spec = _register(
    "interval_contig_name", kind={"O", "S", "U"}, ndim=1,
    __doc__="""Interval contig name. Must match a contig defined in the ``contigs`` attribute.""")

interval_start, interval_start_spec = _register(
    "interval_start", kind="i", ndim=1,
    __doc__="""Interval start position (inclusive).""")

interval_stop, interval_stop_spec = _register(
    "interval_stop", kind="i", ndim=1,
    __doc__="""Interval stop position (exclusive).""")

stat_identity_by_state, stat_identity_by_state_spec = _register(
    "stat_identity_by_state", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Pairwise IBS probabilities among all samples.""")

ld_prune_index_to_drop, ld_prune_index_to_drop_spec = _register(
    "ld_prune_index_to_drop", kind="i", ndim=1,
    __doc__="""Variant indexes to drop for LD prune.""")

parent, parent_spec = _register(
    "parent", kind="i", dims=("samples", "parents"),
    __doc__="""Indices of parent samples with negative values indicating unknown parents.""")

parent_id, parent_id_spec = _register(
    "parent_id", kind={"O", "S", "U"}, dims=("samples", "parents"),
    __doc__="""Unique identifiers of parent samples matching those in
:data:`sgkit.variables.sample_id_spec`.""")

regenie_base_prediction, regenie_base_prediction_spec = _register(
    "regenie_base_prediction", kind="f", dims=("blocks", "alphas", "samples", "outcomes"),
    __doc__="""REGENIE's base prediction (blocks, alphas, samples, outcomes). Stage 1
predictions from ridge regression reduction.""")

regenie_loco_prediction, regenie_loco_prediction_spec = _register(
    "regenie_loco_prediction", kind="f", dims=("contigs", "samples", "outcomes"),
    __doc__="""REGENIE's regenie_loco_prediction (contigs, samples, outcomes). LOCO predictions
resulting from Stage 2 predictions ignoring effects for variant blocks on
held out contigs. This will be absent if the data provided does not contain
at least 2 contigs.""")

regenie_meta_prediction, regenie_meta_prediction_spec = _register(
    "regenie_meta_prediction", kind="f", dims=("samples", "outcomes"),
    __doc__="""REGENIE's regenie_meta_prediction (samples, outcomes). Stage 2 predictions from
the best meta estimator trained on the out-of-sample Stage 1 predictions.""")

pc_relate_phi, pc_relate_phi_spec = _register(
    "pc_relate_phi", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""PC Relate kinship coefficient matrix.""")

sample_call_rate, sample_call_rate_spec = _register(
    "sample_call_rate", kind="f", dims=("samples",),
    __doc__="""The fraction of variants with called genotypes.""")

sample_cohort, sample_cohort_spec = _register(
    "sample_cohort", kind="i", dims=("samples",),
    __doc__="""The index of the cohort that each sample belongs to.
A negative value indicates a sample is not a member of any cohort.""")

sample_id, sample_id_spec = _register(
    "sample_id", kind={"O", "S", "U"}, dims=("samples",),
    __doc__="""The unique identifier of the sample.""")

sample_n_called, sample_n_called_spec = _register(
    "sample_n_called", kind="i", dims=("samples",),
    __doc__="""The number of variants with called genotypes.""")

sample_n_het, sample_n_het_spec = _register(
    "sample_n_het", kind="i", dims=("samples",),
    __doc__="""The number of variants with heterozygous calls.""")

sample_n_hom_alt, sample_n_hom_alt_spec = _register(
    "sample_n_hom_alt", kind="i", dims=("samples",),
    __doc__="""The number of variants with homozygous alternate calls.""")

sample_n_hom_ref, sample_n_hom_ref_spec = _register(
    "sample_n_hom_ref", kind="i", dims=("samples",),
    __doc__="""The number of variants with homozygous reference calls.""")

sample_n_non_ref, sample_n_non_ref_spec = _register(
    "sample_n_non_ref", kind="i", dims=("samples",),
    __doc__="""The number of variants that are not homozygous reference calls.""")

sample_pca_component, sample_pca_component_spec = _register(
    "sample_pca_component", kind="f", dims=("variants", "components"),
    __doc__="""Principal axes defined as eigenvectors for sample covariance matrix.
In the context of SVD, these are equivalent to the right singular vectors in
the decomposition of a (N, M) matrix., i.e. ``sgkit.stats.truncated_svd.TruncatedSVD.components_``.""")

sample_pca_explained_variance, sample_pca_explained_variance_spec = _register(
    "sample_pca_explained_variance", kind="f", dims=("components",),
    __doc__="""Variance explained by each principal component. These values are equivalent
to eigenvalues that result from the eigendecomposition of a (N, M) matrix,
i.e. ``sgkit.stats.truncated_svd.TruncatedSVD.explained_variance_``.""")

sample_pca_explained_variance_ratio, sample_pca_explained_variance_ratio_spec = _register(
    "sample_pca_explained_variance_ratio", kind="f", dims=("components",),
    __doc__="""Ratio of variance explained to total variance for each principal component,
i.e. ``sgkit.stats.truncated_svd.TruncatedSVD.explained_variance_ratio_``.""")

sample_pca_loading, sample_pca_loading_spec = _register(
    "sample_pca_loading", kind="f", dims=("variants", "components"),
    __doc__="""PCA loadings defined as principal axes scaled by square root of eigenvalues.
These values  can also be interpreted  as the correlation between the original variables
and unit-scaled principal axes.""")

sample_pca_projection, sample_pca_projection_spec = _register(
    "sample_pca_projection", kind="f", dims=("samples", "components"),
    __doc__="""Projection of samples onto principal axes. This array is commonly
referred to as "scores" or simply "principal components (PCs)" for a set of samples.""")

sample_ploidy, sample_ploidy_spec = _register(
    "sample_ploidy", kind="i", dims=("samples",),
    __doc__="""Ploidy of each sample calculated from call genotypes across all variants
with -1 indicating variable ploidy.""")

stat_Fst, stat_Fst_spec = _register(
    "stat_Fst", kind="f", dims=({"variants", "windows"}, "cohorts_0", "cohorts_1"),
    __doc__="""Fixation index (Fst) between pairs of cohorts.""")

stat_divergence, stat_divergence_spec = _register(
    "stat_divergence", kind="f", dims=({"variants", "windows"}, "cohorts_0", "cohorts_1"),
    __doc__="""Genetic divergence between pairs of cohorts.""")

stat_diversity, stat_diversity_spec = _register(
    "stat_diversity", kind="f", dims=({"variants", "windows"}, "cohorts"),
    __doc__="""Genetic diversity (also known as "Tajima’s pi") for cohorts.""")

stat_Garud_h1, stat_Garud_h1_spec = _register(
    "stat_Garud_h1", kind="f", dims=("windows", "cohorts"),
    __doc__="""Garud H1 statistic for cohorts.""")

stat_Garud_h12, stat_Garud_h12_spec = _register(
    "stat_Garud_h12", kind="f", dims=("windows", "cohorts"),
    __doc__="""Garud H12 statistic for cohorts.""")

stat_Garud_h123, stat_Garud_h123_spec = _register(
    "stat_Garud_h123", kind="f", dims=("windows", "cohorts"),
    __doc__="""Garud H123 statistic for cohorts.""")

stat_Garud_h2_h1, stat_Garud_h2_h1_spec = _register(
    "stat_Garud_h2_h1", kind="f", dims=("windows", "cohorts"),
    __doc__="""Garud H2/H1 statistic for cohorts.""")

stat_genomic_kinship, stat_genomic_kinship_spec = _register(
    "stat_genomic_kinship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Genomic kinship matrix with self-kinship values on the diagonal.""")

stat_genomic_relationship, stat_genomic_relationship_spec = _register(
    "stat_genomic_relationship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Genomic relationship matrix (GRM).""")

stat_Hamilton_Kerr_tau, stat_Hamilton_Kerr_tau_spec = _register(
    "stat_Hamilton_Kerr_tau", kind="u", dims=("samples", "parents"),
    __doc__="""Numerical contribution of each parent, for each individual, which must sum to the
ploidy of the individual. This can be interpreted as gametic ploidy in the case of
sexual reproduction, or more broadly as the number of genome copies inherited in
asexual reproduction. Values should be included for all parents even when parents
are unknown or not included within a dataset. The dimensions of this variable must
match those of :data:`sgkit.variables.parent_spec`.

See also: :data:`sgkit.variables.stat_Hamilton_Kerr_lambda_spec`.""")

stat_Hamilton_Kerr_lambda, stat_Hamilton_Kerr_lambda_spec = _register(
    "stat_Hamilton_Kerr_lambda", kind="f", dims=("samples", "parents"),
    __doc__="""The probability that two (randomly chosen without replacement) homologues, inherited
from a single parent, were derived from a single chromosomal copy within that parent.
This variable may be used to encode an increased probability of IBD resulting from
meiotic or asexual processes. The dimensions of this variable must match those of
:data:`sgkit.variables.parent_spec`.

See also: :data:`sgkit.variables.stat_Hamilton_Kerr_tau_spec`.""")

stat_pedigree_inverse_kinship, stat_pedigree_inverse_kinship_spec = _register(
    "stat_pedigree_inverse_kinship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Inverse of a kinship matrix calculated from pedigree structure.""")

stat_hybrid_relationship, stat_hybrid_relationship_spec = _register(
    "stat_hybrid_relationship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""The hybrid relationship matrix or "H-matrix".""")

stat_hybrid_inverse_relationship, stat_hybrid_inverse_relationship_spec = _register(
    "stat_hybrid_inverse_relationship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Inverse of the hybrid relationship matrix or "H-matrix".""")

stat_pedigree_inverse_relationship, stat_pedigree_inverse_relationship_spec = _register(
    "stat_pedigree_inverse_relationship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Inverse of a relationship matrix calculated from pedigree structure.""")

stat_observed_heterozygosity, stat_observed_heterozygosity_spec = _register(
    "stat_observed_heterozygosity", kind="f", dims=({"variants", "windows"}, "cohorts"),
    __doc__="""Observed heterozygosity for cohorts.""")

stat_pbs, stat_pbs_spec = _register(
    "stat_pbs", kind="f", dims=({"variants", "windows"}, "cohorts_0", "cohorts_1", "cohorts_2"),
    __doc__="""Population branching statistic for cohort triples.""")

stat_pedigree_contribution, stat_pedigree_contribution_spec = _register(
    "stat_pedigree_contribution", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Expected proportional genomic contribution to and from each pair of samples
based on pedigree structure. This is an asymmetric matrix in which the
element [x, y] is the expected contribution of sample x to sample y.
Diagonal values are always 1.""")

stat_pedigree_inbreeding, stat_pedigree_inbreeding_spec = _register(
    "stat_pedigree_inbreeding", kind="f", dims=("samples",),
    __doc__="""Expected inbreeding coefficients of samples based on pedigree structure.""")

stat_pedigree_kinship, stat_pedigree_kinship_spec = _register(
    "stat_pedigree_kinship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Pairwise estimates of expected kinship among samples based on pedigree structure
with self-kinship values on the diagonal.""")

stat_pedigree_relationship, stat_pedigree_relationship_spec = _register(
    "stat_pedigree_relationship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Relationship matrix derived from pedigree structure.""")

stat_inverse_relationship, stat_inverse_relationship_spec = _register(
    "stat_inverse_relationship", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""The inverse of a relationship matrix. This may contain the inverse of a subset of
a relationship matrix in which nan values indicate elements outside of the subset.""")

stat_Tajimas_D, stat_Tajimas_D_spec = _register(
    "stat_Tajimas_D", kind="f", dims=({"variants", "windows"}, "cohorts"),
    __doc__="""Tajima’s D for cohorts.""")

stat_Weir_Goudet_beta, stat_Weir_Goudet_beta_spec = _register(
    "stat_Weir_Goudet_beta", kind="f", dims=("samples_0", "samples_1"),
    __doc__="""Pairwise Weir Goudet beta statistic among all samples.""")

traits, traits_spec = _register(
    "traits", kind=None, dims=("samples", {"*", None}),
    __doc__="""Trait (for example phenotype) variable names. Must all be continuous and
correspond to 1 or 2D dataset variables of shape (samples[, traits]).
2D trait arrays will be assumed to contain separate traits within columns
and concatenated to any 1D traits along the second axis (columns).""")

variant_allele, variant_allele_spec = _register(
    "variant_allele", kind={"O", "S"}, dims=("variants", "alleles"),
    __doc__="""The possible alleles for the variant.""")

variant_allele_count, variant_allele_count_spec = _register(
    "variant_allele_count", kind="u", dims=("variants", "alleles"),
    __doc__="""Variant allele counts. With shape (variants, alleles) and values
corresponding to the number of non-missing occurrences of each allele.""")

variant_allele_frequency, variant_allele_frequency_spec = _register(
    "variant_allele_frequency", kind="f", dims=("variants", "alleles"),
    __doc__="""The frequency of the occurrence of each allele.""")

variant_allele_total, variant_allele_total_spec = _register(
    "variant_allele_total", kind="i", dims=("variants",),
    __doc__="""The number of occurrences of all alleles.""")

variant_linreg_beta, variant_linreg_beta_spec = _register(
    "variant_linreg_beta", kind=None, dims=("variants", "traits"),
    __doc__="""Beta values associated with each variant and trait.""")

variant_call_rate, variant_call_rate_spec = _register(
    "variant_call_rate", kind="f", dims=("variants",),
    __doc__="""The fraction of samples with called genotypes.""")

variant_contig, variant_contig_spec = _register(
    "variant_contig", kind={"i", "u"}, dims=("variants",),
    __doc__="""Index corresponding to contig name for each variant. In some less common
scenarios, this may also be equivalent to the contig names if the data
generating process used contig names that were also integers.""")

variant_genotype_count, variant_genotype_count_spec = _register(
    "variant_genotype_count", kind={"i", "u"}, dims=("variants", "genotypes"),
    __doc__="""The number of observations for each possible genotype at each variant.
Counts are sorted following the ordering defined in the VCF specification.

- For biallelic, diploid genotypes the ordering is ``00``, ``01``, ``11``
  (homozygous reference, heterozygous, homozygous alternate).
- For triallelic, diploid genotypes the ordering is ``00``, ``01``, ``11``,
  ``02``, ``12``, ``22``
- For triallelic, triploid genotypes the ordering is  ``000``, ``001``, ``011``,
  ``111``, ``002``, ``012``, ``112``, ``022``, ``122``, ``222``""")

variant_hwe_p_value, variant_hwe_p_value_spec = _register(
    "variant_hwe_p_value", kind="f", dims=("variants",),
    __doc__="""P values from HWE test for each variant as float in [0, 1].""")

variant_id, variant_id_spec = _register(
    "variant_id", kind={"O", "S", "U"}, dims=("variants",),
    __doc__="""The unique identifier of the variant.""")

variant_n_called, variant_n_called_spec = _register(
    "variant_n_called", kind="i", dims=("variants",),
    __doc__="""The number of samples with called genotypes.""")

variant_n_het, variant_n_het_spec = _register(
    "variant_n_het", kind="i", dims=("variants",),
    __doc__="""The number of samples with heterozygous calls.""")

variant_n_hom_alt, variant_n_hom_alt_spec = _register(
    "variant_n_hom_alt", kind="i", dims=("variants",),
    __doc__="""The number of samples with homozygous alternate calls.""")

variant_n_hom_ref, variant_n_hom_ref_spec = _register(
    "variant_n_hom_ref", kind="i", dims=("variants",),
    __doc__="""The number of samples with homozygous reference calls.""")

variant_n_non_ref, variant_n_non_ref_spec = _register(
    "variant_n_non_ref", kind="i", dims=("variants",),
    __doc__="""The number of samples that are not homozygous reference calls.""")

variant_linreg_p_value, variant_linreg_p_value_spec = _register(
    "variant_linreg_p_value", kind="f", dims=("variants", "traits"),
    __doc__="""P values as float in [0, 1].""")

variant_position, variant_position_spec = _register(
    "variant_position", kind="i", dims=("variants",),
    __doc__="""The reference position of the variant.""")

variant_linreg_t_value, variant_linreg_t_value_spec = _register(
    "variant_linreg_t_value", kind=None, dims=("variants", "traits"),
    __doc__="""T statistics for each beta.""")

variant_ploidy, variant_ploidy_spec = _register(
    "variant_ploidy", kind="i", dims=("variants",),
    __doc__="""Ploidy of each variant calculated from call genotypes across all samples
with -1 indicating variable ploidy.""")

variant_score, variant_score_spec = _register(
    "variant_score", kind="f", dims=("variants",),
    __doc__="""Scores to prioritize variant selection when constructing an LD matrix.""")

window_contig, window_contig_spec = _register(
    "window_contig", kind="i", dims=("windows",),
    __doc__="""The contig index of each window.""")

window_start, window_start_spec = _register(
    "window_start", kind="i", dims=("windows",),
    __doc__="""The index values of window start positions along the ``variants`` dimension.""")

window_stop, window_stop_spec = _register(
    "window_stop", kind="i", dims=("windows",),
    __doc__="""The index values of window stop positions along the ``variants`` dimension.""")
