"""The fl-clusters ClientApp: local SGD, proximal updates, loss-based cluster choice.

The handlers are written against :class:`~fl_clusters.learner.TorchLearner`, so they
serve our own data and models (``app`` below) and any Flower user's model and data
alike: call :func:`register_handlers` on your own ``ClientApp`` with a function that
builds a learner from the ``Context``. What each message does lives in the client
core, :mod:`fl_clusters.client`; docs/protocol.md describes the messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from fl_clusters.attacks import NodeRole, node_role
from fl_clusters.client.blocks import serve_block
from fl_clusters.client.fedem import fedem_evaluate, fedem_train, is_mixture
from fl_clusters.client.node_data import check_node, learner_for, node_metadata
from fl_clusters.client.queries import ClientNode, no_metadata, register_queries
from fl_clusters.client.replies import evaluate_reply, train_reply
from fl_clusters.learner import TorchLearner
from fl_clusters.placement import record_training
from fl_clusters.ray_env import pass_ray_messages_inline

LearnerFactory = Callable[[Context], TorchLearner]
MetadataFactory = Callable[[Context], Mapping[str, Any]]
RoleFactory = Callable[[Context], NodeRole | None]


def no_role(context: Context) -> None:
    """Every node honest: a run without attack clients."""


def train_as(role: NodeRole | None, learner: TorchLearner, message: Message,
             context: Context) -> Message:
    """The train reply of a node in ``role``: an honest node's, or what its attack makes it."""
    attack = None if role is None else role.attack
    if not is_mixture(message):
        return train_reply(learner, message, context, attack)
    if attack is None:
        return fedem_train(learner, message, context)
    return attack.poison_components(message, fedem_train(attack.trainer(learner), message,
                                                         context))


def role_aware_node(
    learner_fn: LearnerFactory, metadata_fn: MetadataFactory,
    check_fn: Callable[[Context], int | None] | None, role_fn: RoleFactory,
) -> ClientNode:
    """The node the queries answer for, told its role under the run's attack.

    The handshake reads the role first, so that an attack outside a simulation
    stops the run before round 1; the final report carries the role
    (:meth:`~fl_clusters.attacks.NodeRole.report_metadata`).
    """
    def metadata(context: Context) -> Mapping[str, Any]:
        role = role_fn(context)
        found = metadata_fn(context)
        return found if role is None else {**found, **role.report_metadata()}

    def check(context: Context) -> int | None:
        role_fn(context)
        if check_fn is not None:
            return check_fn(context)
        learner_fn(context)
        return metadata_fn(context).get("true-cluster")

    return ClientNode(learner_fn, metadata, check=check)


def register_handlers(
    app: ClientApp,
    learner_fn: LearnerFactory,
    metadata_fn: MetadataFactory | None = None,
    check_fn: Callable[[Context], int | None] | None = None,
    role_fn: RoleFactory | None = None,
) -> ClientApp:
    """Add every fl-clusters message handler to a ClientApp.

    The queries strategies declare themselves (``query.strategy``) are answered
    by the function of the registered strategy that declares the query's name,
    given the learner ``learner_fn`` builds.

    Parameters
    ----------
    app : ClientApp
        A ClientApp with no ``train``/``evaluate``/``query`` handlers of the
        actions registered here (Flower refuses duplicates).
    learner_fn : Callable[[Context], TorchLearner]
        Builds this node's learner (model + local data) from its context.
    metadata_fn : Callable[[Context], Mapping[str, Any]] | None
        Extra values for the final report, such as the ground-truth cluster
        used for metrics. Strategies never read them. An optional
        ``"test-groups"`` entry (one integer group per test sample, e.g. its
        source distribution) is not forwarded: the report returns every cluster
        model's correct counts per group (``group-correct``, ``group-counts``).
    check_fn : Callable[[Context], int | None] | None
        The start-up handshake's check that this node can load its data, raising
        what ``learner_fn`` would and returning the node's ground-truth group (or
        None), so that the handshake builds no learner; None: the handshake calls
        ``learner_fn`` and reads the group from ``metadata_fn``.
    role_fn : Callable[[Context], NodeRole | None] | None
        The node's role under the run config's attack (simulations only): the
        built-in app's is :func:`fl_clusters.attacks.node_role`. ``None``: no node
        attacks (an app of your own reads a run config of its own).
    """
    pass_ray_messages_inline()
    role_fn = role_fn or no_role

    @app.train(mods=[serve_block])
    def train(message: Message, context: Context) -> Message:
        learner = learner_fn(context)
        trained = train_as(role_fn(context), learner, message, context)
        if not trained.has_error():
            record_training(context, learner.device)
        return trained

    @app.evaluate(mods=[serve_block])
    def evaluate(message: Message, context: Context) -> Message:
        learner = learner_fn(context)
        if is_mixture(message):
            return fedem_evaluate(learner, message, context)
        role = role_fn(context)
        target = None if role is None else role.backdoor_target
        return evaluate_reply(learner, message, context, target)

    register_queries(app, role_aware_node(learner_fn, metadata_fn or no_metadata, check_fn,
                                          role_fn))
    return app


def build_client_app(
    overrides: Mapping[str, Any] | None = None, mods: list[Mod] | None = None
) -> ClientApp:
    """The ClientApp on fl-clusters' own data and models.

    Parameters
    ----------
    overrides : Mapping[str, Any] | None
        Run-config values that win over ``context.run_config`` (``run_simulation``
        passes no run config, so tests and scripts set keys here).
    mods : list[Mod] | None
        Flower client mods wrapped around every handler (e.g. Flower's
        ``message_size_mod``, or a fault injector in tests); in the logical-clients
        mode each sees one client's message.
    """

    def learner_fn(context: Context) -> TorchLearner:
        return learner_for(context, overrides)

    def metadata_fn(context: Context) -> dict[str, Any]:
        return node_metadata(context, overrides)

    def check_fn(context: Context) -> int:
        return check_node(context, overrides)

    def role_fn(context: Context) -> NodeRole | None:
        return node_role(context, overrides)

    # serve_block outermost: every other mod (a fault injector...) sees one client's
    # message, as on a node of its own.
    return register_handlers(ClientApp(mods=[serve_block, *(mods or [])]), learner_fn,
                             metadata_fn, check_fn, role_fn)


app = build_client_app()
