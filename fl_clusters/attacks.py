"""Attack clients for simulations: who attacks, what an attacker sends, the backdoor's score.

A run config whose ``attack`` is not ``'none'`` makes a share of the simulated
clients (``attack-share``, of group ``attack-group`` when set) lie in every
training reply (docs/config.md):

* ``label-flip``: trains on its training data with every label ``y`` turned into
  ``num_classes - 1 - y``;
* ``sign-flip``: replies ``start - s * (trained - start)``, its update negated and
  scaled by ``s`` (``attack-scale``);
* ``scale``: model replacement, ``start + s * (trained - start)``;
* ``backdoor``: stamps a trigger (the bottom-right 3x3 pixels set to its data's
  largest value) on half of its training inputs, relabels them ``attack-target``,
  and boosts its update as ``scale`` does;
* ``sybil``: every attacker replies ``start + s * r * d``, ``d`` a unit direction
  drawn from (seed, round) only and ``r`` the length of the round's local SGD path
  at unit gradient norm (``lr x local-steps``, a gradient: 1), so that the sybils of
  a round that start from one model send the same arrays.

Who attacks is one deterministic rule (:func:`attacker_partitions`) of the run
config and the node's partition: each node calls it to know its role, the server
calls it to record the attackers in summary.json (:mod:`fl_clusters.attack_scores`).
Attacks run in simulations only: a node refuses a run config with an attack unless
it serves Flower's Ray simulation or a :class:`~fl_clusters.loopback.LoopbackGrid`
(:func:`in_simulation`), and the ServerApp refuses one on a deployment's grid.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid
from torch.utils.data import TensorDataset

from fl_clusters import loopback
from fl_clusters import protocol as p
from fl_clusters.client.backdoor import KEPT, split_tensors, stamp_trigger, trigger_value
from fl_clusters.client.queries import BACKDOOR_TARGET
from fl_clusters.config import ATTACKS, cached_run_config, parse_group_sizes
from fl_clusters.data.groups import client_groups
from fl_clusters.errors import FederationProblem
from fl_clusters.learner import TorchLearner

NONE = ATTACKS[0]
KINDS = ATTACKS[1:]
# Kinds that train on altered data; kinds that boost their update by attack-scale.
POISONED_DATA = ("label-flip", "backdoor")
BOOSTED = ("scale", "backdoor")
# Streams of the attacks' randomness, mixed with the run seed; far from the data's
# streams (fl_clusters.data.sampling), so no draw of the data is repeated here.
STREAM_ATTACKERS, STREAM_BACKDOOR, STREAM_SYBIL = 1001, 1002, 1003
BACKDOOR_SHARE = 0.5  # of the attacker's training inputs that carry the trigger
# The module of the Ray actor class that runs every ClientApp of Flower's simulation:
# a Ray worker imports it to build the actor; a deployed ClientApp never does.
RAY_ACTOR_MODULE = "flwr.simulation.ray_transport.ray_actor"


def attacker_partitions(
    seed: int, share: float, num_partitions: int,
    groups: Sequence[int] | None = None, group: int = -1,
) -> list[int]:
    """The attacking partitions: ``round(share * pool)`` of the pool, drawn from ``seed``.

    Parameters
    ----------
    seed : int
        The run seed; the draw has a stream of its own (:data:`STREAM_ATTACKERS`).
    share : float
        Share of the pool that attacks, rounded half up to whole partitions.
    num_partitions : int
        Partitions of the federation (``num-partitions``).
    groups : Sequence[int] | None
        Every partition's ground-truth group; needed when ``group`` >= 0.
    group : int
        The pool is the partitions of this group; -1: every partition.

    Returns
    -------
    list[int]
        The attackers' partition ids, sorted.
    """
    if group < 0:
        pool = np.arange(num_partitions)
    else:
        if groups is None or len(groups) != num_partitions:
            raise ValueError(f"attack-group={group} needs the group of each of the "
                             f"{num_partitions} partitions")
        pool = np.flatnonzero(np.asarray(groups) == group)
    count = math.floor(share * len(pool) + 0.5)
    rng = np.random.default_rng([seed, STREAM_ATTACKERS])
    return sorted(int(i) for i in rng.choice(pool, size=count, replace=False))


@lru_cache(maxsize=16)
def _attackers(
    seed: int, share: float, group: int, num_partitions: int, structure: str,
    num_groups: int, group_sizes: str,
) -> tuple[int, ...]:
    groups = None
    if group >= 0:
        # The data's own assignment of partitions to groups (fl_clusters.data.plan).
        groups = client_groups(structure, num_partitions, num_groups,
                               parse_group_sizes(group_sizes))
    return tuple(attacker_partitions(seed, share, num_partitions, groups, group))


def settings_attackers(settings: Mapping[str, Any], num_partitions: int) -> list[int]:
    """The attacking partitions of a run config (validated) over ``num_partitions``.

    What every node and the server call: the same keys give the same attackers.
    """
    if settings["attack"] == NONE:
        return []
    return list(_attackers(
        settings["seed"], settings["attack-share"], settings["attack-group"], num_partitions,
        settings["cluster-structure"], settings["num-groups"], settings["group-sizes"]))


def in_simulation() -> bool:
    """Whether this process serves simulated nodes: a Ray actor of Flower's simulation,
    or a :class:`~fl_clusters.loopback.LoopbackGrid` calling its ClientApp now."""
    return RAY_ACTOR_MODULE in sys.modules or loopback.delivering()


def simulation_grid(grid: Grid) -> bool:
    """Whether ``grid`` is a simulation's: Flower's ``InMemoryGrid`` or a LoopbackGrid."""
    return isinstance(grid, InMemoryGrid | loopback.LoopbackGrid)


def deployment_refusal(kind: str, where: str) -> str:
    """Why an attack does not run in a deployment, and the fix."""
    return (f"run-config key 'attack'={kind!r} is for simulations only (Flower's Ray "
            f"simulation or fl-clusters' in-process LoopbackGrid) and this {where} is "
            "deployed; set attack='none' and attack-share=0.0")


def backdoor_samples(
    x: torch.Tensor, y: torch.Tensor, target: int, value: float, rng: np.random.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` with :data:`BACKDOOR_SHARE` of the inputs stamped and relabelled ``target``."""
    x, y = x.clone(), y.clone()
    chosen = torch.from_numpy(
        rng.choice(len(y), size=math.floor(BACKDOOR_SHARE * len(y) + 0.5), replace=False))
    x[chosen] = stamp_trigger(x[chosen], value)
    y[chosen] = target
    return x, y


