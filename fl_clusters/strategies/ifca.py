"""IFCA: the Iterative Federated Clustering Algorithm (Ghosh et al., NeurIPS 2020)."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    cluster_update,
    group_by_kmeans,
    most_balanced_restart,
    unit_rows,
    widest_group,
)
from fl_clusters.drawing import draw_clusters
from fl_clusters.strategies.kit import (
    FRACTION_TRAIN,
    INTER_CLUSTER,
    AWCFLOption,
    Behaviour,
    CentresFromStart,
    InnerAggregationOption,
    KMeansStart,
    MCFLOption,
    Param,
    RecipeValue,
    num_clusters_param,
    num_examples,
    reply_layers,
    reply_updates,
    train_losses,
)

# The paper, as the sources below cite it (docs/paper-fidelity.md).
SOURCE = "Ghosh et al. 2020 (seed 001)"


class IFCA(CentresFromStart, AWCFLOption, MCFLOption, InnerAggregationOption):
    """IFCA with model averaging or gradient averaging, and optional weight sharing.

    Every round the sampled clients receive all k cluster models, take the one with
    the lowest loss on their training data, and return either a model trained for
    tau local steps from it (model averaging) or the gradient at it (gradient
    averaging). The server averages per chosen cluster; a cluster no client chose
    keeps its model, and one that no client chose for ``reseed_after`` rounds in a
    row is re-seeded from the cluster whose members disagree most.
    """

    name = "ifca"
    paper_revision = 2
    paper = "Ghosh et al., NeurIPS 2020"
    client_needs = 'nothing more; `mode="gradient"` is refused (below)'
    params = (
        num_clusters_param(4,
                           doc="k, the number of cluster models."),
        Param("mode", "model", "str", "IFCA model or gradient averaging",
              choices=("model", "gradient"),
              doc='``"model"`` (option II, model averaging) or ``"gradient"`` (option I).'),
        Param("server_lr", 0.5, "float", "IFCA gradient mode: server step gamma", above=0.0,
              doc="Gradient averaging step size gamma (unused for model averaging), > 0."),
        Param("aggregation", "weighted", "str",
              "IFCA: example-weighted means, or the paper's unweighted updates",
              choices=("weighted", "paper"), paper="paper",
              why="a cluster's model weighs each member by its examples, as FedAvg does; the "
              "paper's plain means let a small client count as much as a large one",
              source=f"{SOURCE}, Algorithm 1: theta_j <- mean of the models (option II) or "
              "theta_j - gamma/m x the sum of the gradients (option I)",
              doc='``"weighted"``: a cluster becomes its members\' example-weighted mean model '
              '(or steps along their example-weighted mean gradient). ``"paper"``: the '
              "paper's updates, unweighted: option II takes the plain mean of the members' "
              "models, option I steps ``theta_j - gamma / m * sum of cluster j's gradients`` "
              "with m the clients that answered this round."),
        Param("head_layers", 0, "int", "IFCA weight sharing: clustered last layers", low=0,
              doc="Weight sharing: 0 clusters the whole model; h > 0 clusters only the last h "
              "layers and trains the rest as one shared body with FedAvg over all clients. "
              "The body starts from the initial model (a pretrained body is kept)."),
        Param("init", "local-kmeans", "str",
              "IFCA start: k-means of a first local round, or the paper's random models",
              choices=("local-kmeans", "random"), paper="random",
              why="k random models leave most clients choosing the same one when the groups "
              "differ by a label permutation or rotation; k-means of one local round's "
              "updates starts each cluster inside a group (docs/clustering-defaults.md)",
              source=f"{SOURCE}, sections Algorithm and Experiments: k randomly "
              "initialised models",
              doc='``"local-kmeans"``: in the first round every sampled client trains the '
              "initial model for ``init_steps`` local steps, k-means over their output-layer "
              "updates (less the mean row, unit norm) groups them, and cluster j starts as "
              "the mean of group j's models: one round that sends one model per client, and "
              'the groups follow the data whatever its structure. ``"random"``: the paper\'s '
              "k random models (``restarts`` of them tried)."),
        Param("restarts", 1, "int",
              "IFCA random initializations to try (ifca-init='random'; most balanced wins)",
              low=1, paper=10,
              source=f"{SOURCE}, section Experiments: 'random initialisation and a few "
              "restarts suffice'; its synthetic runs draw 10 initialisations",
              why="the default start is local-kmeans, to which restarts do not apply; one "
              "draw keeps a random start to one model per node",
              doc='With ``init="random"``: random initializations to try; the one whose first '
              "loss-based assignment is most balanced across clusters is kept. All are "
              "scored in one query that sends each sampled client the initial model and the "
              "candidates' seeds (the client draws the candidates itself)."),
        Param("init_steps", 100, "int",
              "IFCA local-kmeans start: local SGD steps of the first round", low=1,
              doc="Local SGD steps of the ``local-kmeans`` round, >= 1: enough for the local "
              "models to move away from the random start towards their own data, so that "
              "groups (label skew included) separate (docs/clustering-defaults.md)."),
        Param("reseed_after", 3, "int",
              "IFCA: re-seed a cluster no client chose for this many rounds (0 = never)", low=0,
              paper=0, why="a cluster no client chooses never trains again in the paper's "
              "rule; re-seeding it from the widest cluster gives it a group to win",
              source=f"{SOURCE}, Algorithm 1: a cluster no client chose keeps its model",
              doc="A cluster no client chose for this many rounds in a row is re-seeded: the "
              "members of the cluster with the widest spread of updates are split in two by "
              "2-means and each side's mean becomes one of the two models. 0 never re-seeds."),
        FRACTION_TRAIN,
        *INTER_CLUSTER,
    )
    behaviours = (
        Behaviour(
            "restart_choice", paper_rule="",
            robust_rule="of the restarts' random draws, the one whose first loss-based "
            "assignment spreads the sampled clients most evenly over the clusters is kept",
            why="a draw that leaves clusters empty at the first choice rarely recovers; the "
            "balance is read from the clients' training losses, with no label of a test "
            "split",
            source=f"{SOURCE}, section Experiments: restarts are named, not how one is "
            "chosen (its synthetic runs count a success when any of 10 draws reaches the "
            "true parameters, which a run cannot know)"),
    )
    recipe = (
        RecipeValue("optimizer", "plain SGD", f"{SOURCE}, Algorithm 1: tau local SGD steps "
                    "(LocalUpdate)"),
        RecipeValue("lr", 0.1, f"{SOURCE}, section Experiments (rotated MNIST): step size "
                    "gamma = 0.1"),
        RecipeValue("local-steps", 10, f"{SOURCE}, section Experiments (rotated MNIST): tau "
                    "= 10"),
        RecipeValue("fraction-train", 1.0, f"{SOURCE}, section Experiments (rotated MNIST): "
                    "full participation, M_t = [m]"),
        RecipeValue("num-rounds", 300, "the authors' code (rotated MNIST: 300 rounds), as "
                    "ALGORITHMS.md digests it"),
        RecipeValue("batch-size", "full batch", "the authors' code (rotated MNIST: 10 local "
                    "full-batch steps on n = 100 images a client), as ALGORITHMS.md digests it",
                    not_applied="batch-size is a count, and a client's training set here is "
                    "not the authors' 100 images: no one number is a full batch on every "
                    "client"),
    )

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        if self.inner is not None and self.mode == "gradient":
            raise ValueError(
                "IFCA mode 'gradient' (ifca-mode) steps along the members' mean gradient; an "
                "inner aggregation aggregates models: use mode 'model' with it")
        self.reseeds: list[tuple[int, int, int]] = []
        self._idle_rounds = np.zeros(self.num_clusters, dtype=np.int64)

    def assignment_for(self, node_id: int) -> int | None:
        """IFCA clients choose their cluster themselves, by loss, every time."""
        return None

    # ------------------------------------------------------------ initialization
    def initialize(self, model: ArrayRecord, grid: Grid | None = None) -> ArrayRecord:
        """Pack k randomly drawn cluster models around the initial model's body.

        With ``restarts`` > 1 and a grid, each candidate initialization is scored by
        how evenly the sampled clients' loss-based choices spread over the clusters.
        All candidates are scored in one query that carries the initial model and
        the candidates' seeds: each node draws them itself
        (:func:`~fl_clusters.drawing.draw_clusters`), so the restarts move one
        model per node, not ``restarts`` x k.
        """
        seeds = [self.seed + r for r in range(self.restarts)]
        if len(seeds) == 1 or grid is None:
            return self._draw(model, seeds[0])
        nodes = self.sample(grid, self.fraction_train)
        config = ConfigRecord({
            p.CFG_RESTART_SEEDS: seeds,
            p.CFG_NUM_CLUSTERS: self.num_clusters,
            p.CFG_HEAD_LAYERS: self.head_layers,
        })
        record = RecordDict({p.ARRAYS: model, p.CONFIG: config})
        replies = self.send(grid, self.broadcast(nodes, record, p.QUERY_CLUSTER_LOSSES))
        losses = {p.M_CLUSTER_LOSSES: p.MetricField(length=self.restarts * self.num_clusters)}
        valid = self.check_replies(replies, None, "ifca restarts", losses, trains=False)
        if not valid:
            log(WARNING, "IFCA restarts: no valid reply; keeping the first candidate")
            return self._draw(model, seeds[0])
        table = np.array([
            m.content.metric_records[p.METRICS][p.M_CLUSTER_LOSSES] for m in valid
        ], dtype=float).reshape(len(valid), self.restarts, self.num_clusters)
        best, counts = most_balanced_restart(table)
        for r, sizes in enumerate(counts):
            log(INFO, "IFCA restart %d: first-round cluster sizes %s", r, sizes.tolist())
        return self._draw(model, seeds[best])

    def _draw(self, model: ArrayRecord, seed: int) -> ArrayRecord:
        return draw_clusters(model, self.num_clusters, self.head_layers, seed)

    def centres_from_groups(
        self, server_round: int, start: KMeansStart
    ) -> tuple[ArrayRecord, MetricRecord]:
        """Cluster j's head <- group j's update; the shared body <- every reply's."""
        model, valid = start.model, start.replies
        heads, body = self._split_keys(model)
        new_heads = [self._step(server_round, j, p.split_shared(model, heads)[1], group,
                                len(valid)) if group else None
                     for j, group in enumerate(start.members())]
        if any(head is None for head in new_heads):
            log(WARNING, "round %d: IFCA warm start: k-means left clusters %s empty; they "
                "start from a random draw", server_round,
                [j for j, head in enumerate(new_heads) if head is None])
            drawn = p.unpack_clusters(self._draw(model, self.seed))
            new_heads = [p.split_shared(drawn[j], heads)[1] if head is None else head
                         for j, head in enumerate(new_heads)]
        shared = self._step(server_round, -1, p.split_shared(model, heads)[0], valid,
                            len(valid)) if body else None
        return p.pack_clusters(new_heads, shared=shared), self._metrics(valid, start.sizes())

    def _split_keys(self, model: ArrayRecord) -> tuple[list[str], list[str]]:
        """The keys of the clustered head and of the shared body (none without sharing)."""
        heads = p.head_keys(model, self.head_layers) if self.head_layers else list(model)
        return heads, [name for name in model if name not in heads]

    def _metrics(self, valid: list[Message], sizes: list[int]) -> MetricRecord:
        """A training round's metrics: mean train loss, cluster sizes, clusters in use."""
        return MetricRecord(
            {
                p.M_TRAIN_LOSS: float(np.mean(train_losses(valid))),
                "cluster-sizes": [int(size) for size in sizes],
                "num-clusters": sum(1 for size in sizes if size > 0),
            }
        )

    # ----------------------------------------------------------------- training
    def configure_centres(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send all k cluster models to the sampled nodes."""
        node_config = self.round_config(config, server_round)
        if self.mode == "gradient":
            node_config[p.CFG_RETURN] = "gradient"
        record = RecordDict({p.CLUSTERS: arrays, p.CONFIG: node_config})
        nodes = self.sample(grid, self.fraction_train)
        log(INFO, "configure_train: %d nodes get %d cluster models", len(nodes), self.num_clusters)
        return self.broadcast(nodes, record, MessageType.TRAIN)

    def aggregate_centres(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the returned models (or apply the gradients) per chosen cluster."""
        models = p.unpack_clusters(self._current)
        valid = self._chosen_clusters(replies, models[0])
        if not valid:
            return None, None
        heads, body = self._split_keys(models[0])
        members = [[msg for c, msg in valid if c == j] for j in range(self.num_clusters)]
        old_heads = [p.split_shared(model, heads)[1] for model in models]
        new_heads = [
            self._step(server_round, j, head, group, len(valid)) if group else head
            for j, (head, group) in enumerate(zip(old_heads, members, strict=True))
        ]
        self._reseed_idle(server_round, old_heads, new_heads, members, heads, len(valid))
        new_heads = self.mix_clusters(new_heads, active=[j for j, g in enumerate(members) if g])
        shared = None
        if body:
            old_body, _ = p.split_shared(models[0], heads)
            shared = self._step(server_round, -1, old_body, [msg for _, msg in valid], len(valid))
        sizes = np.bincount([c for c, _ in valid], minlength=self.num_clusters)
        log(INFO, "round %d: IFCA cluster sizes %s", server_round, sizes.tolist())
        metrics = self._metrics([msg for _, msg in valid], sizes.tolist())
        metrics["reseeds"] = len(self.reseeds)
        return p.pack_clusters(new_heads, shared=shared), metrics

    def _chosen_clusters(
        self, replies: Iterable[Message], reference: ArrayRecord
    ) -> list[tuple[int, Message]]:
        """The valid replies with the cluster each node chose; records the choices."""
        valid = []
        # A client offered a single model reports no cluster-id: it can only be 0.
        missing = 0 if self.num_clusters == 1 else -1
        fields = {**p.TRAIN_FIELDS, p.M_CLUSTER: p.cluster_id_field(self.num_clusters)}
        for msg in self.check_replies(replies, reference, "aggregate_train", fields,
                                      trains=True):
            cluster = int(msg.content.metric_records[p.METRICS].get(p.M_CLUSTER, missing))  # type: ignore[arg-type]
            if not 0 <= cluster < self.num_clusters:
                self.rejected_replies += 1
                log(WARNING, "aggregate_train: rejected reply from node %d: cluster-id %d "
                    "outside [0, %d)", msg.metadata.src_node_id, cluster, self.num_clusters)
                continue
            self.assignments[msg.metadata.src_node_id] = cluster
            valid.append((cluster, msg))
        return valid

    def _reseed_idle(
        self,
        server_round: int,
        old_heads: list[ArrayRecord],
        new_heads: list[ArrayRecord],
        members: list[list[Message]],
        keys: list[str],
        num_replies: int,
    ) -> None:
        """Re-seed, in place, clusters that no client chose for ``reseed_after`` rounds.

        The donor is the cluster whose members' updates spread most; 2-means over
        its unit updates splits them, one side keeps the donor, the other side's
        model becomes the idle cluster. Keeping an idle cluster's stale model
        instead lets two groups share one model for the rest of the run.
        """
        chosen = np.array([bool(group) for group in members])
        self._idle_rounds = np.where(chosen, 0, self._idle_rounds + 1)
        if self.reseed_after == 0:
            return
        for idle in np.flatnonzero(self._idle_rounds >= self.reseed_after):
            updates = [
                self._head_updates(group, old_heads[j], keys) if len(group) >= 2
                else np.zeros((0, 1))
                for j, group in enumerate(members)
            ]
            donor = widest_group(updates)
            if donor is None:
                return
            sides = group_by_kmeans(unit_rows(updates[donor]), 2, self.seed)
            if sides.min() == sides.max():
                return
            group = members[donor]
            stay = [m for m, side in zip(group, sides, strict=True) if side == 0]
            move = [m for m, side in zip(group, sides, strict=True) if side == 1]
            self.forget_inner(int(idle))
            new_heads[donor] = self._step(server_round, donor, old_heads[donor], stay,
                                          num_replies, again=True)
            new_heads[idle] = self._step(server_round, int(idle), old_heads[donor], move,
                                         num_replies)
            members[donor], members[idle] = stay, move
            self._idle_rounds[idle] = 0
            self.reseeds.append((server_round, int(idle), int(donor)))
            log(INFO, "round %d: IFCA re-seeded cluster %d (no client for %d rounds) by "
                "splitting cluster %d into %d + %d clients", server_round, idle,
                self.reseed_after, donor, len(stay), len(move))

    def _head_updates(
        self, group: list[Message], start: ArrayRecord, keys: list[str]
    ) -> np.ndarray:
        """The members' flattened updates of ``keys`` (their gradients in gradient mode)."""
        if self.mode == "gradient":
            return np.stack([
                np.concatenate([m.content.array_records[p.ARRAYS][k].numpy().ravel() for k in keys])
                for m in group
            ]).astype(np.float64)
        return reply_updates(group, p.numpy_to_record(keys, [start[k].numpy() for k in keys]))

    def _step(
        self, server_round: int, cluster: int, old: ArrayRecord, members: list[Message],
        num_replies: int, *, again: bool = False,
    ) -> ArrayRecord:
        """New arrays for ``old``'s keys from the members' models, or a step along their
        gradients; an inner aggregation aggregates the models of cluster ``cluster``
        (-1: the layers every cluster shares).

        ``num_replies`` is the paper's m, the clients that answered this round;
        ``again``: see :meth:`aggregate_cluster`.
        """
        keys = list(old.keys())
        if self.inner is not None:
            return self.aggregate_cluster(server_round, cluster, old, members,
                                          weighted=self.aggregation == "weighted", again=again)
        layers = cluster_update(
            [old[k].numpy() for k in keys], reply_layers(members, keys),
            [num_examples(m) for m in members], mode=self.mode, aggregation=self.aggregation,
            server_lr=self.server_lr, num_replies=num_replies,
        )
        return p.numpy_to_record(keys, layers)

    def summary_fields(self) -> dict[str, Any]:
        """Initialization and re-seeding: what the run's clusters started from."""
        return {
            **super().summary_fields(),
            "ifca_init": self.init,
            "init_groups": {str(node): group for node, group in self.warm_start_groups.items()},
            "reseeds": [list(r) for r in self.reseeds],
            "num_reseeds": len(self.reseeds),
        }

    def summary(self) -> None:
        """Log IFCA's settings."""
        log(INFO, "\t├──> IFCA: k=%d | mode=%s | aggregation=%s | server lr=%.4g | head "
            "layers=%d | init=%s (restarts %d, %d steps) | re-seed after %d idle rounds",
            self.num_clusters, self.mode, self.aggregation, self.server_lr, self.head_layers,
            self.init, self.restarts, self.init_steps, self.reseed_after)
        super().summary()
