"""The clustered base strategies that every fl-clusters algorithm builds on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import INFO
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fl_clusters import protocol as p
from fl_clusters.handshake import NodeIdentities, NodeRegistry
from fl_clusters.placement_regret import warn_if_clustering_broke
from fl_clusters.strategies.kit.evaluation import (
    EvaluateFn,
    cluster_accuracy,
    clusters_used,
    evaluate_content,
    mean_metrics,
    per_cluster_evaluate,
)
from fl_clusters.strategies.kit.interface import ClusterFeatureSource, RoundHistory, ServerStrategy
from fl_clusters.strategies.kit.presets import Declared
from fl_clusters.strategies.kit.replies import count_failed_round, validate_replies
from fl_clusters.strategies.kit.shared_params import (
    FRACTION_EVALUATE,
    FRACTION_TRAIN,
    MAX_FAILED_ROUNDS,
    MIN_AVAILABLE_NODES,
    PRESET,
    SEED,
)


class ClusteredStrategy(ServerStrategy, Declared):
    """Base of the clustered strategies: k cluster models in one packed ArrayRecord.

    The ArrayRecord that ``Strategy.start`` passes from ``aggregate_train`` to the
    next ``configure_train`` holds every cluster model under ``cluster-<j>/`` keys
    (see :mod:`fl_clusters.protocol`), so ``result.arrays`` returns them all and the
    strategy runs from any ServerApp exactly like FedAvg. The base tracks which
    cluster each node belongs to, samples nodes reproducibly, rejects (logs and
    skips) error replies and replies with NaN/Inf or wrong shapes, and evaluates
    each node with the model it would use. AWCFL and MCFL are options composed
    into the strategies that offer them
    (:class:`~fl_clusters.strategies.kit.options.awcfl.AWCFLOption`,
    :class:`~fl_clusters.strategies.kit.options.mcfl.MCFLOption`).
    """

    paper = "base class of the strategies above"
    # What a client built on ClusteredClient needs beyond its two wrapped handlers
    # (docs/plugin.md's table).
    client_needs: ClassVar[str] = "nothing more"
    params = (PRESET, FRACTION_EVALUATE, MIN_AVAILABLE_NODES, MAX_FAILED_ROUNDS, SEED)
    # Why the strategy has no inner aggregation (InnerAggregationOption), for the
    # run config's refusal of the inner-aggregation keys.
    no_inner_aggregation: ClassVar[str] = "it does not aggregate clusters with a mean"
    # Every strategy with a name, by name: what a run config can build.
    registry: ClassVar[dict[str, type[ClusteredStrategy]]] = {}

    def __init__(self, **arguments: Any) -> None:
        # Every declared argument is checked and set here, from the call's
        # arguments that each subclass's __init__ passes on; fraction_train also
        # in strategies that do not take it, since the base's methods read it.
        self.init_params(arguments, defaults=(FRACTION_TRAIN,))
        # Set by the registry when the run config built the strategy: error
        # messages then name run-config keys instead of constructor arguments.
        self.from_run_config = False
        self.failed_rounds = 0
        self.round_timeout = 3600.0
        self.rng = np.random.default_rng(self.seed)
        self.assignments: dict[int, int] = {}
        # Simulated node ids are random per run; ordering by the nodes' stable keys is
        # what makes sampling and aggregation order, hence results, repeat.
        self.nodes = NodeRegistry()
        self.rejected_replies = 0
        # Per evaluation round: the cluster each evaluated node used, and each
        # cluster's example-weighted accuracy (for the run's plots and summary).
        self.assignment_history: dict[int, dict[int, int]] = {}
        self.cluster_accuracy_history: dict[int, dict[int, float]] = {}
        # The cluster models the last evaluate messages offered: an evaluate reply's
        # cluster-id must name one of them.
        self.evaluated_models = 1

    # ------------------------------------------------------------------ helpers
    def assignment_for(self, node_id: int) -> int | None:
        """Cluster of ``node_id`` decided by the server, or ``None`` if the node decides."""
        return self.assignments.get(node_id)

    def adopt_identities(self, identities: NodeIdentities) -> None:
        """Keep the handshake's keys; its malformed replies count as rejected."""
        self.nodes.adopt(identities)
        self.rejected_replies += len(identities.problems)

    def round_clusters(self, server_round: int) -> tuple[dict[int, int] | None, int]:
        """The clusters the evaluated nodes used, else the assignments' count."""
        used = self.assignment_history.get(server_round)
        num_clusters = len(set(used.values())) if used else len(set(
            self.assignments.values())) or 1
        return used, num_clusters

    def round_history(self) -> RoundHistory | None:
        """Every evaluated round's clusters used and their accuracy."""
        return self.assignment_history, self.cluster_accuracy_history

    def node_order(self, node: int) -> tuple[int, int, int]:
        """Sort key of a node (:meth:`~fl_clusters.handshake.NodeRegistry.order`)."""
        return self.nodes.order(node)

    def learn_node_keys(self, grid: Grid, nodes: Iterable[int]) -> None:
        """Ask the nodes not seen before for their stable key (``query.identity``).

        See :meth:`~fl_clusters.handshake.NodeRegistry.learn`; the round timeout
        bounds the wait, and malformed replies count as rejected.
        """
        self.rejected_replies += self.nodes.learn(grid, nodes, self.round_timeout)

    def sample(self, grid: Grid, fraction: float) -> list[int]:
        """Sample ``fraction`` of the connected nodes (at least one), reproducibly.

        See :meth:`~fl_clusters.handshake.NodeRegistry.sample`; once the handshake
        ran, a node not seen before is asked for its key first.
        """
        _, all_nodes = sample_nodes(grid, self.min_available_nodes, 0)
        if self.nodes.started:
            self.learn_node_keys(grid, all_nodes)
            self.meet_nodes(grid, all_nodes)
        return self.nodes.sample(all_nodes, fraction, self.rng)

    @staticmethod
    def build_messages(
        contents: dict[int, RecordDict], message_type: str
    ) -> list[Message]:
        """One message per node, each with its own content."""
        return [
            Message(content=content, dst_node_id=node, message_type=message_type)
            for node, content in contents.items()
        ]

    @staticmethod
    def round_config(config: ConfigRecord, server_round: int) -> ConfigRecord:
        """A node's own copy of the round's ``config``, with the round number in it."""
        node_config = ConfigRecord(dict(config))
        node_config[p.CFG_ROUND] = server_round
        return node_config

    def sampled(self, grid: Grid, fraction: float) -> list[int]:
        """:meth:`sample`, or no node at all when ``fraction`` is 0 (the stage is off)."""
        return self.sample(grid, fraction) if fraction > 0.0 else []

    def broadcast(
        self, nodes: Iterable[int], record: RecordDict, message_type: str
    ) -> list[Message]:
        """One message per node, all with the same content."""
        return self.build_messages(dict.fromkeys(nodes, record), message_type)

    def check_replies(
        self,
        replies: Iterable[Message],
        reference: ArrayRecord | None,
        stage: str,
        fields: Mapping[str, p.MetricField] | None = None,
        *,
        trains: bool,
    ) -> list[Message]:
        """Keep the replies that can be used, in node order; log every one that cannot.

        ``replies``, ``reference``, ``stage`` and ``fields`` are those of
        :func:`~fl_clusters.strategies.kit.replies.validate_replies`; ``fields=None``
        means ``train-loss`` when ``trains`` and nothing otherwise.

        Parameters
        ----------
        trains : bool
            Whether these are the replies of a round's training: a training round
            without one valid reply counts towards ``max_failed_rounds``
            (:func:`~fl_clusters.strategies.kit.replies.count_failed_round`); a
            query's (an estimate, a placement, a trial) never does.
        """
        if fields is None:
            fields = p.TRAIN_FIELDS if trains else {}
        valid, reasons = validate_replies(replies, reference, stage, fields, self.nodes.describe,
                                          self.nodes.claim_problem)
        self.rejected_replies += len(reasons)
        # Replies arrive in any order; a fixed order makes every sum (and result) repeat.
        valid.sort(key=lambda m: self.node_order(m.metadata.src_node_id))
        if trains:
            limit = ("run-config key 'max-failed-rounds'" if self.from_run_config
                     else f"the constructor argument max_failed_rounds={self.max_failed_rounds}")
            self.failed_rounds = count_failed_round(
                self.failed_rounds, self.max_failed_rounds, limit, stage, bool(valid), reasons
            )
        return valid

    def meet_nodes(self, grid: Grid, nodes: list[int]) -> None:
        """Hook: the connected ``nodes``, once their keys are known; nothing by default.

        Called at the start and whenever nodes are sampled, so an option that asks
        every node for something once (MCFL's features) reaches late joiners too.
        """

    # ---------------------------------------------------------------------- run
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        *args: Any,
        evaluate_fn: EvaluateFn | None = None,
        **kwargs: Any,
    ) -> Result:
        """Run ``Strategy.start`` after a start-up handshake (:meth:`prepare`).

        Round ``num_rounds`` evaluates every node (:meth:`evaluated_share`).

        The handshake learns every node's stable key (:meth:`learn_node_keys`);
        nodes that join later are asked when they are first sampled.

        A centralized ``evaluate_fn`` written for FedAvg (one model in, one
        MetricRecord out) is called once per cluster model, see
        :func:`per_cluster_evaluate`. The ``timeout`` passed here also bounds every
        strategy-internal send (:meth:`send`), so a node that stalls cannot hold a
        query forever.
        """
        self.prepare(grid, float(kwargs.get("timeout", self.round_timeout)), num_rounds)
        if evaluate_fn is not None:
            evaluate_fn = per_cluster_evaluate(evaluate_fn)
        return super().start(grid, initial_arrays, num_rounds, *args, evaluate_fn=evaluate_fn,
                             **kwargs)

    def prepare(self, grid: Grid, timeout: float, num_rounds: int) -> None:
        """The handshake, then :meth:`meet_nodes`; ``timeout`` bounds every send.

        Nodes already known (a resumed run, :mod:`fl_clusters.checkpoint`) are not
        asked again.
        """
        self.round_timeout = timeout
        self.final_round = num_rounds
        self.nodes.started = True
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        self.learn_node_keys(grid, nodes)
        self.meet_nodes(grid, nodes)

    def send(self, grid: Grid, messages: Iterable[Message]) -> list[Message]:
        """Send strategy-internal ``messages``; the replies that came within the round timeout.

        Replies that arrive later are dropped by the grid.
        """
        return list(grid.send_and_receive(messages, timeout=self.round_timeout))

    def train_once(
        self, nodes: Iterable[int], start: ArrayRecord, config: ConfigRecord, grid: Grid,
        stage: str,
    ) -> list[Message]:
        """Have ``nodes`` each train ``start`` once with ``config``; the usable replies.

        A strategy-internal training (placing a node that joined late), bounded by
        the round timeout like every other query. It is a query, not a round's
        training: nodes that fail it do not count towards ``max_failed_rounds``.
        """
        record = RecordDict({p.ARRAYS: start, p.CONFIG: config})
        replies = self.send(grid, self.broadcast(nodes, record, MessageType.TRAIN))
        return self.check_replies(replies, start, stage, trains=False)

    def mcfl_test_samples(self) -> int | None:
        """None: a node choosing by MCFL's features averages all its test inputs."""
        return None

    # --------------------------------------------------------------- evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluate each sampled node with the model it would use.

        ``fraction_evaluate`` of the nodes, every node in the last round
        (:meth:`evaluated_share`). A node with a server-side assignment receives its
        cluster's model; any other node receives every cluster model and picks by its
        training loss. Under MCFL every node receives every cluster model and the
        clusters' features, and picks the cluster whose feature is nearest to the
        mean of its test inputs (:func:`~fl_clusters.strategies.kit.evaluation.evaluate_content`).
        """
        fraction = self.evaluated_share(server_round, self.fraction_evaluate)
        if fraction == 0.0:
            return []
        models = p.unpack_clusters(arrays)
        self.evaluated_models = len(models)
        features = (self.mcfl_cluster_features(len(models))
                    if len(models) > 1 and isinstance(self, ClusterFeatureSource) else None)
        contents = {
            node: evaluate_content(arrays, models, self.round_config(config, server_round),
                                   self.assignment_for(node), features,
                                   self.mcfl_test_samples())
            for node in self.sample(grid, fraction)
        }
        return self.build_messages(contents, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Example-weighted mean of the nodes' accuracy and loss on their test splits.

        Also keeps, for the run's plots and summary, which cluster each evaluated
        node used and each cluster's accuracy, and warns when this round's clusters
        undo a clustering that had held
        (:func:`~fl_clusters.placement_regret.warn_if_clustering_broke`).
        """
        fields = p.evaluate_fields(self.evaluated_models)
        valid = self.check_replies(replies, None, "aggregate_evaluate", fields, trains=False)
        if not valid:
            return None
        accuracy, loss, examples = mean_metrics(valid)
        used = clusters_used(valid, self.assignment_for)
        self.assignment_history[server_round] = used
        warn_if_clustering_broke(self.assignment_history, server_round, self.nodes.describe)
        self.cluster_accuracy_history[server_round] = cluster_accuracy(valid, used)
        sizes = np.bincount(list(self.assignments.values())) if self.assignments else []
        log(
            INFO,
            "round %d: personalized accuracy %.4f, loss %.4f, cluster sizes %s",
            server_round, accuracy, loss, list(map(int, sizes)),
        )
        return MetricRecord({p.M_ACCURACY: accuracy, p.M_LOSS: loss, p.M_NUM_EXAMPLES: examples})

    def preset_fields(self) -> dict[str, Any]:
        """``preset``, the arguments it set to the paper's values and those the caller kept.

        ``preset_kept``: each argument given against the paper preset, with the
        value given and the paper's (docs/paper-fidelity.md). ``preset_rules``,
        under the paper preset only: the declared behaviours that ran the paper's
        rule (``behaviours``).
        """
        fields = {"preset": self.preset, "preset_changes": dict(self.preset_changes),
                  "preset_kept": {name: dict(kept) for name, kept in self.preset_kept.items()}}
        if self.preset == "paper":
            fields["preset_rules"] = list(self.preset_rules)
        return fields

    def summary(self) -> None:
        """Log the strategy's settings."""
        changes = ", ".join(f"{name}={value!r}" for name, value in self.preset_changes.items())
        log(INFO, "\t├──> Preset %s%s", self.preset, f" ({changes})" if changes else "")
        if self.preset_rules:
            log(INFO, "\t├──> The paper's rules: %s", ", ".join(self.preset_rules))
        log(INFO, "\t├──> Sampling: train %.2f | evaluate %.2f | min available %d",
            self.fraction_train, self.fraction_evaluate, self.min_available_nodes)
        log(INFO, "\t└──> Seed %d", self.seed)

