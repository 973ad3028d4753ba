"""Client queries: messages a strategy declares itself, answered on every node.

A strategy that needs something from the nodes besides training and evaluation
declares it in its class, by name, with the function that answers it on a node::

    def centre_distances(learner: TorchLearner, records: RecordDict) -> RecordDict:
        ...  # score or train models with the node's learner; the reply's records

    class FeSEM(HardClusteredStrategy):
        client_queries = {"fesem_centre_distances": centre_distances}

The function gets the node's :class:`~fl_clusters.learner.TorchLearner` (its model
and local data) and the message's records, and returns the reply's records. The
server asks with :func:`query_messages`, sent by the strategy's ``send``. Every
strategy's queries travel as ONE message type,
:data:`~fl_clusters.protocol.QUERY_STRATEGY` (``query.strategy``), the query's
name in the config record (:data:`~fl_clusters.protocol.CFG_QUERY`): Flower's
ClientApp routes only the actions registered when the app is built, so a new
query needs no new handler in any ClientApp. Both of fl-clusters' client paths
(the built-in ClientApp and :class:`~fl_clusters.adapter.ClusteredClient`) find
the function among the registered strategies' (:func:`query_handlers`); a node
asked a query no strategy it knows declares answers with an error naming it.

Names are checked when a class is defined (:func:`check_client_queries`): each
follows Flower's rule for action names (a Python identifier), and two registered
strategies may not answer one name with different functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_clusters import protocol as p

if TYPE_CHECKING:
    from fl_clusters.learner import TorchLearner

# A node's answer to one client query: (its learner, the message's records) -> the
# reply's records.
ClientQuery = Callable[["TorchLearner", RecordDict], RecordDict]
# The class attribute that declares them.
DECLARATION = "client_queries"


def declared_queries(cls: type) -> dict[str, ClientQuery]:
    """The client queries of ``cls`` by name: its own and its bases', its own winning."""
    queries: dict[str, ClientQuery] = {}
    for klass in reversed(cls.__mro__):
        queries.update(vars(klass).get(DECLARATION, {}))
    return queries


def check_client_queries(cls: type, registered: Iterable[type]) -> None:
    """Refuse ``cls``'s own ``client_queries`` when a node could not answer them.

    Parameters
    ----------
    cls : type
        The class being defined.
    registered : Iterable[type]
        The strategies registered so far; the one registered under ``cls``'s name
        with its qualified name is the class ``cls`` replaces (its module run
        again) and is not compared.

    Raises
    ------
    TypeError
        If the declaration is not a mapping of names to functions.
    ValueError
        If a name is not a Python identifier, or another registered strategy
        answers the same name with another function.
    """
    own = vars(cls).get(DECLARATION)
    if own is None:
        return
    where = f"{cls.__qualname__}.{DECLARATION}"
    if not isinstance(own, Mapping):
        raise TypeError(f"{where} must map query names to functions (learner, records) -> "
                        f"records; got a {type(own).__name__}")
    for name, handler in own.items():
        problem = p.query_name_problem(name)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        if not callable(handler):
            raise TypeError(f"{where}[{name!r}] is a {type(handler).__name__}, not a function "
                            "(learner, records) -> records")
    mine = declared_queries(cls)
    for other in registered:
        if other.__qualname__ == cls.__qualname__ and other.name == vars(cls).get("name"):
            continue
        for name, handler in declared_queries(other).items():
            if mine.get(name, handler) is not handler:
                raise ValueError(
                    f"{where}: the client query {name!r} is already answered by another "
                    f"function of the registered strategy {other.__qualname__}; a node "
                    f"could not tell which to run: give yours a name of its own (e.g. "
                    f"'{getattr(cls, 'name', None) or cls.__name__.lower()}_{name}')")


