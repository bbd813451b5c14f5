"""``import pipeline.genomics as sg`` in place of ``import sgkit as sg``: every public name of
sgkit 0.10 is there.

``SGKIT_ALL`` is sgkit 0.10.0's ``sgkit.__all__``, copied as it is (in its order). ``PENDING`` holds
the names not yet written (none now); a test of one of them is skipped only while it is absent, so
that once written it must pass like the others and the set can only shrink."""

from __future__ import annotations

import pytest

import pipeline.genomics as sg

# sgkit 0.10.0's sgkit.__all__
SGKIT_ALL = [
    "DIM_ALLELE", "DIM_PLOIDY", "DIM_SAMPLE", "DIM_VARIANT", "call_allele_frequencies", "create_genotype_call_dataset",
    "cohort_allele_frequencies", "convert_call_to_index", "convert_probability_to_call", "count_variant_alleles",
    "count_call_alleles", "count_cohort_alleles", "count_variant_genotypes", "create_genotype_dosage_dataset",
    "display_genotypes", "display_pedigree", "filter_partial_calls", "genee", "genomic_relationship",
    "gwas_linear_regression", "regenie", "regenie_loco_regression", "hardy_weinberg_test", "hybrid_relationship",
    "hybrid_inverse_relationship", "identity_by_state", "individual_heterozygosity", "infer_call_ploidy",
    "infer_sample_ploidy", "infer_variant_ploidy", "invert_relationship_matrix", "ld_matrix", "ld_prune",
    "maximal_independent_set", "parent_indices", "pedigree_contribution", "pedigree_inbreeding",
    "pedigree_inverse_kinship", "pedigree_kinship", "pedigree_sel", "sample_stats", "variant_stats", "diversity",
    "divergence", "Fst", "Garud_H", "Tajimas_D", "pbs", "pc_relate", "simulate_genedrop",
    "simulate_genotype_call_dataset", "variables", "observed_heterozygosity", "pca", "Weir_Goudet_beta",
    "window_by_genome", "window_by_interval", "window_by_position", "window_by_variant", "load_dataset",
    "save_dataset", "pairwise_distance",
]

# not written yet: skipped while absent, tested like the others once present
PENDING: set[str] = set()  # every name is written

DIMS = {"DIM_ALLELE": "alleles", "DIM_PLOIDY": "ploidy", "DIM_SAMPLE": "samples", "DIM_VARIANT": "variants"}


def test_pending_names_are_sgkits():
    assert PENDING <= set(SGKIT_ALL)


@pytest.mark.parametrize("name", SGKIT_ALL)
def test_sgkit_name_exists(name):
    if name in PENDING and not hasattr(sg, name):
        pytest.skip(f"{name}: not written yet")
    assert hasattr(sg, name), name
    assert name in sg.__all__, name
    value = getattr(sg, name)
    if name in DIMS:
        assert value == DIMS[name]
    elif name == "variables":
        assert callable(value.validate)
    else:
        assert callable(value), name