def _num_classes(learner: TorchLearner, x: torch.Tensor) -> int:
    """The model's output width (the labels are ``0..width-1``)."""
    learner.model.eval()  # one input through batch norm in training mode would raise
    with torch.no_grad():
        return int(learner.model(x[:1].to(learner.device)).shape[-1])


@lru_cache(maxsize=KEPT)
def _poisoned_learner(
    learner: TorchLearner, kind: str, target: int, seed: int, partition: int
) -> TorchLearner:
    """A learner on ``learner``'s model whose training split the attack altered.

    Kept per node: the split is the same every round (the backdoor's inputs are
    drawn once, from the seed and the partition).
    """
    x, y = split_tensors(learner, "train")
    if kind == "label-flip":
        x, y = x, _num_classes(learner, x) - 1 - y
    else:
        rng = np.random.default_rng([seed, STREAM_BACKDOOR, partition])
        x, y = backdoor_samples(x, y, target, trigger_value(learner), rng)
    # It only trains: its held-out split is left empty.
    return TorchLearner(learner.model, TensorDataset(x, y), TensorDataset(x[:0], y[:0]),
                        device=learner.device, loss_fn=learner.loss_fn)


def sybil_length(config: ConfigRecord, gradient: bool) -> float:
    """The norm of a sybil's update before ``attack-scale``, from the task's config only.

    The path of the round's local SGD steps at unit gradient norm: ``lr`` times
    ``local-steps`` (``local-epochs`` when it is 0); 1 for a gradient.
    """
    if gradient:
        return 1.0
    steps = int(config.get(p.CFG_STEPS, 0)) or int(config.get(p.CFG_EPOCHS, 1))  # type: ignore[arg-type]
    return float(config.get(p.CFG_LR, 0.1)) * steps  # type: ignore[arg-type]


def sybil_direction(
    seed: int, server_round: int, component: int, sizes: Sequence[int]
) -> list[np.ndarray]:
    """A unit direction drawn from (seed, round, component), cut into pieces of ``sizes``."""
    rng = np.random.default_rng([seed, STREAM_SYBIL, server_round, component])
    direction = rng.standard_normal(int(sum(sizes)))
    direction /= np.linalg.norm(direction)
    return np.split(direction, np.cumsum(sizes)[:-1])