def query_handlers(classes: Iterable[type]) -> dict[str, ClientQuery]:
    """Every client query that ``classes`` declare, by name.

    Raises
    ------
    ValueError
        If two of them answer one name with different functions.
    """
    handlers: dict[str, ClientQuery] = {}
    owners: dict[str, str] = {}
    for cls in classes:
        for name, handler in declared_queries(cls).items():
            if handlers.setdefault(name, handler) is not handler:
                raise ValueError(f"the client query {name!r} is answered by {owners[name]} "
                                 f"and by {cls.__qualname__} with different functions")
            owners.setdefault(name, cls.__qualname__)
    return handlers


def query_messages(
    name: str,
    nodes: Iterable[int],
    models: Sequence[ArrayRecord] = (),
    config: ConfigRecord | Mapping[str, Any] | None = None,
) -> list[Message]:
    """One message per node asking the client query ``name``: send them with ``self.send``.

    Parameters
    ----------
    name : str
        The query, as a strategy's ``client_queries`` declares it.
    nodes : Iterable[int]
        The node ids to ask.
    models : Sequence[ArrayRecord]
        Models the node's function reads (:func:`query_models`), packed in one record.
    config : ConfigRecord | Mapping[str, Any] | None
        Settings it reads (:func:`query_config`); the round's config (the strategy's
        ``round_config``) lets it train as the round does (:func:`query_training`).

    Raises
    ------
    ValueError
        If ``name`` is not a name a query can have.
    """
    problem = p.query_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    packed = p.pack_clusters(models) if models else None
    messages = []
    for node in nodes:
        content = RecordDict({p.CONFIG: ConfigRecord({**(config or {}), p.CFG_QUERY: name})})
        if packed is not None:
            content[p.CLUSTERS] = packed
        messages.append(Message(content, dst_node_id=node, message_type=p.QUERY_STRATEGY))
    return messages


def query_models(records: RecordDict) -> list[ArrayRecord]:
    """On the node: the models the query carries (``models`` of :func:`query_messages`)."""
    if p.CLUSTERS not in records.array_records:
        return []
    return p.unpack_clusters(records.array_records[p.CLUSTERS])


def query_config(records: RecordDict) -> ConfigRecord:
    """On the node: the query's settings (``config`` of :func:`query_messages`)."""
    return records.config_records.get(p.CONFIG, ConfigRecord())


def query_training(records: RecordDict) -> dict[str, Any]:
    """On the node: keyword arguments of ``TorchLearner.train`` for the query's config.

    The settings a train message carries (``lr``, ``batch-size``, ``local-epochs``,
    ``local-steps``, ``optimizer``) with their defaults, so that a query sent with
    the round's config trains as the round's training does; the batches are drawn
    from the round's seed. A :class:`~fl_clusters.adapter.ClusteredClient` node
    trains only in the app's own handler: its learner refuses to train here.
    """
    from fl_clusters.optimizers import optimizer_for  # torch: imported on a node only

    config = query_config(records)
    lr = float(config.get(p.CFG_LR, 0.1))  # type: ignore[arg-type]
    return {
        "lr": lr,
        "batch_size": int(config.get(p.CFG_BATCH, 32)),  # type: ignore[arg-type]
        "epochs": int(config.get(p.CFG_EPOCHS, 1)),  # type: ignore[arg-type]
        "steps": int(config.get(p.CFG_STEPS, 0)),  # type: ignore[arg-type]
        "seed": int(config.get(p.CFG_ROUND, 0)),  # type: ignore[arg-type]
        "optimizer_fn": optimizer_for(str(config.get(p.CFG_OPTIMIZER, "sgd")), lr),
    }


def query_reply(learner: TorchLearner, metrics: Mapping[str, Any]) -> RecordDict:
    """On the node: the reply's records, ``metrics`` and the node's ``num-examples``.

    The server's ``check_replies`` reads ``num-examples`` in every reply.
    """
    record = MetricRecord(dict(metrics))
    record[p.M_NUM_EXAMPLES] = learner.num_examples()
    return RecordDict({p.METRICS: record})


def reply_metrics(message: Message) -> MetricRecord:
    """On the server: the metrics of a reply (to a query, a training...), empty if none."""
    return message.content.metric_records.get(p.METRICS, MetricRecord())
