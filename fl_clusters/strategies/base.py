"""The clustered base strategies that every fl-clusters algorithm builds on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from sklearn.metrics import pairwise_distances

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    cluster_feature_means,
    inter_cluster_mix,
    model_updates,
    weighted_average,
)
from fl_clusters.handshake import identify_nodes
from fl_clusters.strategies.params import check_param

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def per_cluster_evaluate(evaluate_fn: EvaluateFn) -> EvaluateFn:
    """Adapt a FedAvg-style centralized ``evaluate_fn`` to packed cluster models.

    The returned function passes a plain model through unchanged; a packed record
    is unpacked and ``evaluate_fn`` is called on every cluster model, its metrics
    returned under ``cluster-<j>/<name>`` keys (Flower's ``result`` keeps them per
    round in ``evaluate_metrics_serverapp``).
    """

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if not p.is_packed(arrays):
            return evaluate_fn(server_round, arrays)
        merged = MetricRecord()
        for j, model in enumerate(p.unpack_clusters(arrays)):
            for name, value in (evaluate_fn(server_round, model) or {}).items():
                merged[p.cluster_prefix(j) + name] = value
        return merged

    return evaluate


# Stages whose replies carry trained models: a round without any is a failed round.
TRAINING_STAGES = ("aggregate_train", "ifca warm start", "fedsoft warm start")


def describe_steps_done(replies: Sequence[Message], asked: int | None) -> str:
    """What the nodes' training did, from their replies' ``local-steps-done``.

    A node that runs its own ``train()`` (``ClusteredClient``) takes the steps its
    loop takes, whatever the server asked; the log must say what happened.

    Parameters
    ----------
    replies : Sequence[Message]
        Valid training replies.
    asked : int | None
        The ``local-steps`` the server sent (``None`` or 0: it left the number
        to the node's epochs).

    Returns
    -------
    str
        E.g. ``"clients ran 13-13 local steps (asked 100)"``; nodes that did not
        report their steps are counted.
    """
    done = [int(m.content.metric_records[p.METRICS][p.M_STEPS_DONE])  # type: ignore[arg-type]
            for m in replies if p.M_STEPS_DONE in m.content.metric_records[p.METRICS]]
    request = f"asked {asked}" if asked else "asked for local epochs"
    text = (f"clients ran {min(done)}-{max(done)} local steps ({request})" if done
            else f"clients did not report their local steps ({request})")
    missing = len(replies) - len(done)
    if done and missing:
        text += f"; {missing} of {len(replies)} did not report theirs"
    return text


def key_order(keys: Mapping[int, int | None], node: int) -> tuple[int, int, int]:
    """Sort key of ``node``: its handshake key, then (for nodes without one) its id.

    Parameters
    ----------
    keys : Mapping[int, int | None]
        Node id -> stable key from :func:`ask_node_keys` (``None``: it gave none).
    node : int
        The node id.
    """
    key = keys.get(node)
    return (0, key, node) if key is not None else (1, 0, node)


def ask_node_keys(
    grid: Grid, nodes: Iterable[int], timeout: float | None
) -> tuple[dict[int, int | None], int]:
    """Ask ``nodes`` for their stable key (:func:`~fl_clusters.handshake.identify_nodes`).

    A node whose app has no identity handler, or that answers with no whole
    ``node-key`` >= 0, is logged once and gets ``None``: it is ordered after the
    keyed nodes by its (random) id. The parameters are ``identify_nodes``'s.

    Returns
    -------
    tuple
        ``(keys, rejected)``: node id -> key (``None`` without one), and the
        number of replies that were errors or malformed.
    """
    found = identify_nodes(grid, nodes, timeout)
    log_identity_problems(found.problems)
    return found.keys, len(found.problems)


def log_identity_problems(problems: Mapping[int, str]) -> None:
    """Log every node that gave no stable key, and why."""
    for node, problem in sorted(problems.items()):
        log(WARNING, "identity: node %d gave no stable key (%s); it is ordered by its "
            "random node id, so runs with it may not repeat", node, problem)


def kmeans_start_problem(
    name: str, num_nodes: int, fraction: float, num_clusters: int, fix: str
) -> str | None:
    """Why a warm start that clusters one local model per node cannot run, or ``None``.

    Parameters
    ----------
    name : str
        The strategy's name, for the message.
    num_nodes : int
        Connected nodes.
    fraction : float
        The share of them the warm start samples.
    num_clusters : int
        Clusters k-means must find (one local model each at least).
    fix : str
        The strategy's own way out (e.g. its random initialisation's key).
    """
    sampled = max(1, round(num_nodes * fraction))
    if sampled >= num_clusters:
        return None
    return (
        f"{name} needs at least {num_clusters} nodes in its first training round (k-means "
        f"groups one local model per node into {num_clusters} clusters), but the federation "
        f"has {num_nodes} node(s) and the round samples {sampled}. Fix: run more nodes "
        f"(flwr run . --federation-config \"num-supernodes=20\"), lower num-clusters, or {fix}"
    )


class ClusteredStrategy(Strategy):
    """Base of the clustered strategies: k cluster models in one packed ArrayRecord.

    The ArrayRecord that ``Strategy.start`` passes from ``aggregate_train`` to the
    next ``configure_train`` holds every cluster model under ``cluster-<j>/`` keys
    (see :mod:`fl_clusters.protocol`), so ``result.arrays`` returns them all and the
    strategy runs from any ServerApp exactly like FedAvg. The base tracks which
    cluster each node belongs to, samples nodes reproducibly, rejects (logs and
    skips) error replies and replies with NaN/Inf or wrong shapes, and evaluates
    each node with the model it would use. With ``mcfl`` every node also receives
    every cluster model at evaluation and uses the one whose input feature is
    nearest to the mean of its test inputs (MCFL, Li and Yan 2023).

    Parameters
    ----------
    fraction_train : float (default: 1.0)
        Fraction of connected nodes sampled for training each round.
    fraction_evaluate : float (default: 1.0)
        Fraction of connected nodes sampled for evaluation each round.
    min_available_nodes : int (default: 2)
        Nodes that must be connected before a round starts.
    awcfl_beta : float (default: 0.0)
        AWCFL inter-cluster weighting: cluster k becomes
        ``beta/(n-1) * sum of the other clusters + (1-beta) * its own mean``.
        0 is plain clustered aggregation.
    mcfl : bool (default: False)
        MCFL: before round 1 every node uploads the mean of
        ``mcfl_feature_samples`` sampled training inputs; a cluster's feature is
        the mean over its members' uploads, and at evaluation a node takes the
        cluster model whose feature is nearest to the mean of its test inputs
        (inputs only: no test label is read for the choice).
    mcfl_feature_samples : int (default: 32)
        n, the training inputs a node averages into its uploaded feature.
    max_failed_rounds : int (default: 3)
        Training rounds in a row without one valid reply after which the run
        stops with a ``RuntimeError`` that lists the clients' errors, instead of
        going on (and returning) with models nobody trained. >= 1.
    seed : int (default: 0)
        Seed of node sampling and of any random initialization.
    """

    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_available_nodes: int = 2,
        awcfl_beta: float = 0.0,
        mcfl: bool = False,
        mcfl_feature_samples: int = 32,
        max_failed_rounds: int = 3,
        seed: int = 0,
    ) -> None:
        for name, value in (("fraction_train", fraction_train),
                            ("fraction_evaluate", fraction_evaluate),
                            ("awcfl_beta", awcfl_beta)):
            check_param(name, value, "float", low=0.0, high=1.0)
        check_param("min_available_nodes", min_available_nodes, "int", low=1)
        check_param("mcfl", mcfl, "bool")
        check_param("mcfl_feature_samples", mcfl_feature_samples, "int", low=1)
        check_param("max_failed_rounds", max_failed_rounds, "int", low=1)
        check_param("seed", seed, "int", low=0)
        self.fraction_train = fraction_train
        self.fraction_evaluate = fraction_evaluate
        self.min_available_nodes = min_available_nodes
        self.awcfl_beta = awcfl_beta
        self.mcfl = mcfl
        self.mcfl_feature_samples = mcfl_feature_samples
        self.max_failed_rounds = max_failed_rounds
        # Set by the registry when the run config built the strategy: error
        # messages then name run-config keys instead of constructor arguments.
        self.from_run_config = False
        self.failed_rounds = 0
        self.seed = seed
        self.round_timeout = 3600.0
        self.rng = np.random.default_rng(seed)
        self.assignments: dict[int, int] = {}
        # Node id -> stable key from the start-up handshake (None: the node gave none).
        # Simulated node ids are random per run; ordering by these keys is what makes
        # sampling and aggregation order, hence results, repeat with the same seed.
        self.node_keys: dict[int, int | None] = {}
        self._handshake = False
        self.node_features: dict[int, np.ndarray] = {}
        self._features_asked: set[int] = set()
        self.rejected_replies = 0
        # Per evaluation round: the cluster each evaluated node used, and each
        # cluster's example-weighted accuracy (for the run's plots and summary).
        self.assignment_history: dict[int, dict[int, int]] = {}
        self.cluster_accuracy_history: dict[int, dict[int, float]] = {}

    # ------------------------------------------------------------------ helpers
    def federation_problem(self, num_nodes: int) -> str | None:
        """Why the strategy cannot run on ``num_nodes`` connected nodes, or ``None``.

        fl-clusters' ServerApp asks before round 1, so that such a run stops with
        the fix instead of failing inside a round. Strategies whose first round
        needs more than one node override it.
        """
        return None

    def assignment_for(self, node_id: int) -> int | None:
        """Cluster of ``node_id`` decided by the server, or ``None`` if the node decides."""
        return self.assignments.get(node_id)

    def node_order(self, node: int) -> tuple[int, int, int]:
        """Sort key of a node: its handshake key, then (for nodes without one) its id."""
        return key_order(self.node_keys, node)

    def learn_node_keys(self, grid: Grid, nodes: Iterable[int]) -> None:
        """Ask the nodes not seen before for their stable key (``query.identity``).

        See :func:`ask_node_keys`; the round timeout bounds the wait.
        """
        missing = sorted(set(nodes) - set(self.node_keys))
        if missing:
            keys, rejected = ask_node_keys(grid, missing, self.round_timeout)
            self.node_keys.update(keys)
            self.rejected_replies += rejected

    def sample(self, grid: Grid, fraction: float) -> list[int]:
        """Sample ``fraction`` of the connected nodes (at least one), reproducibly.

        Positions are drawn among the nodes sorted by :meth:`node_order`, so the
        same seed samples the same partitions in every run.
        """
        _, all_nodes = sample_nodes(grid, self.min_available_nodes, 0)
        if self._handshake:
            self.learn_node_keys(grid, all_nodes)
            if self.mcfl:
                # A node that joined after the start uploads its feature too, so
                # its cluster's MCFL feature includes it once it has a cluster.
                self.collect_features(grid, all_nodes)
        size = max(1, round(len(all_nodes) * fraction))
        nodes = sorted(all_nodes, key=self.node_order)
        # Draw positions, not ids: node ids are uint64 and numpy would turn a list
        # of them into float64, rounding them into ids that do not exist.
        chosen = self.rng.choice(len(nodes), size=min(size, len(nodes)), replace=False)
        return sorted((nodes[int(i)] for i in chosen), key=self.node_order)

    @staticmethod
    def build_messages(
        contents: dict[int, RecordDict], message_type: str
    ) -> list[Message]:
        """One message per node, each with its own content."""
        return [
            Message(content=content, dst_node_id=node, message_type=message_type)
            for node, content in contents.items()
        ]

    def check_replies(
        self,
        replies: Iterable[Message],
        reference: ArrayRecord | None,
        stage: str,
        fields: Mapping[str, p.MetricField] | None = None,
    ) -> list[Message]:
        """Keep the replies that can be used; log every one that cannot.

        A reply is used only if every field the caller reads is there with a finite
        value of the right type and range, so reading a valid reply never raises.

        Parameters
        ----------
        replies : Iterable[Message]
            Replies from the grid.
        reference : ArrayRecord | None
            Model the replies' ``arrays`` must match in keys and shapes; ``None``
            when the replies carry no model.
        stage : str
            Name used in the log lines.
        fields : Mapping[str, MetricField] | None
            Metrics the caller reads besides ``num-examples``; ``None`` means
            ``train-loss`` for the training stages and nothing for the others.
        """
        if fields is None:
            fields = p.TRAIN_FIELDS if stage in TRAINING_STAGES else {}
        valid: list[Message] = []
        reasons: list[str] = []
        replies = list(replies)
        for msg in replies:
            node = msg.metadata.src_node_id
            reason = self._reply_problem(msg, reference, fields)
            if reason is not None:
                self.rejected_replies += 1
                reasons.append(f"node {node}: {reason}")
                log(WARNING, "%s: rejected reply from node %d: %s", stage, node, reason)
                continue
            valid.append(msg)
        log(INFO, "%s: %d valid replies, %d rejected", stage, len(valid), len(replies) - len(valid))
        # Replies arrive in any order; a fixed order makes every sum (and result) repeat.
        valid.sort(key=lambda m: self.node_order(m.metadata.src_node_id))
        if stage in TRAINING_STAGES:
            self._count_failed_round(stage, valid, reasons)
        return valid

    def _count_failed_round(self, stage: str, valid: list[Message], reasons: list[str]) -> None:
        """Stop the run after ``max_failed_rounds`` training rounds without a valid reply.

        Flower's loop goes on when ``aggregate_train`` returns nothing, so a
        federation whose every client fails would otherwise finish "successfully"
        with the untrained models it started from.
        """
        if valid:
            self.failed_rounds = 0
            return
        self.failed_rounds += 1
        log(WARNING, "%s: no valid reply (%d of %d training rounds in a row allowed)",
            stage, self.failed_rounds, self.max_failed_rounds)
        if self.failed_rounds >= self.max_failed_rounds:
            limit = ("run-config key 'max-failed-rounds'" if self.from_run_config
                     else f"the constructor argument max_failed_rounds={self.max_failed_rounds}")
            shown = "; ".join(reasons[:10]) or "no node answered (none sampled or all timed out)"
            more = f" (+{len(reasons) - 10} more)" if len(reasons) > 10 else ""
            raise RuntimeError(
                f"{self.failed_rounds} training rounds in a row without one valid reply, so no "
                f"model was trained; the clients said: {shown}{more}. Fix the failing "
                f"ClientApps (or raise {limit})"
            )

    @staticmethod
    def _reply_problem(
        msg: Message, reference: ArrayRecord | None, fields: Mapping[str, p.MetricField]
    ) -> str | None:
        if msg.has_error():
            return f"client error ({msg.error.reason})"
        metrics = msg.content.metric_records.get(p.METRICS)
        if metrics is None:
            return f"no '{p.METRICS}' record"
        problem = p.check_metrics(metrics, fields)
        if problem is not None or reference is None:
            return problem
        arrays = msg.content.array_records.get(p.ARRAYS)
        if arrays is None:
            return f"no '{p.ARRAYS}' record"
        return p.check_model_reply(arrays, reference)

    @staticmethod
    def num_examples(msg: Message) -> float:
        """The ``num-examples`` a reply reports."""
        return float(msg.content.metric_records[p.METRICS][p.M_NUM_EXAMPLES])  # type: ignore[arg-type]

    @staticmethod
    def average_models(
        replies: Sequence[Message], keys: Sequence[str] | None = None
    ) -> ArrayRecord:
        """Example-weighted average of the replies' models (or of ``keys`` only)."""
        names = list(keys if keys is not None else replies[0].content.array_records[p.ARRAYS])
        models = [
            [msg.content.array_records[p.ARRAYS][n].numpy() for n in names] for msg in replies
        ]
        weights = [ClusteredStrategy.num_examples(m) for m in replies]
        return p.numpy_to_record(names, weighted_average(models, weights))

    @staticmethod
    def updates(trained: list[Message], start: ArrayRecord) -> np.ndarray:
        """Flattened float32 updates of the replies, relative to the model they started from."""
        names = list(start.keys())
        return model_updates(
            [[m.content.array_records[p.ARRAYS][n].numpy() for n in names] for m in trained],
            [start[n].numpy() for n in names],
        )

    def mix_clusters(
        self, models: list[ArrayRecord], active: Iterable[int] | None = None
    ) -> list[ArrayRecord]:
        """Apply AWCFL's inter-cluster weighting (identity when beta is 0).

        Parameters
        ----------
        models : list[ArrayRecord]
            Every cluster's model after this round's aggregation.
        active : Iterable[int] | None
            The clusters that aggregated members this round; only they are mixed
            with each other. A cluster without members keeps its model: mixing it
            would drag it to the others' mean, where it can capture their clients.
            ``None`` mixes every cluster.
        """
        chosen = sorted(set(range(len(models)) if active is None else active))
        if self.awcfl_beta == 0.0 or len(chosen) < 2:
            return models
        names = list(models[0].keys())
        mixed = inter_cluster_mix(
            [[models[j][n].numpy() for n in names] for j in chosen], self.awcfl_beta
        )
        result = list(models)
        for j, arrays in zip(chosen, mixed, strict=True):
            result[j] = p.numpy_to_record(names, arrays)
        return result

    # --------------------------------------------------------------------- MCFL
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        *args: Any,
        evaluate_fn: EvaluateFn | None = None,
        **kwargs: Any,
    ) -> Result:
        """Run ``Strategy.start`` after a start-up handshake (and MCFL's features).

        The handshake learns every node's stable key (:meth:`learn_node_keys`);
        nodes that join later are asked when they are first sampled.

        A centralized ``evaluate_fn`` written for FedAvg (one model in, one
        MetricRecord out) is called once per cluster model, see
        :func:`per_cluster_evaluate`. The ``timeout`` passed here also bounds every
        strategy-internal send (:meth:`send`), so a node that stalls cannot hold a
        query forever.
        """
        self.prepare(grid, float(kwargs.get("timeout", self.round_timeout)))
        if evaluate_fn is not None:
            evaluate_fn = per_cluster_evaluate(evaluate_fn)
        return super().start(grid, initial_arrays, *args, evaluate_fn=evaluate_fn, **kwargs)

    def prepare(self, grid: Grid, timeout: float) -> None:
        """What runs before the first round: the handshake, then MCFL's features.

        Nodes already known (a resumed run, :mod:`fl_clusters.checkpoint`) are not
        asked again.

        Parameters
        ----------
        grid : Grid
            The grid of the run.
        timeout : float
            Seconds every send waits for replies (the rounds' timeout).
        """
        self.round_timeout = timeout
        self._handshake = True
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        self.learn_node_keys(grid, nodes)
        if self.mcfl:
            self.collect_features(grid, nodes)

    def send(self, grid: Grid, messages: Iterable[Message]) -> list[Message]:
        """Send strategy-internal ``messages`` and wait at most the round timeout.

        Replies that arrive later are dropped by the grid; the caller sees only
        the replies that came in time.

        Parameters
        ----------
        grid : Grid
            The grid to send through.
        messages : Iterable[Message]
            The queries to send.
        """
        return list(grid.send_and_receive(messages, timeout=self.round_timeout))

    def train_once(
        self, nodes: Iterable[int], start: ArrayRecord, config: ConfigRecord, grid: Grid,
        stage: str,
    ) -> list[Message]:
        """Have ``nodes`` each train ``start`` once with ``config``; the usable replies.

        A strategy-internal training (placing a node that joined late), bounded by
        the round timeout like every other query.
        """
        record = RecordDict({p.ARRAYS: start, p.CONFIG: config})
        replies = self.send(grid, self.build_messages(dict.fromkeys(nodes, record),
                                                      MessageType.TRAIN))
        return self.check_replies(replies, start, stage)

    def collect_features(self, grid: Grid, nodes: Iterable[int]) -> None:
        """MCFL: ask the nodes whose feature is unknown for their mean training input.

        A node's data does not change, so each node is asked once; replies that are
        not a finite vector of the common length are logged and skipped.
        """
        # Each node is asked once: one that gave no usable feature is not asked (and
        # waited for) again every round.
        missing = sorted(set(nodes) - self._features_asked)
        if not missing:
            return
        self._features_asked.update(missing)
        config = ConfigRecord({p.CFG_NUM_SAMPLES: self.mcfl_feature_samples})
        replies = self.send(
            grid,
            self.build_messages(
                {node: RecordDict({p.CONFIG: config}) for node in missing}, p.QUERY_FEATURES
            )
        )
        known = next(iter(self.node_features.values()), None)
        for msg in self.check_replies(replies, None, "mcfl features"):
            node = msg.metadata.src_node_id
            metrics = msg.content.metric_records[p.METRICS]
            feature = np.asarray(metrics.get(p.M_FEATURE_MEAN, []), dtype=np.float64)
            size = feature.size if known is None else known.size
            if feature.ndim != 1 or feature.size != size or size == 0 or not np.all(
                np.isfinite(feature)
            ):
                self.rejected_replies += 1
                log(WARNING, "mcfl features: rejected reply from node %d: '%s' is not a "
                    "finite vector of length %d", node, p.M_FEATURE_MEAN, size)
                continue
            self.node_features[node] = feature
            known = feature

    def mcfl_cluster_features(self, num_clusters: int) -> np.ndarray | None:
        """MCFL's cluster features: (k, D) means of the members' uploads, NaN rows for none.

        Members are the nodes' latest clusters (``assignments``); ``None`` when MCFL
        is off or no member has a feature.
        """
        if not self.mcfl:
            return None
        members = [
            (node, cluster) for node, cluster in self.assignments.items()
            if node in self.node_features and 0 <= cluster < num_clusters
        ]
        if not members:
            return None
        return cluster_feature_means(
            np.stack([self.node_features[node] for node, _ in members]),
            np.array([cluster for _, cluster in members], dtype=np.int64),
            num_clusters,
        )

    # --------------------------------------------------------------- evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluate each sampled node with the model it would use.

        A node with a server-side assignment receives its cluster's model; any other
        node receives every cluster model and picks by its training loss. Under MCFL
        every node receives every cluster model and the clusters' features, and picks
        the cluster whose feature is nearest to the mean of its test inputs.
        """
        if self.fraction_evaluate == 0.0:
            return []
        models = p.unpack_clusters(arrays)
        features = self.mcfl_cluster_features(len(models)) if len(models) > 1 else None
        contents: dict[int, RecordDict] = {}
        for node in self.sample(grid, self.fraction_evaluate):
            node_config = ConfigRecord(dict(config))
            node_config[p.CFG_ROUND] = server_round
            cluster = self.assignment_for(node)
            if features is not None:
                usable = np.flatnonzero(np.all(np.isfinite(features), axis=1))
                node_config[p.CFG_MCFL_CLUSTERS] = usable.tolist()
                node_config[p.CFG_MCFL_FEATURES] = features[usable].ravel().tolist()
                record = RecordDict({p.CLUSTERS: arrays, p.CONFIG: node_config})
            elif cluster is not None and len(models) > 1:
                record = RecordDict({p.ARRAYS: models[cluster], p.CONFIG: node_config})
            else:
                record = RecordDict({p.CLUSTERS: arrays, p.CONFIG: node_config})
            contents[node] = record
        return self.build_messages(contents, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Example-weighted mean of the nodes' accuracy and loss on their test splits."""
        valid = self.check_replies(replies, None, "aggregate_evaluate", p.EVALUATE_FIELDS)
        if not valid:
            return None
        weights = np.array([self.num_examples(m) for m in valid])
        metrics = [m.content.metric_records[p.METRICS] for m in valid]
        accuracy = float(np.average([float(m[p.M_ACCURACY]) for m in metrics], weights=weights))
        self._record_round(server_round, valid)
        loss = float(np.average([float(m[p.M_LOSS]) for m in metrics], weights=weights))
        sizes = np.bincount(list(self.assignments.values())) if self.assignments else []
        log(
            INFO,
            "round %d: personalized accuracy %.4f, loss %.4f, cluster sizes %s",
            server_round, accuracy, loss, list(map(int, sizes)),
        )
        return MetricRecord(
            {p.M_ACCURACY: accuracy, p.M_LOSS: loss, p.M_NUM_EXAMPLES: float(weights.sum())}
        )

    def _record_round(self, server_round: int, valid: list[Message]) -> None:
        """Keep which cluster each evaluated node used and each cluster's accuracy.

        A node's cluster is the ``cluster-id`` its reply reports when it chose among
        every model (by training loss, or by MCFL's feature distance), else the
        server's assignment, else 0 (a single model).
        """
        used: dict[int, int] = {}
        for msg in valid:
            node = msg.metadata.src_node_id
            chosen = msg.content.metric_records[p.METRICS].get(p.M_CLUSTER)
            assigned = self.assignment_for(node)
            cluster = chosen if chosen is not None else assigned
            used[node] = 0 if cluster is None else int(cluster)  # type: ignore[arg-type]
        self.assignment_history[server_round] = used
        per_cluster: dict[int, float] = {}
        for cluster in sorted(set(used.values())):
            members = [m for m in valid if used[m.metadata.src_node_id] == cluster]
            per_cluster[cluster] = float(np.average(
                [float(m.content.metric_records[p.METRICS][p.M_ACCURACY]) for m in members],  # type: ignore[arg-type]
                weights=[self.num_examples(m) for m in members],
            ))
        self.cluster_accuracy_history[server_round] = per_cluster

    def similarity_matrix(self) -> tuple[list[int], np.ndarray] | None:
        """The final pairwise similarity of the clients the strategy clustered.

        Strategies that compute one (cosine similarity of updates...) override this
        and return the node ids of the rows with the (n, n) matrix, so that the run
        plots it; ``None`` (the default) means there is none.
        """
        return None

    def summary_fields(self) -> dict[str, Any]:
        """Strategy-specific entries for the run's ``summary.json`` (JSON-serializable).

        Subclasses add what their algorithm decided (split rounds, trial counts,
        DBSCAN's eps...). Ground truth is never available here: scores against it
        are computed by :mod:`fl_clusters.server_app` from these fields.
        """
        return {}

    def write_artifacts(self, folder: Path) -> list[Path]:
        """Write strategy-specific files (plots...) into a run's results folder.

        Called by the ServerApp after ``summary.json`` is written; returns the
        paths written (none by default).
        """
        return []

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(INFO, "\t├──> Sampling: train %.2f | evaluate %.2f | min available %d",
            self.fraction_train, self.fraction_evaluate, self.min_available_nodes)
        log(INFO, "\t└──> AWCFL beta %.2f | MCFL %s (n=%d) | seed %d", self.awcfl_beta,
            "on" if self.mcfl else "off", self.mcfl_feature_samples, self.seed)


