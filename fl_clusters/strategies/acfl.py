"""ACFL: adaptive clustering federated learning by similarity acceleration (Zhu, Gu, Sun 2024)."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    INCENTIVE_THRESHOLDS,
    GreedyIncentiveClustering,
    levelled_off_gate,
    norm_threshold_gate,
    pairwise_cosine,
    update_norms,
)
from fl_clusters.errors import ConfigurationError
from fl_clusters.strategies.kit import (
    NOT_GIVEN,
    Behaviour,
    HardClusteredStrategy,
    Param,
    RecipeValue,
    TrialFederations,
    average_replies,
    reply_updates,
)

# The paper's text, as the sources below cite it (docs/paper-fidelity.md).
SEED_TEXT = "Zhu et al. 2024 (seed 003)"
ACFL_NORM_RANGES = (f"{SEED_TEXT}, section 4.4: the mean and the largest update norm must "
                    "fall 'within specific hyper-parameter ranges'; none is given")


class ACFL(HardClusteredStrategy, TrialFederations):
    """ACFL: FedAvg, then one similarity-ordered greedy clustering, then FedAvg per cluster.

    Phase 1 runs FedAvg over all nodes until the clients' update norms show
    convergence (``gate``) or ``phase1_rounds`` rounds have run, so the
    clustering sees a trained FedAvg model, as in the paper. Phase 2, at the start
    of the next round, clusters once: the cosine similarities of the last phase-1
    updates order the candidates, and
    :class:`~fl_clusters.clustering.GreedyIncentiveClustering` grows each cluster
    from a seeded start client, admitting a candidate when a trial federation of
    the cluster plus the candidate passes ``incentive_threshold``. Phase 3 is
    FedAvg inside each cluster, from the members' averaged local-only models.

    Each node trains its local-only model once (``trial_epochs`` epochs from the
    phase-1 model) and scores it on its validation split. A node whose train
    handler trains fewer epochs a message than asked (an app's own ``train()``
    reads its run config's ``local-epochs``) and reports them
    (``local-epochs-done``) is asked again from its own model until it has
    trained ``trial_epochs``: with 1 epoch a message, one pass left the models
    untrained and every trial admitted its candidate. When every node ends in
    one cluster, a warning names the smallest incentive margin, the local-only
    models' accuracy and what to change. A trial reuses these
    models: their example-weighted average is scored on each member's validation
    split, with no training. Under ``preset="paper"`` a trial is the paper's
    federation (eq. 8): the cluster plus the candidate each train the phase-1
    model for ``trial_epochs`` epochs, and their average is scored (see
    ``behaviours``). A member with no valid score is asked once more, then
    left out of the incentive (gain 0), never scored 0. The summary counts phase
    2's cost (``trial_messages``, ``trial_train_messages``,
    ``trial_failed_members``) and says whether phase 1 ended (``phase1_ended``).
    """

    name = "acfl"
    paper_revision = 2
    paper = "Zhu et al., J. on Communications 2024"
    client_needs = ("`loaders` returning `(train, validation, test)`; `phase1_rounds` below "
                    "the run's rounds (below)")
    params = (
        Param("beta", -0.17, "float",
              "ACFL incentive threshold of acfl-incentive-threshold=beta (the paper)",
              doc='Incentive threshold of ``incentive_threshold="beta"`` (the paper\'s best '
              "value)."),
        Param("max_rejections", 3, "int", "ACFL: close a cluster after m misses", low=1,
              paper=NOT_GIVEN, source=f"{SEED_TEXT}, section 4.2 (Algorithm 1, steps 6 and 9): m "
              "changes with the unplaced clients 'within a range'; no value is given",
              why="three misses in a row end a walk down a similarity-sorted list, where "
              "the members of the open cluster come first",
              doc="Largest number ``m`` of consecutive rejections that closes a cluster; it "
              "shrinks with the number of unplaced nodes."),
        Param("gate", "relative", "str",
              "ACFL phase 1 end: mean norm stops changing, or absolute norm thresholds",
              choices=("relative", "absolute"), paper="absolute",
              why="the absolute thresholds ended phase 1 at round 2, from a random model's "
              "first updates; the relative gate waits until the mean update norm levels off "
              "(a trained FedAvg model, as the paper intends)",
              source=f"{SEED_TEXT}, section 4.4: phase 1 ends when the mean and the largest "
              "update norm fall in set ranges",
              doc='``"relative"`` (norms level off) or ``"absolute"`` (the two thresholds).'),
        Param("converge_window", 2, "int",
              "ACFL relative gate: rounds averaged on each side of the comparison", low=1,
              doc="Relative gate: rounds averaged on each side of the comparison, >= 1."),
        Param("converge_tolerance", 0.1, "float",
              "ACFL relative gate: converged when the mean norm changes by less than this",
              above=0.0, below=1.0,
              doc="Relative gate: largest relative change of the windowed mean norm, in (0, 1)."),
        Param("mean_norm_max", 0.4, "float", "ACFL phase 1: mean norm below", low=0.0,
              paper=NOT_GIVEN, source=ACFL_NORM_RANGES,
              why="it is CFL's eps1 from its authors' demo, the same test on the mean "
              "update norm",
              doc="Absolute gate: phase 1 ends once the mean update norm is below this, >= 0 ..."),
        Param("max_norm_min", 0.0, "float", "ACFL phase 1: max norm above", low=0.0,
              paper=NOT_GIVEN, source=ACFL_NORM_RANGES,
              why="0 leaves the decision to the mean norm: any client still moving passes",
              doc="... and the largest client update norm is above this, >= 0."),
        Param("phase1_rounds", 10, "int", "ACFL phase 1 round budget", low=1,
              paper=NOT_GIVEN, source=f"{SEED_TEXT}, sections 4.4 and 5.3: no cap "
              "on phase 1; its runs clustered at round 40 (figure 5)",
              why="the bundled runs are 10-20 rounds: a gate that never opened would leave "
              "them plain FedAvg",
              doc="Phase 1 ends after this many rounds whatever the norms, >= 1 (the paper "
              "clusters at round 40 of 100-round runs; the bundled runs are 10-20 rounds). "
              "At or above the run's rounds the start refuses, naming one that fits: unless "
              "the norms level off, phase 1 would never end and the run would be plain "
              "FedAvg."),
        Param("trial_epochs", 60, "int", "ACFL trial federation local epochs", low=1,
              paper=15, source=f"{SEED_TEXT}, section 5.1: 15 local epochs, "
              "batch 128, lr 0.1",
              why="small clients need many: 60 epochs of ~63 samples are 120 SGD steps, "
              "where the paper's ~3,000 samples a client make 15 epochs ~350 steps",
              doc="Local epochs of a trial federation (and of the local-only models), >= 1. "
              "Small clients need many: 60 epochs of ~63 samples are 120 SGD steps (the "
              "paper's clients train 15). A handler that trains fewer a message is asked "
              "again (at most ``trial_epochs`` messages a node)."),
        Param("incentive_threshold", "noise", "str",
              "ACFL: a candidate joins when the incentive and the candidate's own gain are "
              "each >= -acfl-noise-z standard errors (noise), or when the incentive is >= "
              "acfl-beta (beta, the paper)", choices=INCENTIVE_THRESHOLDS, paper="beta",
              why="a fixed beta on summed accuracy admits a newcomer that federating harms "
              "when its hosts gain a little each; the noise rule asks the incentive and the "
              "newcomer's own gain to be within the noise of the validation accuracies",
              source=f"{SEED_TEXT}, section 4.2, eq. 8 (beta_best = -0.17)",
              doc='``"beta"``: a candidate joins when the trial group\'s incentive is at least '
              '``beta`` (the paper). ``"noise"``: when it is at least ``-noise_z`` standard '
              "errors of the incentive, computed from the members' accuracies and validation "
              "sizes (:func:`~fl_clusters.clustering.incentive_standard_error`), and the "
              "candidate's own gain is at least ``-noise_z`` standard errors of that gain (a "
              "newcomer that loses by joining is not admitted because the members gain a "
              "little each). A fixed ``beta`` is in units of summed accuracy, whose noise "
              "grows as the validation splits shrink (the paper has ~3,000 MNIST samples per "
              "client; docs/clustering-defaults.md)."),
        Param("noise_z", 2.0, "float",
              "ACFL noise threshold: tolerance in standard errors of the incentive", low=0.0,
              doc='Tolerance of ``incentive_threshold="noise"`` in standard errors, >= 0.'),
    )
    behaviours = (
        Behaviour(
            "trial_from_local_models",
            paper_rule="each trial is a federation of the cluster plus the candidate: every "
            "member trains the phase-1 model for trial_epochs local epochs, the server "
            "averages their models, and each member scores the average (eq. 8); the paper "
            "does not say how many rounds a trial runs: one here",
            robust_rule="a trial averages the members' local-only models (trained once per "
            "node, trial_epochs epochs from the phase-1 model) and scores that average: no "
            "training per trial",
            why="one round of the group from the phase-1 model is that average up to the "
            "clients' batch sampling, reached with one train message per node instead of "
            "one per member per trial",
            source=f"{SEED_TEXT}, section 4.2, eq. 8 and Algorithm 1 step 4"),
        Behaviour(
            "trial_scores_on_validation",
            paper_rule="a trial is scored on each member's local test set",
            robust_rule="a trial is scored on each member's validation split", switch=False,
            why="a cluster chosen by test accuracy would leak the test labels into the "
            "model each client is scored with",
            source=f"{SEED_TEXT}, section 4.2 (eval_glo: accuracy on the local test set)"),
        Behaviour(
            "rejection_schedule", paper_rule="",
            robust_rule="m = max(1, ceil(max_rejections x U / N)), U the clients unplaced "
            "outside the open cluster: m starts at max_rejections and shrinks as clients "
            "are placed",
            why="the paper says only that m changes with the unplaced clients within a "
            "range; a share of max_rejections proportional to them shortens the walk once "
            "few remain",
            source=f"{SEED_TEXT}, section 4.2 (Algorithm 1 step 6)"),
        Behaviour(
            "phase3_start", paper_rule="",
            robust_rule="each cluster's phase-3 model starts as its members' averaged "
            "local-only models",
            why="those models were trained on the cluster's own data: a closer start than "
            "the phase-1 model",
            source=f"{SEED_TEXT}, section 4.4 (Algorithm 2 step 12: FedAvg inside each "
            "cluster; its start is not given)"),
    )
    recipe = (
        RecipeValue("optimizer", "plain SGD", f"{SEED_TEXT}, section 2.1, eq. 1: SGD(D_t, "
                    "D_k)"),
        RecipeValue("lr", 0.1, f"{SEED_TEXT}, section 5.1: learning rate 0.1"),
        RecipeValue("local-epochs", 15, f"{SEED_TEXT}, section 5.1: 15 local epochs a "
                    "round"),
        RecipeValue("local-steps", 0, f"{SEED_TEXT}, section 5.1: local training is counted "
                    "in epochs (15), so no step count caps it"),
        RecipeValue("batch-size", 128, f"{SEED_TEXT}, section 5.1: batch_size 128"),
        RecipeValue("fraction-train", 1.0, f"{SEED_TEXT}, section 5.3 (2): every client "
                    "takes part in every round"),
    )

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.clustering_round: int | None = None
        self.trial_evaluations = 0
        self.trial_messages = 0
        self.trial_train_messages = 0
        self.trial_failed_members = 0
        self._clustering_due = False
        self._validation_sizes: dict[int, float] = {}
        self._last_nodes: list[int] = []
        self._last_updates = np.zeros((0, 0), dtype=np.float32)
        self._phase1_norms: list[float] = []
        # Each trial's incentive minus its threshold: what admitted every candidate.
        self._trial_margins: list[float] = []
        # For nodes that join after phase 2: the last phase-1 start and each
        # cluster's mean phase-1 update.
        self._direction_start = ArrayRecord()
        self._directions: np.ndarray | None = None
        self._trial_start = ArrayRecord()
        self._trial_config = ConfigRecord()

    # ----------------------------------------------------------------- training
    def prepare(self, grid: Grid, timeout: float, num_rounds: int) -> None:
        """Refuse a phase 1 round budget the run cannot reach; the shared start-up.

        Raises
        ------
        ConfigurationError
            If ``phase1_rounds`` is not below ``num_rounds``: unless the update norms
            level off, phase 1 would never end and the run would be plain FedAvg.
        """
        if self.phase1_rounds >= num_rounds:
            fits = max(1, num_rounds // 3)
            raise ConfigurationError(
                f"ACFL: phase1_rounds={self.phase1_rounds} is not below the run's {num_rounds} "
                "rounds: unless the update norms level off, phase 1 never ends and the run "
                f"is plain FedAvg. Fix: pass e.g. ACFL(phase1_rounds={fits}) (run-config "
                f"acfl-phase1-rounds={fits}), or run more than {self.phase1_rounds} rounds"
            )
        super().prepare(grid, timeout, num_rounds)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Cluster first when phase 1 just ended; then send each node its cluster's model."""
        if self._clustering_due:
            self._clustering_due = False
            arrays = self.cluster(server_round, p.unpack_clusters(arrays)[0], config, grid)
            self.clustering_round = server_round
        return super().configure_train(server_round, arrays, config, grid)

    def place_newcomers(
        self, server_round: int, nodes: list[int], config: ConfigRecord, grid: Grid
    ) -> None:
        """After phase 2, by the similarity ACFL clustered on.

        A node's update from the last phase-1 start is compared with each cluster's
        mean phase-1 update.
        """
        if self._directions is not None:
            self.place_by_update(server_round, nodes, self._direction_start,
                                 self._directions, config, grid)

    def aggregate_members(
        self, server_round: int, members: dict[int, list[Message]]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average per cluster; in phase 1, also check the update norms for convergence."""
        packed, metrics = self.aggregate_clusters(server_round, self._models, members)
        if self.clustering_round is None:
            # Node order, not reply order, so that the seeded start client is reproducible.
            trained = sorted(members[0], key=lambda m: self.node_order(m.metadata.src_node_id))
            updates = reply_updates(trained, self._models[0])
            mean_norm, max_norm = update_norms(updates)
            self._last_nodes = [m.metadata.src_node_id for m in trained]
            self._last_updates = updates
            self._direction_start = self._models[0]
            self._phase1_norms.append(mean_norm)
            converged, gate_text = self._phase1_gate(mean_norm, max_norm)
            self._clustering_due = converged or server_round >= self.phase1_rounds
            outcome = (
                "converged: clustering next round" if converged
                else f"phase 1 ends at round {self.phase1_rounds}: clustering next round"
                if self._clustering_due
                else f"not converged: phase 1 goes on (at most to round {self.phase1_rounds})"
            )
            log(INFO, "ACFL round %d gate: %s; %s", server_round, gate_text, outcome)
            metrics["mean-update-norm"] = mean_norm
            metrics["max-update-norm"] = max_norm
        return packed, metrics

    def _phase1_gate(self, mean_norm: float, max_norm: float) -> tuple[bool, str]:
        """Whether phase 1 converged this round, and what the test compared in words."""
        if self.gate == "absolute":
            return norm_threshold_gate(mean_norm, max_norm, self.mean_norm_max,
                                       self.max_norm_min)
        return levelled_off_gate(self._phase1_norms, self.converge_window,
                                 self.converge_tolerance)

    # ------------------------------------------------------------------ phase 2
    def cluster(
        self, server_round: int, model: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> ArrayRecord:
        """Phase 2: greedy incentive clustering of the last phase-1 round's nodes.

        Parameters
        ----------
        server_round : int
            The round that starts with this clustering.
        model : ArrayRecord
            The phase-1 (FedAvg) model every trial starts from.
        config : ConfigRecord
            The round's train config; the trials use ``trial_epochs`` epochs.
        grid : Grid
            Where the trial messages go.

        Returns
        -------
        ArrayRecord
            The packed cluster models: each cluster's average of its members'
            trial-trained models.
        """
        trial_config = self.round_config(config, server_round)
        trial_config[p.CFG_EPOCHS] = self.trial_epochs
        trial_config[p.CFG_STEPS] = 0
        # Local-only models and their validation accuracy, once per node.
        local_models, local_acc = self.local_only_models(self._last_nodes, model, trial_config,
                                                         grid)
        nodes = [n for n in self._last_nodes if n in local_acc]
        if not nodes:
            log(WARNING, "round %d: ACFL: no node answered the local-only round; "
                "keeping one cluster", server_round)
            return p.pack_clusters([model])
        rows = [self._last_nodes.index(n) for n in nodes]
        clustering = GreedyIncentiveClustering(
            pairwise_cosine(self._last_updates[rows]),
            beta=self.beta,
            max_rejections=self.max_rejections,
            seed=self.seed,
            threshold=self.incentive_threshold,
            noise_z=self.noise_z,
        )
        self.run_trials(clustering, nodes, local_models, local_acc, grid)
        models = self._adopt_clusters(clustering.labels_, clustering.num_clusters_, nodes,
                                      rows, local_models)
        log(INFO, "round %d: ACFL placed %d nodes in %d clusters of sizes %s after %d trial "
            "federations", server_round, len(nodes), clustering.num_clusters_,
            np.bincount(clustering.labels_).tolist(), self.trial_evaluations)
        if clustering.num_clusters_ == 1 and len(nodes) > 1:
            self._warn_one_cluster(server_round, [local_acc[n] for n in nodes])
        return p.pack_clusters(self.mix_clusters(models))

    def _warn_one_cluster(self, server_round: int, local_acc: list[float]) -> None:
        """Say that every trial admitted its candidate, by what margin, and what to change."""
        margin = min(self._trial_margins) if self._trial_margins else float("nan")
        log(WARNING, "round %d: ACFL placed all %d nodes in ONE cluster: every trial's "
            "incentive reached its threshold (smallest margin %.3g), with local-only models "
            "of mean validation accuracy %.3g after trial_epochs=%d epochs. If the nodes' "
            "data differ, those models are too weak to show what federating costs: raise "
            "'acfl-trial-epochs' or the phase 1 rounds ('acfl-phase1-rounds'), or train more "
            "local epochs a round", server_round, len(local_acc), margin,
            float(np.mean(local_acc)), self.trial_epochs)

    def _adopt_clusters(
        self,
        labels: np.ndarray,
        num_clusters: int,
        nodes: list[int],
        rows: list[int],
        local_models: dict[int, Message],
    ) -> list[ArrayRecord]:
        """Assign the clustered nodes; each cluster's model is its members' local-only mean."""
        # Nodes left out (absent from the last phase-1 round, or silent in the
        # local-only round) get no cluster: they choose among all by training loss.
        self.assignments.clear()
        models = []
        for cluster in range(num_clusters):
            cluster_nodes = [nodes[i] for i in np.flatnonzero(labels == cluster)]
            models.append(average_replies([local_models[n] for n in cluster_nodes]))
            for node in cluster_nodes:
                self.assignments[node] = cluster
        # Each cluster's mean phase-1 update: what a later newcomer is compared with.
        self._directions = np.stack([
            self._last_updates[np.asarray(rows)[labels == cluster]].mean(axis=0)
            for cluster in range(num_clusters)
        ])
        return models

    # ------------------------------------------------------------------ summary
    def similarity_matrix(self) -> tuple[list[int], np.ndarray] | None:
        """Cosine similarity of the phase-1 updates ACFL clustered (or last saw)."""
        if not self._last_nodes:
            return None
        return list(self._last_nodes), pairwise_cosine(self._last_updates)

    def summary_fields(self) -> dict[str, Any]:
        """Trial cost of the clustering, the round it happened, clusters found.

        ``trial_messages`` counts phase 2's evaluate messages (local-only scores and
        trials), ``trial_train_messages`` its train messages (one local-only model
        per node, ``trial_epochs`` epochs each; under the paper's trial rule also
        one per member of every trial).
        """
        if self.clustering_round is None:
            log(WARNING, "ACFL: phase 1 never ended (no convergence within the run's "
                "rounds and phase1_rounds=%d not reached): the run was plain FedAvg; "
                "lower 'acfl-phase1-rounds' or run more rounds", self.phase1_rounds)
        return {
            "trial_evaluations": self.trial_evaluations,
            "trial_messages": self.trial_messages,
            "trial_train_messages": self.trial_train_messages,
            "trial_failed_members": self.trial_failed_members,
            "phase1_ended": self.clustering_round is not None,
            "clustering_round": self.clustering_round,
            **super().summary_fields(),
        }

    def summary(self) -> None:
        """Log ACFL's settings."""
        joins = (f"incentive >= beta={self.beta:.3g}" if self.incentive_threshold == "beta"
                 else f"incentive >= -{self.noise_z:.3g} standard errors")
        log(INFO, "\t├──> ACFL: %s | m=%d | phase 1: %s gate (window %d, tolerance "
            "%.3g | mean norm < %.4g, max norm > %.4g), at most %d rounds | local-only models: "
            "%d epochs (a node whose handler trains fewer a message is asked again)",
            joins, self.max_rejections, self.gate, self.converge_window,
            self.converge_tolerance, self.mean_norm_max, self.max_norm_min, self.phase1_rounds,
            self.trial_epochs)
        super().summary()
