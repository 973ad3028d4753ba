"""IFCA: the Iterative Federated Clustering Algorithm (Ghosh et al., NeurIPS 2020)."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.strategies.base import ClusteredStrategy

MODES = ("model", "gradient")


def random_like(model: ArrayRecord, rng: np.random.Generator) -> ArrayRecord:
    """Draw a fresh model with the same shapes and per-array scale as ``model``.

    Each floating array is redrawn uniformly in ``+-sqrt(3) * std`` of the given
    array (torch's default initializations are uniform, so this matches their
    scale); constant arrays (zero biases, counters) are kept. IFCA needs k models
    that start different: k copies of one model make every client pick cluster 0.
    """
    names = list(model.keys())
    arrays = []
    for name in names:
        values = model[name].numpy()
        std = float(values.std()) if np.issubdtype(values.dtype, np.floating) else 0.0
        if std > 0.0:
            bound = np.sqrt(3.0) * std
            values = rng.uniform(-bound, bound, size=values.shape).astype(values.dtype)
        arrays.append(values)
    return p.numpy_to_record(names, arrays)


def head_keys(model: ArrayRecord, head_layers: int) -> list[str]:
    """Names of the arrays of the last ``head_layers`` layers (a layer = a name prefix)."""
    layers: list[str] = []
    for name in model:
        layer = name.rsplit(".", 1)[0]
        if layer not in layers:
            layers.append(layer)
    if head_layers > len(layers):
        raise ValueError(
            f"head_layers={head_layers} but the model has only {len(layers)} layers {layers}"
        )
    chosen = set(layers[len(layers) - head_layers:])
    return [name for name in model if name.rsplit(".", 1)[0] in chosen]


class IFCA(ClusteredStrategy):
    """IFCA with model averaging or gradient averaging, and optional weight sharing.

    Every round the sampled clients receive all k cluster models, take the one with
    the lowest loss on their training data, and return either a model trained for
    tau local steps from it (model averaging) or the gradient at it (gradient
    averaging). The server averages per chosen cluster; a cluster no client chose
    keeps its model.

    Parameters
    ----------
    num_clusters : int (default: 4)
        k, the number of cluster models.
    mode : str (default: "model")
        ``"model"`` (option II, model averaging) or ``"gradient"`` (option I).
    server_lr : float (default: 0.1)
        Gradient averaging step size gamma (unused for model averaging).
    head_layers : int (default: 0)
        Weight sharing: 0 clusters the whole model; h > 0 clusters only the last h
        layers and trains the rest as one shared body with FedAvg over all clients.
    restarts : int (default: 10)
        Random initializations to try; the one whose first loss-based assignment
        is most balanced across clusters is kept. Each costs one query round (no
        training). One initialization often lets two groups share a model while a
        cluster stays empty for good (seen on 4-rotation digits: ARI 0.54 and 0.68
        with one, 1.0 on seeds 0-3 with ten).
    fraction_train, fraction_evaluate, min_available_nodes, seed
        See :class:`~fl_clusters.strategies.base.ClusteredStrategy`.
    awcfl_beta, mcfl, mcfl_feature_samples
        AWCFL and MCFL options; see
        :class:`~fl_clusters.strategies.base.ClusteredStrategy`.
    """

    def __init__(
        self,
        num_clusters: int = 4,
        *,
        mode: str = "model",
        server_lr: float = 0.1,
        head_layers: int = 0,
        restarts: int = 10,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_available_nodes: int = 2,
        awcfl_beta: float = 0.0,
        mcfl: bool = False,
        mcfl_feature_samples: int = 32,
        seed: int = 0,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_available_nodes=min_available_nodes,
            awcfl_beta=awcfl_beta,
            mcfl=mcfl,
            mcfl_feature_samples=mcfl_feature_samples,
            seed=seed,
        )
        if num_clusters < 1:
            raise ValueError(f"num_clusters={num_clusters} must be >= 1")
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is unknown; allowed: {', '.join(MODES)}")
        if head_layers < 0 or restarts < 1:
            raise ValueError(
                f"head_layers={head_layers} must be >= 0 and restarts={restarts} >= 1"
            )
        self.num_clusters = num_clusters
        self.mode = mode
        self.server_lr = server_lr
        self.head_layers = head_layers
        self.restarts = restarts
        self._current = ArrayRecord()

    def assignment_for(self, node_id: int) -> int | None:
        """IFCA clients choose their cluster themselves, by loss, every time."""
        return None

    # ------------------------------------------------------------ initialization
    def initialize(self, model: ArrayRecord, grid: Grid | None = None) -> ArrayRecord:
        """Pack k randomly initialized cluster models (sharing a body if asked).

        With ``restarts`` > 1 and a grid, each candidate initialization is scored by
        how evenly the sampled clients' loss-based choices spread over the clusters.
        """
        candidates = [self._draw(model, self.seed + r) for r in range(self.restarts)]
        if len(candidates) == 1 or grid is None:
            return candidates[0]
        nodes = self.sample(grid, self.fraction_train)
        best, best_score = candidates[0], -1.0
        for r, packed in enumerate(candidates):
            replies = self.send(
                grid,
                self.build_messages(
                    {n: RecordDict({p.CLUSTERS: packed, p.CONFIG: ConfigRecord()}) for n in nodes},
                    p.QUERY_CLUSTER_LOSSES,
                )
            )
            valid = self.check_replies(replies, None, f"ifca restart {r}")
            if not valid:
                # Every sampled client failed: the other candidates would fail the
                # same way, so asking again only multiplies the failures.
                log(WARNING, "IFCA restart %d: no valid reply; skipping the remaining "
                    "restarts and keeping the best candidate so far", r)
                return best
            choices = [
                int(np.argmin(m.content.metric_records[p.METRICS]["cluster-losses"]))  # type: ignore[arg-type]
                for m in valid
            ]
            counts = np.bincount(choices, minlength=self.num_clusters) if choices else np.zeros(1)
            shares = counts[counts > 0] / max(counts.sum(), 1)
            score = float(-(shares * np.log(shares)).sum())  # entropy: balanced is best
            log(INFO, "IFCA restart %d: first-round cluster sizes %s", r, counts.tolist())
            if score > best_score:
                best, best_score = packed, score
        return best

    def _draw(self, model: ArrayRecord, seed: int) -> ArrayRecord:
        rng = np.random.default_rng(seed)
        if self.head_layers == 0:
            return p.pack_clusters([random_like(model, rng) for _ in range(self.num_clusters)])
        heads = head_keys(model, self.head_layers)
        body, head = p.split_shared(model, heads)
        return p.pack_clusters(
            [random_like(head, rng) for _ in range(self.num_clusters)],
            shared=random_like(body, rng),
        )

    # ----------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send all k cluster models to the sampled nodes."""
        if not p.is_packed(arrays):
            arrays = self.initialize(arrays, grid)
        elif p.num_packed_clusters(arrays) != self.num_clusters:
            raise ValueError(
                f"initial_arrays pack {p.num_packed_clusters(arrays)} clusters but "
                f"num_clusters={self.num_clusters}"
            )
        self._current = arrays
        if self.fraction_train == 0.0:
            return []
        node_config = ConfigRecord(dict(config))
        node_config[p.CFG_ROUND] = server_round
        if self.mode == "gradient":
            node_config[p.CFG_RETURN] = "gradient"
            self.server_lr = float(config.get(p.CFG_LR, self.server_lr))  # type: ignore[arg-type]
        record = RecordDict({p.CLUSTERS: arrays, p.CONFIG: node_config})
        nodes = self.sample(grid, self.fraction_train)
        log(INFO, "configure_train: %d nodes get %d cluster models", len(nodes), self.num_clusters)
        return self.build_messages(dict.fromkeys(nodes, record), MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the returned models (or apply the mean gradient) per chosen cluster."""
        models = p.unpack_clusters(self._current)
        valid = []
        for msg in self.check_replies(replies, models[0], "aggregate_train"):
            cluster = int(msg.content.metric_records[p.METRICS].get(p.M_CLUSTER, -1))  # type: ignore[arg-type]
            if not 0 <= cluster < self.num_clusters:
                self.rejected_replies += 1
                log(WARNING, "aggregate_train: rejected reply from node %d: cluster-id %d "
                    "outside [0, %d)", msg.metadata.src_node_id, cluster, self.num_clusters)
                continue
            self.assignments[msg.metadata.src_node_id] = cluster
            valid.append((cluster, msg))
        if not valid:
            return None, None
        heads = head_keys(models[0], self.head_layers) if self.head_layers else list(models[0])
        body = [name for name in models[0] if name not in heads]
        new_heads = []
        for j, model in enumerate(models):
            members = [msg for c, msg in valid if c == j]
            _, head = p.split_shared(model, heads)
            new_heads.append(self._step(head, members, heads) if members else head)
        new_heads = self.mix_clusters(new_heads)
        shared = None
        if body:
            old_body, _ = p.split_shared(models[0], heads)
            shared = self._step(old_body, [msg for _, msg in valid], body)
        packed = p.pack_clusters(new_heads, shared=shared)
        sizes = np.bincount([c for c, _ in valid], minlength=self.num_clusters)
        losses = [float(msg.content.metric_records[p.METRICS][p.M_TRAIN_LOSS]) for _, msg in valid]  # type: ignore[arg-type]
        log(INFO, "round %d: IFCA cluster sizes %s", server_round, sizes.tolist())
        metrics = MetricRecord(
            {
                p.M_TRAIN_LOSS: float(np.mean(losses)),
                "cluster-sizes": sizes.astype(int).tolist(),
                "num-clusters": int((sizes > 0).sum()),
            }
        )
        return packed, metrics

    def _step(self, old: ArrayRecord, members: list[Message], keys: list[str]) -> ArrayRecord:
        """New arrays for ``keys``: members' average model, or a step along their mean gradient."""
        average = self.average_models(members, keys)
        if self.mode == "model":
            return average
        return p.numpy_to_record(
            keys,
            [
                (old[k].numpy() - self.server_lr * average[k].numpy()).astype(old[k].numpy().dtype)
                for k in keys
            ],
        )

    def summary(self) -> None:
        """Log IFCA's settings."""
        log(INFO, "\t├──> IFCA: k=%d | mode=%s | head layers=%d | restarts=%d",
            self.num_clusters, self.mode, self.head_layers, self.restarts)
        super().summary()
