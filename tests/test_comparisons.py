"""What held in every seed of the comparison sweeps (docs/results.md), re-checked.

The sweeps benchmarks/sweeps/comparisons-mixtures.toml and comparisons-strata.toml
run 5 seeds (benchmarks/measured/sweeps/comparisons-mixtures/ and
comparisons-strata/); these tests run the first seeds of the same federations and
assert only the outcomes every measured seed showed, with margin.
"""

from __future__ import annotations

import pytest

# benchmarks/sweeps/comparisons-mixtures.toml: its [base], its FedSoft and its
# label-permutation-mixture scenario.
MIXTURE = {
    "cluster-structure": "label-permutation-mixture", "num-clusters": 2,
    "mixture-alpha": 0.1, "validation-fraction": 0.0, "copy-per-group": True,
    "local-steps": 20, "num-rounds": 20, "plots": False,
}
FEDSOFT = {"strategy": "fedsoft", "fedsoft-init": "local-kmeans", "fedsoft-lambda": 0.01}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_fedsoft_beats_fedavg_on_conflicting_mixture(federation, seed: int) -> None:
    """Sources whose labels are permuted differently cannot share one network.

    Measured over seeds 0-4 (benchmarks/measured/sweeps/comparisons-mixtures/,
    docs/results.md, comparison (a)): FedSoft recovers the two sources exactly in
    every seed and beats FedAvg by a wide margin; the bounds ask for less. (IFCA and
    local-only beat FedSoft in every seed: not asserted here, the margin to
    local-only is within the spread over seeds.)
    """
    fedsoft = federation({**MIXTURE, **FEDSOFT, "seed": seed})
    fedavg = federation({**MIXTURE, "strategy": "fedavg", "seed": seed})
    assert fedsoft["ari"] == pytest.approx(1.0)
    assert fedsoft["personalized_accuracy"] > 0.7
    assert fedsoft["personalized_accuracy"] - fedavg["personalized_accuracy"] > 0.15


# benchmarks/sweeps/comparisons-strata.toml (FedAvg samples FLDC's 20 % a round).
STRATA = {
    "cluster-structure": "rotation", "num-clusters": 4, "copy-per-group": True,
    "num-rounds": 20, "plots": False,
}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_fldc_finds_rotation_strata_and_does_not_lose_to_fedavg(federation, seed: int) -> None:
    """Four rotation groups, no label skew: DBSCAN has strata to find.

    Measured over seeds 0-4 (benchmarks/measured/sweeps/comparisons-strata/,
    docs/results.md, comparison (b)): the knee's eps finds the strata, least well
    in seed 0, and FLDC against FedAvg is a tie within the spread over seeds, seed 0
    the worst. Asserted: the strata are found, and FLDC stays near FedAvg.
    """
    fldc = federation({**STRATA, "strategy": "fldc", "seed": seed})
    fedavg = federation({**STRATA, "strategy": "fedavg", "fraction-train": 0.2, "seed": seed})
    assert fldc["num_clusters_found"] >= 3, fldc
    assert fldc["ari"] >= 0.6, fldc
    assert fldc["personalized_accuracy"] - fedavg["personalized_accuracy"] > -0.12
    # eps by silhouette: the 4 strata exactly in every measured seed, and ahead of
    # FedAvg in every seed, by more than the bound below in seeds 0 and 1.
    silhouette = federation({**STRATA, "strategy": "fldc", "fldc-eps-method": "silhouette",
                             "seed": seed})
    assert silhouette["ari"] == pytest.approx(1.0), silhouette
    assert silhouette["personalized_accuracy"] > fedavg["personalized_accuracy"] + 0.01
