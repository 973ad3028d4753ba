"""How often MCFL's nearest-feature choice sends a client to the wrong cluster model.

MCFL's choice reads inputs only: each cluster's feature is the mean of its
members' uploads (the mean of ``n`` sampled training inputs each), and a client
uses the cluster whose feature is nearest to the mean of its test inputs. So its
reliability can be measured without training: take the true rotation groups as
the clusters (what IFCA reaches at ARI 1.0), draw the members' training samples
many times (in a federation the draw is seeded by the random node id) and count
clients whose test mean picks another group.

Digits, 4 rotation groups, 20 clients, a 10 % validation split; test splits of
20 % (the app's default), 30 % and 40 %, and 20 % with ``copy-per-group``.
Writes ``benchmarks/measured/mcfl_choice.json`` (one row per setting and seed under
``rows``, beside the run's ``provenance``).

    python benchmarks/mcfl_choice.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from fl_clusters.clustering import cluster_feature_means, nearest_feature
from fl_clusters.data import ClientData, load_dataset, partition_dataset
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "mcfl_choice.json"
NUM_CLIENTS, NUM_GROUPS, FEATURE_SAMPLES = 20, 4, 32  # the app's defaults
SEEDS, DRAWS = (0, 1, 2), 300
# (test fraction, copy per group): the test-side mean is the noisy one, so its size
# decides how often a choice goes wrong.
SETTINGS = ((0.2, False), (0.3, False), (0.4, False), (0.2, True))


def flat_mean(images: np.ndarray) -> np.ndarray:
    """The mean of flattened inputs, as the ClientApp uploads it."""
    return images.reshape(len(images), -1).mean(axis=0)


def wrong_choices(clients: list[ClientData], rng: np.random.Generator) -> int:
    """Clients whose test mean picks another group's feature, for one draw of uploads.

    Each upload is the mean of at most ``FEATURE_SAMPLES`` training inputs, as in
    ``TorchLearner.feature_mean``.
    """
    truth = np.array([c.true_cluster for c in clients])
    uploads = np.stack([
        flat_mean(c.x_train[rng.choice(len(c.x_train), min(FEATURE_SAMPLES, len(c.x_train)),
                                    replace=False)])
        for c in clients
    ])
    features = cluster_feature_means(uploads, truth, NUM_GROUPS)
    choice = nearest_feature(np.stack([flat_mean(c.x_test) for c in clients]), features)
    return int(np.sum(choice != truth))


def main() -> int:
    """Count wrong choices over draws in every setting and write the results file."""
    source = measurement_provenance()
    dataset = load_dataset("digits")
    rows = []
    for test_fraction, copy_per_group in SETTINGS:
        for seed in SEEDS:
            clients = partition_dataset(
                dataset, NUM_CLIENTS, structure="rotation", num_groups=NUM_GROUPS,
                test_fraction=test_fraction, validation_fraction=0.1,
                copy_per_group=copy_per_group, seed=seed,
            )
            rng = np.random.default_rng(seed)
            wrong = np.array([wrong_choices(clients, rng) for _ in range(DRAWS)])
            rows.append({
                "test_fraction": test_fraction,
                "copy_per_group": copy_per_group,
                "seed": seed,
                "mean_test_samples": float(np.mean([len(c.x_test) for c in clients])),
                "draws": DRAWS,
                "runs_with_a_wrong_choice": float(np.mean(wrong > 0)),
                "mean_choice_accuracy": float(1 - wrong.mean() / NUM_CLIENTS),
            })
            print(rows[-1])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"provenance": source, "rows": rows}, indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