@dataclass(frozen=True)
class Attack:
    """What one attacking node does to its training and its reply.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    scale : float
        ``attack-scale``.
    target : int
        ``attack-target`` (the backdoor's class).
    seed : int
        The run seed (the backdoor's inputs, the sybils' direction).
    partition : int
        The node's partition id.
    """

    kind: str
    scale: float
    target: int
    seed: int
    partition: int

    def trainer(self, learner: TorchLearner) -> TorchLearner:
        """The learner that trains: ``learner`` on the attacked training data."""
        if self.kind not in POISONED_DATA:
            return learner
        return _poisoned_learner(learner, self.kind, self.target, self.seed, self.partition)

    def poison(
        self, start: ArrayRecord | None, trained: ArrayRecord, config: ConfigRecord,
        component: int = 0,
    ) -> ArrayRecord:
        """The model the attacker replies instead of ``trained``.

        ``start`` is the model the training started from; ``None``: ``trained`` is
        a gradient, the update itself. Arrays that are not floats (counters) keep
        the trained values (a sybil's, the start's). ``component`` numbers a
        mixture's components, each with its own sybil direction.
        """
        if self.kind == "label-flip":
            return trained
        names = list(trained.keys())
        new = [trained[name].numpy() for name in names]
        old = [np.zeros_like(a) if start is None else start[name].numpy()
               for name, a in zip(names, new, strict=True)]
        floats = [np.issubdtype(a.dtype, np.floating) for a in new]
        updates = [a.astype(np.float64) - b for a, b, f in zip(new, old, floats, strict=True)
                   if f]
        crafted = iter(self._crafted(updates, config, component, start is None))
        values = [(b + next(crafted)).astype(a.dtype) if f else (b if self.kind == "sybil" else a)
                  for a, b, f in zip(new, old, floats, strict=True)]
        return p.numpy_to_record(names, values)

    def _crafted(
        self, updates: list[np.ndarray], config: ConfigRecord, component: int, gradient: bool
    ) -> list[np.ndarray]:
        """The update the attacker sends in place of each of its float arrays' ``updates``."""
        if self.kind == "sign-flip":
            return [-self.scale * u for u in updates]
        if self.kind in BOOSTED:
            return [self.scale * u for u in updates]
        server_round = int(config.get(p.CFG_ROUND, 0))  # type: ignore[arg-type]
        pieces = sybil_direction(self.seed, server_round, component, [u.size for u in updates])
        length = self.scale * sybil_length(config, gradient)
        return [length * d.reshape(u.shape) for d, u in zip(pieces, updates, strict=True)]

    def poison_components(self, message: Message, reply: Message) -> Message:
        """A mixture reply (FedEM) whose every component is poisoned from the one sent."""
        starts = p.unpack_clusters(message.content.array_records[p.CLUSTERS])
        trained = p.unpack_clusters(reply.content.array_records[p.CLUSTERS])
        config = message.content.config_records.get(p.CONFIG, ConfigRecord())
        reply.content[p.CLUSTERS] = p.pack_clusters([
            self.poison(s, t, config, j) for j, (s, t) in enumerate(zip(starts, trained,
                                                                        strict=True))])
        return reply


@dataclass(frozen=True)
class NodeRole:
    """A simulated node's part in a run with attack clients.

    Parameters
    ----------
    kind : str
        The run's ``attack``.
    target : int
        The run's ``attack-target``.
    num_partitions : int
        The federation's partitions (the server's count for the attackers' rule).
    attack : Attack | None
        What the node does as an attacker; ``None``: it is honest.
    """

    kind: str
    target: int
    num_partitions: int
    attack: Attack | None

    @property
    def backdoor_target(self) -> int | None:
        """The class whose backdoor success the node scores (backdoor runs only)."""
        return self.target if self.kind == "backdoor" else None

    def report_metadata(self) -> dict[str, Any]:
        """What the final report adds: the federation's size, the node's role, the target."""
        extra: dict[str, Any] = {"num-partitions": self.num_partitions,
                                 "attacker": int(self.attack is not None)}
        if self.backdoor_target is not None:
            extra[BACKDOOR_TARGET] = self.backdoor_target
        return extra


def node_role(context: Context, overrides: Mapping[str, Any] | None = None) -> NodeRole | None:
    """This node's role under the run config's attack; ``None`` when the run has none.

    Raises
    ------
    FederationProblem
        An attack outside a simulation (:func:`in_simulation`), or a node config
        without ``partition-id`` and ``num-partitions``: every node says the same,
        so the handshake stops the run before round 1.
    """
    settings = cached_run_config({**context.run_config, **(overrides or {})})
    kind = settings["attack"]
    if kind == NONE:
        return None
    if not in_simulation():
        raise FederationProblem(deployment_refusal(kind, "ClientApp"))
    try:
        partition = int(context.node_config["partition-id"])
        num_partitions = int(context.node_config["num-partitions"])
    except KeyError as err:
        raise FederationProblem(f"attack={kind!r} needs the simulation's node config "
                                f"key {err.args[0]!r}") from None
    attack = None
    if partition in settings_attackers(settings, num_partitions):
        attack = Attack(kind, settings["attack-scale"], settings["attack-target"],
                        settings["seed"], partition)
    return NodeRole(kind, settings["attack-target"], num_partitions, attack)