class HardClusteredStrategy(ClusteredStrategy):
    """Clustered strategies whose server assigns each node to one cluster (CFL, ACFL).

    Holds the cluster models of the current round, sends every sampled node its own
    cluster's model, and groups the replies by cluster. A node without a cluster
    (never seen, or released) receives every cluster model and trains the one with
    the lowest loss on its training split; its reply's ``cluster-id`` places it.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_available_nodes, awcfl_beta, seed
        See :class:`~fl_clusters.strategies.base.ClusteredStrategy`.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._models: list[ArrayRecord] = []
        # Nodes placed after the clustering by the strategy's own rule (node -> cluster),
        # and every node asked to, so a silent one is not waited for every round.
        self.placed_nodes: dict[int, int] = {}
        self._placement_asked: set[int] = set()

    def newcomers(self, nodes: Iterable[int]) -> list[int]:
        """The nodes of ``nodes`` without a cluster that were never asked to place themselves."""
        return [n for n in nodes if n not in self.assignments and n not in self._placement_asked]

    def place_by_update(
        self,
        server_round: int,
        nodes: list[int],
        start: ArrayRecord,
        references: np.ndarray,
        config: ConfigRecord,
        grid: Grid,
        metric: str = "cosine",
    ) -> None:
        """Place nodes without a cluster by their update, the way the strategy clustered.

        Each node trains once from ``start`` (the model the clustered updates were
        computed from) and joins the cluster whose reference update (row of
        ``references``) is nearest to its own under ``metric`` (any scikit-learn
        pairwise metric). A node that does not answer picks by training loss and
        is not asked again.
        """
        self._placement_asked.update(nodes)
        node_config = ConfigRecord(dict(config))
        node_config[p.CFG_ROUND] = server_round
        valid = self.train_once(nodes, start, node_config, grid, "placement")
        if not valid:
            return
        distances = pairwise_distances(self.updates(valid, start), references, metric=metric)
        for msg, cluster in zip(valid, np.argmin(distances, axis=1), strict=True):
            node = msg.metadata.src_node_id
            self.assignments[node] = self.placed_nodes[node] = int(cluster)
            log(INFO, "round %d: node %d joined late; placed in cluster %d by the %s distance "
                "of its update", server_round, node, int(cluster), metric)

    def cluster_of(self, node: int) -> int | None:
        """The node's cluster; with a single cluster every node belongs to it."""
        if len(self._models) == 1:
            return 0
        return self.assignments.get(node)

    def assigned_train_messages(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        nodes: list[int] | None = None,
    ) -> list[Message]:
        """One train message per sampled node (or per node of ``nodes``), carrying its
        cluster's model."""
        self._models = p.unpack_clusters(arrays)
        if self.fraction_train == 0.0:
            return []
        contents: dict[int, RecordDict] = {}
        for node in self.sample(grid, self.fraction_train) if nodes is None else nodes:
            node_config = ConfigRecord(dict(config))
            node_config[p.CFG_ROUND] = server_round
            cluster = self.cluster_of(node)
            if cluster is None:
                record = RecordDict({p.CLUSTERS: arrays, p.CONFIG: node_config})
            else:
                node_config[p.CFG_ASSIGNED] = cluster
                record = RecordDict({p.ARRAYS: self._models[cluster], p.CONFIG: node_config})
            contents[node] = record
        log(INFO, "configure_train: %d nodes over %d clusters", len(contents), len(self._models))
        return self.build_messages(contents, MessageType.TRAIN)

    def replies_by_cluster(self, replies: Iterable[Message]) -> dict[int, list[Message]]:
        """The valid train replies, grouped by the cluster whose model each node trained."""
        members: dict[int, list[Message]] = {}
        fields = {**p.TRAIN_FIELDS, p.M_CLUSTER: p.MetricField(integer=True, required=False)}
        for msg in self.check_replies(replies, self._models[0], "aggregate_train", fields):
            node = msg.metadata.src_node_id
            cluster = self.cluster_of(node)
            if cluster is None:
                cluster = int(msg.content.metric_records[p.METRICS].get(p.M_CLUSTER, -1))  # type: ignore[arg-type]
                if not 0 <= cluster < len(self._models):
                    self.rejected_replies += 1
                    log(WARNING, "aggregate_train: rejected reply from node %d: cluster-id %d "
                        "outside [0, %d)", node, cluster, len(self._models))
                    continue
            members.setdefault(cluster, []).append(msg)
        return members

    def aggregate_clusters(
        self, models: list[ArrayRecord], groups: dict[int, list[Message]]
    ) -> tuple[ArrayRecord, MetricRecord]:
        """Average each cluster's members (clusters without replies keep their model).

        Records every member's cluster in ``assignments`` and applies AWCFL's
        inter-cluster mixing to the averages.
        """
        models = list(models)
        for cluster, trained in groups.items():
            models[cluster] = self.average_models(trained)
            for msg in trained:
                self.assignments[msg.metadata.src_node_id] = cluster
        models = self.mix_clusters(models, active=groups)
        sizes = np.bincount(list(self.assignments.values()), minlength=len(models))
        losses = [
            float(m.content.metric_records[p.METRICS][p.M_TRAIN_LOSS])  # type: ignore[arg-type]
            for trained in groups.values() for m in trained
        ]
        metrics = MetricRecord(
            {
                p.M_TRAIN_LOSS: float(np.mean(losses)),
                "cluster-sizes": sizes.astype(int).tolist(),
                "num-clusters": len(models),
            }
        )
        return p.pack_clusters(models), metrics

    def summary_fields(self) -> dict[str, Any]:
        """The number of clusters the nodes ended in, and the nodes placed late."""
        return {
            "num_clusters_found": len(set(self.assignments.values())) or 1,
            "placed_nodes": {str(node): c for node, c in sorted(self.placed_nodes.items())},
        }
