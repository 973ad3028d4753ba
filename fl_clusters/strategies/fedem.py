"""FedEM: federated EM over M shared components (Marfoq et al., NeurIPS 2021)."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.drawing import random_like
from fl_clusters.strategies.kit import (
    FRACTION_TRAIN,
    NOT_GIVEN,
    Behaviour,
    CentresFromStart,
    KMeansStart,
    Param,
    RecipeValue,
    Scoring,
    average_packed_clusters,
    average_replies,
    num_clusters_param,
    num_examples,
    train_losses,
)


class FedEM(CentresFromStart):
    """FedEM, following Algorithm 1 of the paper (federated EM).

    Every client's data are modelled as a mixture of M shared components with
    client-specific weights ``pi_t``. Each round the sampled nodes receive all M
    components (packed under ``"clusters"``, config ``"mixture"``=true). A node
    runs the E-step on its training split, ``q_t(m, i)`` proportional to
    ``pi_tm exp(-loss(h_m; x_i, y_i))`` and ``pi_tm = mean_i q_t(m, i)`` (its pi
    is kept on the node, uniform at first), then the M-step: every component is
    trained locally on the loss weighted per sample by ``q_t(m, .)``. It replies
    with the M updated components and its pi. The server averages each
    component over the replies weighted by the nodes' training examples ``n_t``.
    Under ``preset="robust"`` two rules depart (``behaviours``): a node refits pi
    to the components it receives each round (``refit_mixture_weights``), and it
    divides component m's loss by ``max(pi_m, 1/M)`` while the server weighs its
    component m by ``n_t pi_tm`` (``full_step_m_step``): a component the node
    chooses gets its full local training, as FedAvg's model would.

    Evaluation sends every node all M components; the node scores its mixture
    ``p(y | x) = sum_m pi_tm p_m(y | x)`` on its test split (a node that never
    trained first fits pi to the components on its training split).
    ``assignments`` hold ``argmax pi`` of each node, the hard view used for
    cluster-recovery metrics.

    The paper starts the components as independent random draws
    (``init="random"``; M copies of one model would get equal responsibilities
    for every sample and never become different): component 0 is the plain
    ``initial_arrays`` as given (a freshly initialized model is such a draw; a
    pretrained one is kept), components 1..M-1 are drawn at its scale. Packed
    ``initial_arrays`` (M components) are used as they are. From random draws every
    component fits every source about equally, the first responsibilities carry
    no information, and the component that learns fastest can take every sample,
    which leaves FedEM as FedAvg. ``init="local-kmeans"`` (default)
    spends round 1 on a warm start, as IFCA's: every sampled node trains the
    initial model for ``init_steps`` local steps, k-means groups the nodes'
    output-layer updates into M groups, and component m starts as the
    example-weighted mean of group m's models; FedEM proper runs from round 2.
    """

    name = "fedem"
    paper = "Marfoq et al., NeurIPS 2021"
    no_inner_aggregation = ("every client counts in every component with its mixture "
                            "weight, which Flower's strategies cannot take")
    # 2: pi refitted every round (refit_mixture_weights) and full-size M-steps
    # (full_step_m_step).
    robust_revision = 2
    client_needs = "nothing more; fl-clusters trains the components (below)"
    params = (
        num_clusters_param(3, low=2,
                           doc="M, the number of shared components (the paper's default is 3), "
                           ">= 2."),  # M = 1 would be FedAvg
        Param("init", "local-kmeans", "str",
              "FedEM components: k-means of a warm-start round, or the paper's random draws",
              choices=("local-kmeans", "random"), paper="random",
              why="from M random components EM rarely separates groups that differ by a "
              "label permutation; a warm-start round's k-means starts each component inside "
              "a group (measured with both presets: docs/results.md)",
              source="Marfoq et al. 2021 (not among the seeds), Algorithm 1: M components "
              "randomly initialised",
              doc='How the M components start: ``"random"`` (the paper\'s independent draws) or '
              '``"local-kmeans"`` (a warm-start round, see above).'),
        Param("init_steps", 100, "int",
              "FedEM local-kmeans start: local SGD steps of the warm-start round", low=1,
              paper=NOT_GIVEN,
              why="the warm start is the library's (the paper starts from random draws); "
              "as for IFCA's, after ten steps from a common random start label-permuted "
              "groups are inseparable, after a hundred the output layer's updates part "
              "them (docs/clustering-defaults.md)",
              source="Marfoq et al. 2021 (not among the seeds), Algorithm 1: no warm start",
              doc="Local SGD steps of the warm-start round, >= 1."),
        FRACTION_TRAIN,
    )
    # The authors' README (github.com/omarfoq/FedEM), its CIFAR-10 FedEM command.
    recipe = (
        RecipeValue("optimizer", "plain SGD", "the authors' README: run_experiment.py "
                    "--optimizer sgd"),
        RecipeValue("lr", 0.03, "the authors' README: FedEM on CIFAR-10, --lr 0.03"),
        RecipeValue("batch-size", 128, "the authors' README: FedEM on CIFAR-10, --bz 128"),
        RecipeValue("num-rounds", 201, "the authors' README: FedEM on CIFAR-10, --n_rounds "
                    "201"),
        RecipeValue("lr-schedule", "multi-step", "the authors' README: --lr_scheduler "
                    "multi_step",
                    not_applied="each round's message sends one lr; no schedule changes it"),
    )
    behaviours = (
        Behaviour(
            "refit_mixture_weights",
            paper_rule="each round a node takes one E-step from the pi it kept: "
            "q(m, i) from pi and the components' losses, then pi = mean_i q(m, i)",
            robust_rule="each round a node refits pi to the components it received (E-steps "
            "from uniform until pi settles, at most 1000: the maximum-likelihood weights), "
            "then takes the responsibilities under that pi",
            why="components that start nearly equal (a warm start of few local steps) give "
            "per-sample losses a few hundredths apart, so one E-step a round leaves every "
            "responsibility near 1/M and no component takes a group within a run (Flower's "
            "quickstart with 1 local epoch: max_m q about 0.52 through 10 rounds); summed "
            "over all of a node's samples the same gaps decide its pi",
            source="Marfoq et al. 2021 (not among the seeds), Algorithm 1; the digest in "
            "ALGORITHMS.md: pi_tm = mean_i q_t(i, m), one E-step per round"),
        Behaviour(
            "full_step_m_step",
            paper_rule="component m's local loss is mean_i q(m, i) loss_m(i) and the server "
            "averages component m over the nodes weighted by their examples n_t",
            robust_rule="a node divides that loss by max(pi_m, 1/M) (the q-weighted mean "
            "for a component it explains at least as well as uniform) and the server "
            "averages component m weighted by n_t pi_tm, the examples the node gives it",
            why="under the paper's weighting a node's steps on a component scale with its "
            "pi, so with responsibilities near 1/M every component trains about M times "
            "slower than FedAvg's model and stays on the untrained plateau (Flower's "
            "quickstart with 1 local epoch); a component a node chooses now gets the "
            "node's full local training, and a node that hardly explains it barely moves it",
            source="Marfoq et al. 2021 (not among the seeds), Algorithm 1; the digest in "
            "ALGORITHMS.md: M-step on the loss weighted by q_t(., m), server average "
            "weighted by n_t"),
    )

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.mixture_weights: dict[int, np.ndarray] = {}

    def initialize(self, model: ArrayRecord, grid: Grid | None = None) -> ArrayRecord:
        """Pack ``model`` (the user's ``initial_arrays``) and M - 1 independent draws at its scale.

        The paper draws the M components independently; a freshly initialized
        ``model`` is one such draw, so keeping it as component 0 changes nothing
        there, and a user's pretrained model is not thrown away.
        """
        rng = np.random.default_rng(self.seed)
        return p.pack_clusters(
            [model, *(random_like(model, rng) for _ in range(self.num_clusters - 1))]
        )

    def _messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, fraction: float,
        grid: Grid, message_type: str,
    ) -> list[Message]:
        """Every M component to each sampled node (none when ``fraction`` is 0)."""
        node_config = self.round_config(config, server_round)
        node_config[p.CFG_MIXTURE] = True
        node_config[p.CFG_MIXTURE_REFIT] = self.refit_mixture_weights
        node_config[p.CFG_MIXTURE_FULL_STEPS] = self.full_step_m_step
        record = RecordDict({p.CLUSTERS: arrays, p.CONFIG: node_config})
        return self.broadcast(self.sampled(grid, fraction), record, message_type)

    # ----------------------------------------------------------------- training
    def configure_centres(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send all M components to the sampled nodes."""
        messages = self._messages(server_round, arrays, config, self.fraction_train, grid,
                                  MessageType.TRAIN)
        log(INFO, "configure_train: %d nodes train all %d components", len(messages),
            self.num_clusters)
        return messages

    def _mixture_problem(self, msg: Message) -> str | None:
        """Why a reply's pi cannot be used, or ``None`` when it can."""
        pi = msg.content.metric_records[p.METRICS].get(p.M_MIXTURE_WEIGHTS)
        values = np.asarray(pi if isinstance(pi, list) else [], dtype=np.float64)
        if (
            values.shape != (self.num_clusters,)
            or not np.all(np.isfinite(values))
            or np.any(values < 0)
            or not np.isclose(values.sum(), 1.0, atol=1e-3)
        ):
            return (
                f"'{p.M_MIXTURE_WEIGHTS}' must hold {self.num_clusters} non-negative "
                f"weights summing to 1, got {pi!r}"
            )
        return None

    def aggregate_centres(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Component m <- mean of the nodes' component m, weighted by their examples
        (times their pi_m under ``full_step_m_step``)."""
        valid = []
        for msg in self.check_replies(replies, self._current, "aggregate_train", trains=True):
            problem = self._mixture_problem(msg)
            if problem is not None:
                self.rejected_replies += 1
                log(WARNING, "aggregate_train: rejected reply from node %d: %s",
                    msg.metadata.src_node_id, problem)
                continue
            valid.append(msg)
        if not valid:
            return None, None
        for msg in valid:
            node = msg.metadata.src_node_id
            pi = np.asarray(msg.content.metric_records[p.METRICS][p.M_MIXTURE_WEIGHTS])
            self.mixture_weights[node] = pi
            self.assignments[node] = int(np.argmax(pi))
        losses = train_losses(valid)
        mean_pi = np.mean([self.mixture_weights[m.metadata.src_node_id] for m in valid], axis=0)
        log(INFO, "round %d: FedEM mean pi %s over %d nodes", server_round,
            mean_pi.round(3).tolist(), len(valid))
        metrics = MetricRecord(
            {
                p.M_TRAIN_LOSS: float(np.mean(losses)),
                "num-trained": len(valid),
                "mean-mixture-weights": mean_pi.tolist(),
            }
        )
        return self._average_components(valid), metrics

    def _average_components(self, valid: list[Message]) -> ArrayRecord:
        """Every component averaged over ``valid``: weighted by n_t, or by n_t pi_tm
        under ``full_step_m_step`` (n_t where no node gives a component any weight)."""
        if not self.full_step_m_step:
            # The packed components share keys, so one example-weighted mean averages
            # every component over the nodes at once.
            return average_replies(valid)
        examples = np.array([num_examples(msg) for msg in valid])
        pis = np.array([self.mixture_weights[msg.metadata.src_node_id] for msg in valid])
        weights = examples[:, None] * pis
        unclaimed = weights.sum(axis=0) <= 0
        weights[:, unclaimed] = examples[:, None]
        return average_packed_clusters(valid, weights)

    # --------------------------------------------------------------- warm start
    def centres_from_groups(
        self, server_round: int, start: KMeansStart
    ) -> tuple[ArrayRecord, MetricRecord]:
        """Component m <- the example-weighted mean of group m's models."""
        rng = np.random.default_rng(self.seed)
        # A group k-means left empty (identical updates) starts from a random draw.
        components = [average_replies(group) if group else random_like(start.model, rng)
                      for group in start.members()]
        metrics = MetricRecord(
            {p.M_TRAIN_LOSS: float(np.mean(train_losses(start.replies))),
             "num-trained": len(start.replies), "warm-start-group-sizes": start.sizes()}
        )
        return p.pack_clusters(components), metrics

    # --------------------------------------------------------------- evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send all M components; each node scores its own mixture on its test split."""
        return self._messages(server_round, arrays, config,
                              self.evaluated_share(server_round, self.fraction_evaluate), grid,
                              MessageType.EVALUATE)

    def summary_fields(self) -> dict[str, Any]:
        """M, the start, warm-start groups, pi per node and FedEM's own clustering.

        ``mixture_clusters`` is the hard clustering FedEM itself arrives at, argmax
        pi per node (from its last training round), beside the warm start's
        k-means ``warm_start_groups``.
        """
        return {
            "num_clusters": self.num_clusters,
            "init": self.init,
            "warm_start_groups": {
                str(node): group for node, group in sorted(self.warm_start_groups.items())
            },
            "mixture_weights": {
                str(node): pi.tolist() for node, pi in sorted(self.mixture_weights.items())
            },
            "mixture_clusters": {
                str(node): int(np.argmax(pi)) for node, pi in sorted(self.mixture_weights.items())
            },
        }

    def scoring(self) -> Scoring:
        """pi per node, the warm start's groups and argmax pi; nodes report their mixture."""
        fields = self.summary_fields()
        return Scoring(
            soft_weights=fields["mixture_weights"],
            labellings={"warm_start_ari": fields["warm_start_groups"],
                        "mixture_ari": fields["mixture_clusters"]},
            report_mixture=True,
        )

    def summary(self) -> None:
        """Log FedEM's settings."""
        log(INFO, "\t├──> FedEM: M=%d components | init=%s (%d steps)", self.num_clusters,
            self.init, self.init_steps)
        super().summary()
