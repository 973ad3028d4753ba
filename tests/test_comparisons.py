"""What held in every seed of benchmarks/comparisons.py (docs/results.md), re-checked.

The benchmark runs 5 seeds; these tests run the first seeds of the same federation
and assert only the outcomes every measured seed showed, with margin.
"""

from __future__ import annotations

import pytest

# benchmarks/comparisons.py: MIXTURE, FEDSOFT and the label-permutation-mixture scenario.
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

    Measured over seeds 0-4 (docs/results.md): FedSoft recovers the two sources
    (ARI 1) in every seed, reaches 0.774-0.872 and beats FedAvg by +0.24 to +0.30;
    the bounds ask for less. (IFCA and local-only beat FedSoft in every seed: not
    asserted here, the margin to local-only is 0.01-0.02.)
    """
    fedsoft = federation({**MIXTURE, **FEDSOFT, "seed": seed})
    fedavg = federation({**MIXTURE, "strategy": "fedavg", "seed": seed})
    assert fedsoft["ari"] == pytest.approx(1.0)
    assert fedsoft["personalized_accuracy"] > 0.7
    assert fedsoft["personalized_accuracy"] - fedavg["personalized_accuracy"] > 0.15
