"""FedSoft: soft clustered FL with proximal local updates (Ruan and Joe-Wong, AAAI 2022)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fl_clusters import protocol as p
from fl_clusters.clustering import weighted_average
from fl_clusters.drawing import random_like
from fl_clusters.strategies.kit import (
    Behaviour,
    CentresFromStart,
    ImportanceWeights,
    KMeansStart,
    Param,
    RecipeValue,
    Scoring,
    num_clusters_param,
    num_examples,
    reply_layers,
    train_losses,
)
from fl_clusters.strategies.local import LOCAL_MODELS_HELD_OUT


def _mean(replies: list[Message], names: list[str],
          weights: list[float] | None = None) -> ArrayRecord:
    """The mean of the replies' models, weighted by ``weights`` (``None``: unweighted,
    FedSoft's 1/K cluster update)."""
    return p.numpy_to_record(names, weighted_average(
        reply_layers(replies, names), [1.0] * len(replies) if weights is None else weights))


class FedSoft(CentresFromStart, ImportanceWeights):
    """FedSoft, following Algorithm 1 of the paper.

    Every ``tau`` rounds (from round 1) all nodes receive the S cluster models and
    count, over their training samples, which model has the lowest loss; the server
    turns the counts into importance weights ``u_ks = max(n_ks / n_k, sigma)`` and
    reuses them until the next estimate. Each round, for every cluster s, K nodes
    are drawn with probabilities ``v_sk = u_ks n_k / sum_k' u_k's n_k'``,
    independently per cluster and without replacement (by default, no K: every
    node is drawn for every cluster; the authors' runs draw K = 15, the paper
    preset's). A node drawn for several clusters gets ONE message
    and solves ONE proximal problem,
    ``f_k(w) + lambda/2 * sum_s u_ks ||w - c_s||^2``, starting from its own model
    kept on the node between rounds (its personalized model). Every node's model
    starts from the one initial model ``Strategy.start`` receives, while the S
    cluster models start as independent random draws: the draws break the symmetry
    between clusters, and the common start keeps the nodes' models aligned so that
    averaging them into a cluster model is meaningful (with packed initial arrays,
    a node starts from the cluster model it weighs most). Cluster s becomes the
    mean of the models returned by the nodes drawn for s weighted by
    ``u_ks n_k`` (``preset="paper"``: the plain mean ``1/K sum w_k`` of the
    paper), normalized over the nodes that returned one; a cluster whose drawn
    nodes all failed keeps its model.

    Why weighted: drawn without replacement, a cluster that only m < K nodes
    weigh (a group of m nodes, u near one-hot) gets its m members and K - m
    nodes drawn at the floor sigma, whose models belong to other sources; the
    plain mean gives each of them a share 1/K (2 of 5 with groups of 3 and
    K = 5), so every cluster model mixes the groups. Weighted by ``u_ks n_k``
    they count by sigma, and drawing every node (no K) makes each cluster model
    the importance-weighted mean of all nodes, the quantity the K draws estimate.

    Evaluation scores each node's own persistent model on its held-out test split;
    a node that has never trained uses the cluster model it weighs most.

    Algorithm 1 leaves the cluster models' initialization open. ``init="random"``
    draws them independently. They then fit every sample about equally, so the
    first estimates of u carry no information and the first draws mix all
    sources; when one network can fit every source (quarter-turn digits), both
    clusters can settle as generalists. With
    ``init="local-kmeans"`` round 1 is a warm-start round: every node trains its
    persistent model once from the initial model (one local task, no proximal
    term), the server groups the nodes' updates into S groups with k-means and
    starts cluster s from the plain mean of group s's models; FedSoft proper runs
    from round 2, with each node's group as its first importance weights (one-hot,
    floored at sigma) until the next estimate round (round 3 with tau = 2). An
    estimate in round 2 would score centres that are means of one local task's
    models: with little local training they fit every sample alike, the counts
    are ties and noise, and weighting by them would average every node into
    every cluster alike, erasing the groups.
    """

    name = "fedsoft"
    # k-means groups the nodes' whole updates (IFCA and FedEM group the output
    # layer's); kept as measured (docs/results.md).
    warm_start_features = "whole-update"
    paper = "Ruan and Joe-Wong, AAAI 2022"
    no_inner_aggregation = ("every client counts in every cluster with its importance weight, "
                            "which Flower's strategies cannot take")
    client_needs = "`clustered.regularizer(net)` in the loss (below)"
    # 2: preset="paper" draws the authors' K = 15 nodes per cluster.
    paper_revision = 2
    # 2: every node trains every round and clusters average by importance (u_ks n_k).
    robust_revision = 2
    defaults_checked_against = (
        "the authors' code (github.com/ycruan/FedSoft): main.py's estimation_interval = 2 "
        "(tau), solvers.py's count_smoother = 1e-4 (sigma) and reg_weight = 0.1 for MNIST "
        "and EMNIST letters (lambda; 0.01 for CIFAR-10); seed 004, section 4.1 names them "
        "in Algorithm 1 without values"
    )
    # No fraction_train: the strategy draws clients_per_cluster nodes per cluster.
    params = (
        num_clusters_param(2,
                           doc="S, the number of cluster models (source distributions)."),
        Param("tau", 2, "int", "FedSoft: importance estimate every tau rounds", low=1,
              doc="Rounds between importance-weight estimates."),
        Param("sigma", 1e-4, "float", "FedSoft importance floor", low=0.0, high=1.0,
              doc="Floor of every importance weight, in [0, 1]."),
        Param("clients_per_cluster", None, "int",
              "FedSoft K, nodes drawn per cluster (0: every node, every round)", low=1,
              allow_none=True, unset=0, paper=15,
              why="no count of nodes fits every federation: a cluster that fewer than K "
              "nodes weigh fills its draws with other groups' nodes (K = 15 draws all 6 "
              "nodes of two groups of 3 for both clusters), and a node drawn for no cluster "
              "does not train its personalized model that round (K = 5 for 8 clusters of 40 "
              "nodes left the held-out sweep's personalized accuracy far below K = 15's); "
              "every node trains every round, as the other strategies do with fraction_train "
              "= 1 (the authors' runs select: the paper value)",
              source="the authors' code (github.com/ycruan/FedSoft, main.py: "
              "do_selection=True, selection_size=15 for its 20 CIFAR-10 clients; servers.py "
              "trains every client, weighing client k by v_sk, only when do_selection is "
              "False); Lai (seed 004), section 4.1, Algorithm 1 names K without a value",
              doc="K, nodes drawn per cluster each round; ``None``: every node with importance "
              'weights, so every node trains every round (``preset="paper"``: 15).'),
        Param("proximal_lambda", 0.1, "float", "FedSoft proximal weight", low=0.0,
              key="fedsoft-lambda",
              doc="lambda, the weight of the proximal term."),
        Param("init", "local-kmeans", "str",
              "FedSoft cluster models: k-means of a warm-start round, or random draws",
              choices=("local-kmeans", "random"), paper="random",
              why="from random draws the first importance estimates carry no information; "
              "plugged into Flower's quickstart, FedSoft sat at chance for rounds 1-6 of 10 "
              "from random draws",
              source="Lai (seed 004), section 4.1, Algorithm 1: the centres c_s enter round "
              "0 with no step that trains or groups them first",
              doc='How the S cluster models start: ``"local-kmeans"`` (a warm-start round, see '
              'above) or ``"random"`` (independent draws; ``preset="paper"``).'),
    )
    behaviours = (
        LOCAL_MODELS_HELD_OUT,
        Behaviour(
            "estimate_late_joiners", "",
            "a node that joined since the last estimate is asked for its importance "
            "weights in the round it is first seen, not at the next multiple of tau",
            "without weights a node cannot be drawn, so it would wait up to tau rounds",
            "Lai (seed 004), section 4.1, Algorithm 1 steps 2-12: a fixed set of N clients "
            "estimates every tau rounds", switch=False),
        Behaviour(
            "importance_weighted_mean",
            "cluster s becomes the plain mean 1/K of the models of the K nodes drawn for it",
            "cluster s becomes the mean of the models of the nodes drawn for it weighted by "
            "u_ks n_k, the mass its selection probabilities v_sk give them",
            "drawn without replacement, a cluster that only m < K nodes weigh fills its "
            "other K - m draws with nodes at the floor sigma, from other sources, and the "
            "plain mean gives each a share 1/K (2 of 5 with groups of 3 nodes and K = 5); "
            "weighted, they count by sigma",
            "Lai (seed 004), section 4.1, Algorithm 1 step 17: c_s = 1/K x the sum over "
            "Sel_s; the authors' code (servers.py, _aggregate_fedsoft) weighs client k by "
            "v_sk when it draws no clients"),
        Behaviour(
            "mean_of_returned", "",
            "cluster s becomes the mean of the models its drawn nodes returned (normalized "
            "over those, not over K); a cluster none of whose drawn nodes returned keeps "
            "its model",
            "the paper's nodes never fail; dividing by K when some did would shrink the "
            "cluster model towards zero",
            "Lai (seed 004), section 4.1, Algorithm 1 step 17: c_s = 1/K x the sum over "
            "Sel_s", switch=False),
        Behaviour(
            "node_model_start", "",
            "each node keeps its own model between rounds (its personalized model) and "
            "starts it from the one initial model every node receives",
            "a common start keeps the nodes' models aligned, so that averaging them into "
            "a cluster model is meaningful",
            "Lai (seed 004), section 4.1, Algorithm 1 step 16: w_k = argmin h_k, from a "
            "start not given", switch=False),
    )
    # The authors' MNIST solver (solvers.py, MnistClientSolver), the one whose lambda
    # and sigma the defaults were checked against.
    recipe = (
        RecipeValue("optimizer", "Adam", "the authors' code (github.com/ycruan/FedSoft, "
                    "solvers.py: MnistClientSolver optimizer_type = torch.optim.Adam)",
                    not_applied="the built-in learner runs plain SGD only; Adam is a "
                    "ClientApp of your own (docs/plugin.md)"),
        RecipeValue("lr", 1e-4, "the authors' code (solvers.py: MnistClientSolver lr = "
                    "1e-4, Adam's step)",
                    not_applied="it is Adam's step size: plain SGD at 1e-4 would barely "
                    "move a model in 200 rounds"),
        RecipeValue("local-epochs", 10, "the authors' code (solvers.py: MnistClientSolver "
                    "local_epoch = 10)"),
        RecipeValue("local-steps", 0, "the authors' code (solvers.py: local training is "
                    "counted in epochs, local_epoch)"),
        RecipeValue("batch-size", 10, "the authors' code (solvers.py: MnistClientSolver "
                    "batch_size = 10)"),
        RecipeValue("num-rounds", 200, "Lai (seed 004), section 5, Table 1: 200 federated "
                    "rounds; the authors' code (main.py: num_epochs = 200)"),
    )

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.importance: dict[int, np.ndarray] = {}
        self.num_train_examples: dict[int, float] = {}
        self.estimate_rounds: list[int] = []
        self.selections: dict[int, list[list[int]]] = {}
        self.train_tasks: dict[int, dict[int, int]] = {}
        self._node_start: ArrayRecord | None = None
        # Nodes that returned a trained model: they keep it in context.state, so
        # their train messages carry no start model (an error reply resets this).
        self._initialized: set[int] = set()
        self._estimate_asked: set[int] = set()

    # ------------------------------------------------------------ initialization
    def initialize(self, model: ArrayRecord, grid: Grid | None = None) -> ArrayRecord:
        """Pack S cluster models drawn independently at the scale of ``model``.

        They must start different: S copies of one model would fit every sample
        equally, so the first estimate would put all weight on cluster 0.
        """
        rng = np.random.default_rng(self.seed)
        return p.pack_clusters([random_like(model, rng) for _ in range(self.num_clusters)])

    # ----------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Keep the plain initial model (a node's own start), then the base's round."""
        if not p.is_packed(arrays):
            self._node_start = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def configure_centres(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Estimate u when due, draw K nodes per cluster, send one task per drawn node."""
        if (server_round - 1) % self.tau == 0 or not self.importance:
            self.estimate_importance(server_round, arrays, grid)
        else:
            # A node that joined since the last estimate is served now, not tau
            # rounds later; a node is asked this way once.
            self.estimate_importance(server_round, arrays, grid, only_new=True)
        if not self.importance:
            log(WARNING, "round %d: no node has importance weights; nothing to train",
                server_round)
            return []
        drawn = self.draw_per_cluster(server_round)
        models = p.unpack_clusters(arrays)
        contents: dict[int, RecordDict] = {}
        # A set: a node drawn by several clusters still gets one message.
        for node in sorted({n for picks in self.selections[server_round] for n in picks}):
            node_config = self.round_config(config, server_round)
            node_config[p.CFG_PERSISTENT] = True
            node_config[p.CFG_PROX_MU] = self.proximal_lambda
            node_config[p.CFG_CENTER_WEIGHTS] = self.importance[node].tolist()
            content = RecordDict({p.CENTERS: arrays, p.CONFIG: node_config})
            if node not in self._initialized:
                # The start of a node with no model of its own yet.
                content[p.ARRAYS] = (
                    self._node_start if self._node_start is not None
                    else models[int(np.argmax(self.importance[node]))]
                )
            contents[node] = content
        messages = self.build_messages(contents, MessageType.TRAIN)
        self.train_tasks[server_round] = dict(Counter(m.metadata.dst_node_id for m in messages))
        log(INFO, "configure_train: clusters drew %s nodes; %d distinct nodes train once each",
            [len(picks) for picks in drawn], len(messages))
        return messages

    def aggregate_centres(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Cluster s <- plain mean of the models returned by the nodes drawn for s."""
        models = p.unpack_clusters(self._current)
        replies = list(replies)
        # A node that failed may have lost its state (a restart): send it a start again.
        self._initialized -= {m.metadata.src_node_id for m in replies if m.has_error()}
        valid = self.check_replies(replies, models[0], "aggregate_train", trains=True)
        self._initialized |= {m.metadata.src_node_id for m in valid}
        if not valid:
            return None, None
        returned = {msg.metadata.src_node_id: msg for msg in valid}
        names = list(models[0].keys())
        new_models = []
        for s, drawn in enumerate(self.selections.get(server_round, [])):
            members = [returned[node] for node in drawn if node in returned]
            if not members:
                log(WARNING, "round %d: no model returned for cluster %d; it keeps its model",
                    server_round, s)
                new_models.append(models[s])
                continue
            weights = ([self.importance_mass(m.metadata.src_node_id, s) for m in members]
                       if self.importance_weighted_mean else None)
            new_models.append(_mean(members, names, weights))
        losses = train_losses(valid)
        metrics = MetricRecord(
            {
                p.M_TRAIN_LOSS: float(np.mean(losses)),
                "num-trained": len(valid),
                "drawn-per-cluster": [len(d) for d in self.selections.get(server_round, [])],
                "max-tasks-per-node": max(self.train_tasks.get(server_round, {}).values(),
                                          default=0),
            }
        )
        return p.pack_clusters(new_models), metrics

    # --------------------------------------------------------------- warm start
    def warm_start_nodes(self, grid: Grid) -> list[int]:
        """Every connected node trains its own model once from the initial model."""
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        return nodes

    def warm_start_fraction(self) -> float:
        """All nodes train in the warm start."""
        return 1.0

    def warm_start_config(self, config: ConfigRecord, server_round: int) -> ConfigRecord:
        """One local task on the node's persistent model (no proximal term)."""
        node_config = self.round_config(config, server_round)
        node_config[p.CFG_PERSISTENT] = True
        return node_config

    def configure_warm_start(
        self, server_round: int, model: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """The warm start's messages; records the tasks per node."""
        messages = super().configure_warm_start(server_round, model, config, grid)
        self.train_tasks[server_round] = dict(Counter(m.metadata.dst_node_id for m in messages))
        return messages

    def centres_from_groups(
        self, server_round: int, start: KMeansStart
    ) -> tuple[ArrayRecord, MetricRecord]:
        """Cluster s <- the plain mean of group s's models (a random draw for an empty one).

        Each node's group is its first importance weights (one-hot, floored at
        sigma) until the next estimate round: an estimate now would score centres
        that are means of one local task's models, which on little training fit
        every sample alike, and its tied counts would erase the groups.
        """
        for msg, group in zip(start.replies, start.groups, strict=True):
            self.importance_from_group(msg.metadata.src_node_id, group, num_examples(msg))
        names = list(start.model.keys())
        rng = np.random.default_rng(self.seed)
        models = [_mean(members, names) if members else random_like(start.model, rng)
                  for members in start.members()]
        metrics = MetricRecord(
            {
                p.M_TRAIN_LOSS: float(np.mean(train_losses(start.replies))),
                "num-trained": len(start.replies),
                "warm-start-group-sizes": start.sizes(),
                "max-tasks-per-node": max(self.train_tasks[server_round].values(), default=0),
            }
        )
        return p.pack_clusters(models), metrics

    # --------------------------------------------------------------- evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluate each sampled node's own persistent model on its test split."""
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        for msg in messages:
            msg.content.config_records[p.CONFIG][p.CFG_PERSISTENT] = True
        return messages

    def summary_fields(self) -> dict[str, Any]:
        """Final u per node, estimate rounds, draws and tasks per node per round."""
        return {
            "importance_weights": {
                str(node): u.tolist() for node, u in sorted(self.importance.items())
            },
            "importance_estimate_rounds": list(self.estimate_rounds),
            "init": self.init,
            "warm_start_groups": {
                str(node): group for node, group in sorted(self.warm_start_groups.items())
            },
            "selections": {
                str(r): picks for r, picks in sorted(self.selections.items())
            },
            "max_train_tasks_per_node": max(
                (count for tasks in self.train_tasks.values() for count in tasks.values()),
                default=0,
            ),
        }

    def scoring(self) -> Scoring:
        """u per node and the warm start's groups."""
        fields = self.summary_fields()
        return Scoring(soft_weights=fields["importance_weights"],
                       labellings={"warm_start_ari": fields["warm_start_groups"]})

    def summary(self) -> None:
        """Log FedSoft's settings."""
        log(INFO, "\t├──> FedSoft: S=%d | tau=%d | sigma=%g | K=%s | lambda=%g | init=%s",
            self.num_clusters, self.tau, self.sigma,
            "every node" if self.clients_per_cluster is None else self.clients_per_cluster,
            self.proximal_lambda, self.init)
        super().summary()
