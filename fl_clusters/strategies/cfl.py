"""CFL: Clustered Federated Learning (Sattler, Mueller, Samek, IEEE TNNLS 2020)."""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    CFLSplitDecision,
    closest_direction,
    coherence_split_gate,
    decide_cfl_split,
    update_coherence,
    update_norms,
)
from fl_clusters.strategies.kit import (
    HardClusteredStrategy,
    Param,
    RecipeValue,
    reply_updates,
)


def _below(value: float, bound: float) -> str:
    """The comparison sign of a test that passes below ``bound``."""
    return "<" if value < bound else ">="


def _above(value: float, bound: float) -> str:
    """The comparison sign of a test that passes above ``bound``."""
    return ">" if value > bound else "<="


@dataclass(frozen=True)
class SplitRecord:
    """One split of CFL's cluster tree: what a newcomer is compared against.

    Parameters
    ----------
    cluster : int
        The cluster that split; its first part keeps this number.
    new_cluster : int
        The number of the second part.
    model : ArrayRecord
        The cluster's model the members had trained from when it split.
    directions : np.ndarray
        (2, D) mean update of each part in that round (kept part first).
    """

    cluster: int
    new_cluster: int
    model: ArrayRecord
    directions: np.ndarray


# The paper, as the sources below cite it (docs/paper-fidelity.md).
SOURCE = "Sattler et al. 2020 (not among the seeds; digest in ALGORITHMS.md)"


