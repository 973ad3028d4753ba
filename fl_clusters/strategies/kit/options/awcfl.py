"""AWCFL's inter-cluster mixing, an option of every hard-clustered strategy (Li and Yan 2023)."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

from flwr.app import ArrayRecord
from flwr.common.logger import log

from fl_clusters import protocol as p
from fl_clusters.clustering import inter_cluster_mix
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.behaviours import Behaviour
from fl_clusters.strategies.kit.recipes import RecipeValue

# The paper, as the sources below cite it (docs/paper-fidelity.md).
SOURCE = "Li and Yan 2023 (seed 000)"
# Seed 000 gives a batch size and nothing else of its training; a strategy's own
# paper decides where it gives one (Declared.paper_recipe). AWCFL and MCFL share it.
SEED_000_RECIPE = (
    RecipeValue("batch-size", 30, f"{SOURCE}, section 4.1: batch size 30 (MNIST; 64 on "
                "EMNIST)"),
)


def mix_clusters(
    models: list[ArrayRecord], beta: float, active: Iterable[int] | None = None
) -> list[ArrayRecord]:
    """Blend each active cluster model with the other active ones (identity when beta is 0).

    Cluster k becomes ``beta/(n-1) * sum of the other clusters + (1-beta) * its own
    mean`` (:func:`~fl_clusters.clustering.inter_cluster_mix`).

    Parameters
    ----------
    models : list[ArrayRecord]
        Every cluster's model after this round's aggregation.
    beta : float
        The weight of the other clusters, in [0, 1].
    active : Iterable[int] | None
        The clusters that aggregated members this round; only they are mixed
        with each other. A cluster without members keeps its model: mixing it
        would drag it to the others' mean, where it can capture their clients.
        ``None`` mixes every cluster.

    Returns
    -------
    list[ArrayRecord]
        The models, the active ones mixed (``models`` itself when nothing mixes).
    """
    chosen = sorted(set(range(len(models)) if active is None else active))
    if beta == 0.0 or len(chosen) < 2:
        return models
    names = list(models[0].keys())
    mixed = inter_cluster_mix([[models[j][n].numpy() for n in names] for j in chosen], beta)
    result = list(models)
    for j, arrays in zip(chosen, mixed, strict=True):
        result[j] = p.numpy_to_record(names, arrays)
    return result


class AWCFLOption(ClusteredStrategy):
    """AWCFL composed into a strategy: the run-config key ``awcfl-beta``.

    The strategy declares ``INTER_CLUSTER``'s ``awcfl_beta`` and passes its
    aggregated cluster models through :meth:`mix_clusters`: cluster k becomes
    ``beta/(n-1) * sum of the other clusters + (1-beta) * its own mean``; 0 is
    plain clustered aggregation.
    """

    awcfl_beta: float
    awcfl_example_weights: bool
    paper_revision = 2
    paper_rules_apply_with = "awcfl-beta"
    behaviours = (
        Behaviour(
            "awcfl_example_weights",
            paper_rule="AWCFL (awcfl-beta > 0): the own-cluster term is the plain mean of "
            "the members' models, (1 - beta) / len(c_k) x their sum",
            robust_rule="the own-cluster term weighs each member by its examples, as FedAvg "
            "does (IFCA: its aggregation argument decides)",
            why="a plain mean lets a client with a few examples move its cluster as much as "
            "one with many",
            source=f"{SOURCE}, section 3.1, Algorithm 1 step 3.3.1"),
    )
    recipe = SEED_000_RECIPE

    def own_term_weighted(self) -> bool:
        """Whether a cluster's own mean weighs its members by examples (see ``behaviours``).

        The paper's plain mean belongs to AWCFL's rule: without mixing (beta 0) a
        cluster averages as FedAvg does.
        """
        return self.awcfl_example_weights or self.awcfl_beta == 0.0

    def mix_clusters(
        self, models: list[ArrayRecord], active: Iterable[int] | None = None
    ) -> list[ArrayRecord]:
        """AWCFL's inter-cluster weighting of ``models`` (identity when beta is 0).

        See :func:`mix_clusters` (the module's function).
        """
        return mix_clusters(models, self.awcfl_beta, active)

    def summary(self) -> None:
        """Log AWCFL's beta."""
        log(INFO, "\t├──> AWCFL beta %.2f", self.awcfl_beta)
        super().summary()