class CFL(HardClusteredStrategy):
    """CFL: FedAvg inside each cluster, and recursive bipartition of stalled clusters.

    Every sampled node trains from its cluster's model. After a round, each cluster
    with at least two trained members looks at its members' updates (trained model
    minus the cluster model they started from): when the mean update is small
    (the joint objective is near a stationary point; by default small against
    the members' own updates, see ``gate``) while the members still move, they
    are split in two by complete-linkage clustering of their updates' cosine
    similarities, and the split is kept when no pair across the two parts is
    more similar than ``split_threshold`` and the updates fall into clear
    groups at all (their best silhouette over 2..10 clusters is at least
    ``min_silhouette``). Each
    part then averages its own members. Clusters keep splitting in later rounds
    until none qualifies, so the number of clusters is found, not given.

    Only nodes that trained this round take part in a split (an unknown update
    would be placed arbitrarily); a member that did not train in its cluster's
    split round is released and picks among all cluster models by training loss
    the next time it is sampled.

    A cluster of fewer than three trained members never splits (the authors'
    rule: two members would become two single clients).

    A node without a cluster after the first split (it joined late, or missed
    its cluster's split) is placed down the split tree as the paper describes:
    at each split it trains once from the model the cluster had then, and
    follows the part whose mean update its own update is most similar to
    (cosine). A node that does not answer the placement picks among all cluster
    models by training loss instead, which is logged.
    """

    name = "cfl"
    paper_revision = 2
    paper = "Sattler et al., IEEE TNNLS 2020"
    params = (
        Param("gate", "relative", "str",
              "CFL split norms: scale-free (same round's updates), or absolute eps1/eps2",
              choices=("relative", "absolute"), paper="absolute",
              why="absolute eps1/eps2 fit one model and optimizer: under momentum or Adam "
              "the update norms grow or shrink and the gate never opens; the relative gate "
              "compares the mean update with the same round's update norms",
              source=f"{SOURCE}, section III: split when the mean update norm is below "
              "eps1 and the largest above eps2",
              doc='``"relative"``: scale-free '
              "(:func:`~fl_clusters.clustering.coherence_split_gate`): the mean update is "
              "small against the members' own updates of the same round, ``||mean Delta|| < "
              "mean_ratio x mean ||Delta_i||``, and the largest update is above "
              "``max_ratio`` x R, R the largest client update norm of the run's first "
              "``max(1, warmup_rounds)`` rounds (by default only above 0). Any scale common "
              "to the updates (model, learning rate, momentum, Adam, local epochs) cancels "
              "in the first test. Whether members whose moves cancel form groups or only "
              "differ by noise is left to ``split_threshold`` and ``min_silhouette``, which "
              'read the directions of the updates, not their size. ``"absolute"``: the '
              "paper's ``eps1`` and ``eps2``."),
        Param("mean_ratio", 0.8, "float",
              "CFL relative gate: split when |mean update| < this x the mean update norm",
              above=0.0, high=1.0,
              doc="Relative gate: split only when ``||mean Delta|| / mean ||Delta_i||`` (the "
              "coherence, 1 when all members move alike) is below this, in (0, 1]. Members "
              "of one distribution move alike while their model improves and less so once it "
              "converges; members of distinct groups cancel. The split threshold and the "
              "group silhouette, not this gate, are what stop spurious splits once it opens "
              "(docs/clustering-defaults.md)."),
        Param("max_ratio", 0.0, "float",
              "CFL relative gate: largest update norm > this x the largest of the first "
              "rounds (0: > 0)", low=0.0,
              doc="Relative gate: split only when the largest member norm is above this x R, >= "
              "0; 0 asks only that some member moved. How far the norms fall after the first "
              "rounds is the optimizer's schedule, not the clients' agreement: under Adam a "
              "bound on it can keep the gate closed while the groups' moves cancel "
              "(docs/clustering-defaults.md)."),
        Param("eps1", 0.4, "float", "CFL: split when mean update norm < eps1", low=0.0,
              doc="Absolute gate: split only when the mean update norm is below this, >= 0."),
        Param("eps2", 0.45, "float", "CFL: and max client update norm > eps2", low=0.0,
              paper=1.6, source="the authors' demo code (10 EMNIST clients, half rotated "
              "180 degrees), where eps1 = 0.4 and eps2 = 1.6",
              why="norms scale with the model and the local training: 0.45 suits the "
              "bundled digits MLP, on which the demo's 1.6 is never reached",
              doc="Absolute gate: split only when the largest member update norm is above this, "
              ">= 0. Norms scale with the model and the local training: these suit the "
              "bundled digits MLP; the authors' EMNIST demo used 0.4 and 1.6."),
        Param("split_threshold", 0.45, "float",
              "CFL: accept when max cross-cluster cosine < this", low=-1.0, high=1.0,
              doc="Accept a split only when the largest cosine similarity across the two parts "
              "is below this, in [-1, 1]. Clients of one distribution keep a high cross "
              "similarity, so this is what prevents spurious splits."),
        Param("min_silhouette", 0.4, "float",
              "CFL: split only when the updates' best silhouette over 2..10 groups is >= this "
              "(-1 = off)", low=-1.0, high=1.0, paper=-1.0,
              why="the paper has no group test; without it, a cluster whose updates differ "
              "only by sample noise is cut wherever the cross similarity dips below the "
              "threshold",
              source=f"{SOURCE}, section III: a split is accepted on the cross-cluster "
              "similarity alone",
              doc="Accept a split only when the members' updates form groups: the best "
              "silhouette (cosine distance) of a complete-linkage clustering of them into "
              "2..10 clusters is at least this, in [-1, 1]; -1 turns the test off (the "
              "paper's rule). Clusters that hold several groups score well above it and "
              "clusters of one group well below, where the cross similarity alone lets small "
              "noisy groups split (docs/clustering-defaults.md). With the default gate this "
              "test is what keeps a converged cluster, whose members' noise cancels, from "
              "being cut."),
        Param("warmup_rounds", 2, "int", "CFL: no split in the first rounds", low=0,
              doc="No split is considered in rounds ``<= warmup_rounds``."),
    )
    # The authors' demo (github.com/felisat/clustered-federated-learning, fl_devices.py),
    # the source of the paper preset's eps1 and eps2.
    recipe = (
        RecipeValue("local-epochs", 1, "the authors' demo (fl_devices.py: "
                    "compute_weight_update(epochs=1))"),
        RecipeValue("local-steps", 0, "the authors' demo (fl_devices.py: local training is "
                    "counted in epochs)"),
        RecipeValue("batch-size", 128, "the authors' demo (fl_devices.py: Client "
                    "batch_size=128)"),
        RecipeValue("lr-schedule", "x 0.99 a round", "the authors' demo (fl_devices.py: "
                    "compute_weight_update multiplies the optimizer's lr by 0.99)",
                    not_applied="each round's message sends one lr and the learner keeps no "
                    "optimizer between rounds"),
    )

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.split_rounds: list[int] = []
        self.splits: list[SplitRecord] = []
        # Largest client update norm of the first rounds: the relative gate's scale.
        self.reference_norm = 0.0
        # Every cluster-round's gate figures: whether the stationarity test held is
        # measurable after the run (summary.json's gate_history).
        self.gate_history: list[dict[str, Any]] = []

    def place_newcomers(
        self, server_round: int, nodes: list[int], config: ConfigRecord, grid: Grid
    ) -> None:
        """Walk each node down the split tree by the similarity of its updates."""
        if not self.splits:
            return
        self._placement_asked.update(nodes)
        position = {node: (0, 0) for node in nodes}  # node -> (cluster, next split to test)
        while True:
            pending: dict[int, int] = {}
            for node, (cluster, first) in position.items():
                later = [i for i in range(first, len(self.splits))
                         if self.splits[i].cluster == cluster]
                if later:
                    pending[node] = later[0]
            if not pending:
                break
            answered = set()
            for index in sorted(set(pending.values())):
                split = self.splits[index]
                node_config = self.round_config(config, server_round)
                node_config[p.CFG_ASSIGNED] = split.cluster
                at_split = [n for n, i in pending.items() if i == index]
                for msg in self.train_once(at_split, split.model, node_config, grid,
                                           "cfl placement"):
                    node = msg.metadata.src_node_id
                    side = closest_direction(reply_updates([msg], split.model)[0],
                                             split.directions)
                    position[node] = (split.new_cluster if side else split.cluster, index + 1)
                    answered.add(node)
            for node in set(pending) - answered:
                del position[node]
                log(WARNING, "round %d: node %d gave no usable update for its placement: "
                    "it picks a cluster by training loss", server_round, node)
        for node, (cluster, _) in position.items():
            self.assignments[node] = cluster
            self.placed_nodes[node] = cluster
            log(INFO, "round %d: node %d placed in cluster %d down the split tree",
                server_round, node, cluster)

    def aggregate_members(
        self, server_round: int, members: dict[int, list[Message]]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Split the clusters that qualify, then average each cluster's members."""
        models = list(self._models)
        groups: dict[int, list[Message]] = {}
        mean_norms, max_norms = [], []
        verdicts = []
        for cluster in sorted(members):
            trained = members[cluster]
            updates = reply_updates(trained, models[cluster])
            coherence = update_coherence(updates)
            gate_open, gate_text = self._gate(server_round, updates, coherence)
            decision = decide_cfl_split(
                updates, self.eps1, self.eps2, self.split_threshold,
                norms_qualify=gate_open and server_round > self.warmup_rounds,
                min_structure=self.min_silhouette,
            )
            self.gate_history.append({
                "round": server_round, "cluster": cluster, "members": len(trained),
                "coherence": coherence,
                "mean_norm": float(decision.mean_norm), "max_norm": float(decision.max_norm),
                "gate_open": bool(gate_open), "split": bool(decision.split),
            })
            mean_norms.append(decision.mean_norm)
            max_norms.append(decision.max_norm)
            verdict = f"cluster {cluster} ({len(trained)} trained): {gate_text}"
            if server_round <= self.warmup_rounds:
                verdict += f"; warm-up (splits from round {self.warmup_rounds + 1})"
            elif not decision.split:
                verdict += f"; no split: {decision.refusal}"
            if not decision.split:
                groups[cluster] = trained
                verdicts.append(verdict)
                continue
            new_cluster = len(models)
            labels = np.asarray(decision.labels)
            self.splits.append(SplitRecord(
                cluster, new_cluster, models[cluster],
                np.stack([updates[labels == 0].mean(axis=0), updates[labels == 1].mean(axis=0)]),
            ))
            models.append(models[cluster])
            sides = list(zip(trained, decision.labels, strict=True))
            groups[cluster] = [m for m, side in sides if side == 0]
            groups[new_cluster] = [m for m, side in sides if side == 1]
            self._release_absent_members(cluster, trained)
            self.split_rounds.append(server_round)
            verdicts.append(f"{verdict}; " + self._split_text(
                decision, len(groups[cluster]), len(groups[new_cluster]), new_cluster))
        log(INFO, "CFL round %d gate: %s", server_round, " | ".join(verdicts))
        packed, metrics = self.aggregate_clusters(server_round, models, groups)
        # The largest norms over the clusters: the split test's inputs, for tuning eps1/eps2.
        metrics["mean-update-norm"] = float(max(mean_norms))
        metrics["max-update-norm"] = float(max(max_norms))
        return packed, metrics

    def _split_text(
        self, decision: CFLSplitDecision, stay: int, move: int, new_cluster: int
    ) -> str:
        """Why a cluster split, and into what, for the round's gate line."""
        structure = ("test off" if self.min_silhouette <= -1.0 else
                     f"{decision.structure_score:.3f} >= {self.min_silhouette:.3g}")
        return (f"cross similarity {decision.max_cross_similarity:.3f} < "
                f"{self.split_threshold:.3g}, group silhouette {structure}: SPLIT into "
                f"{stay} + {move} (new cluster {new_cluster})")

    def _gate(
        self, server_round: int, updates: np.ndarray, coherence: float | None = None
    ) -> tuple[bool, str]:
        """One cluster's norm test, and what it compared in words for the log.

        ``coherence`` is :func:`update_coherence` of ``updates`` when the caller has it.
        """
        mean_norm, max_norm = update_norms(updates)
        if self.gate == "absolute":
            is_open = bool(mean_norm < self.eps1 and max_norm > self.eps2)
            return is_open, (
                f"mean {mean_norm:.4g} {_below(mean_norm, self.eps1)} eps1 {self.eps1:.4g}, "
                f"max {max_norm:.4g} {_above(max_norm, self.eps2)} eps2 {self.eps2:.4g}: "
                f"gate {'open' if is_open else 'closed'}"
            )
        if server_round <= max(1, self.warmup_rounds):
            self.reference_norm = max(self.reference_norm, max_norm)
        if coherence is None:
            coherence = update_coherence(updates)
        is_open = coherence_split_gate(coherence, max_norm, self.reference_norm,
                                       self.mean_ratio, self.max_ratio)
        floor = self.max_ratio * self.reference_norm
        # The early norm is a reference only when max_ratio asks for one.
        reference = (f" {self.max_ratio:.3g} x early {self.reference_norm:.4g}"
                     if self.max_ratio > 0.0 else "")
        return is_open, (
            f"|mean|/avg norm {coherence:.3f} {_below(coherence, self.mean_ratio)} "
            f"{self.mean_ratio:.3g}, max {max_norm:.4g} {_above(max_norm, floor)}"
            f"{reference or ' 0'}: gate {'open' if is_open else 'closed'}"
        )

    def _release_absent_members(self, cluster: int, trained: list[Message]) -> None:
        """Forget the cluster of members that did not train in the round it split."""
        present = {m.metadata.src_node_id for m in trained}
        for node, assigned in list(self.assignments.items()):
            if assigned == cluster and node not in present:
                del self.assignments[node]
                log(INFO, "node %d missed the split of cluster %d: it will choose by loss",
                    node, cluster)

    def summary_fields(self) -> dict[str, Any]:
        """Rounds in which a cluster split, every cluster-round's gate, the clusters found."""
        return {
            "split_rounds": list(self.split_rounds),
            "reference_norm": self.reference_norm,
            "gate_history": list(self.gate_history),
            **super().summary_fields(),
        }

    def summary(self) -> None:
        """Log CFL's settings."""
        log(INFO, "\t├──> CFL: %s gate (mean ratio %.3g, max ratio %.3g | eps1=%.4g, eps2=%.4g) "
            "| split threshold=%.3g | min group silhouette=%.3g | warm-up %d rounds", self.gate,
            self.mean_ratio, self.max_ratio, self.eps1, self.eps2, self.split_threshold,
            self.min_silhouette, self.warmup_rounds)
        super().summary()
