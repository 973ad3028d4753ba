"""A strategy's own client queries: declared in its class, answered by both client paths.

A strategy defined here declares queries (``client_queries``); its rounds ask
them through ``query.strategy``, the one message type every strategy's queries
share, and the built-in ClientApp and ClusteredClient answer with the declared
function. A query no strategy declares, a malformed one and one whose function
fails get error replies, and the run goes on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_clusters import protocol as p
from fl_clusters.adapter import ClusteredClient
from fl_clusters.client.node_data import learner_for
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.learner import TorchLearner
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.models import model_to_arrays
from fl_clusters.strategies.kit import (
    ClientQuery,
    ClusteredStrategy,
    HardClusteredStrategy,
    MetricField,
    numpy_to_record,
    query_config,
    query_messages,
    query_models,
    query_reply,
    record_to_numpy,
    reply_metrics,
)
from fl_clusters.testing import TINY_JOB, in_process_server, loopback_run

pytestmark = pytest.mark.usefixtures("server_identity")

LOSSES = "probe-losses"
ECHO = "probe-echo"
NUM_NODES = 6


def probe_losses(learner: TorchLearner, records: RecordDict) -> RecordDict:
    """Every model's mean training loss on this node, and the query's scale doubled."""
    losses = [float(learner.per_sample_losses(model, "train").mean())
              for model in query_models(records)]
    scale = float(query_config(records)["probe-scale"])  # type: ignore[arg-type]
    return query_reply(learner, {LOSSES: losses, ECHO: 2 * scale})


def probe_failing(learner: TorchLearner, records: RecordDict) -> RecordDict:
    """A query whose function fails on every node."""
    raise RuntimeError("the probe failed on this node")


def probe_not_records(learner: TorchLearner, records: RecordDict) -> Any:
    """A query whose function answers with something else than records."""
    return {LOSSES: [1.0]}


def other_losses(learner: TorchLearner, records: RecordDict) -> RecordDict:
    """Another function, for a name another strategy already answers."""
    return query_reply(learner, {})


class ProbeStrategy(HardClusteredStrategy):
    """One model; every round asks the sampled nodes its loss, and two queries that fail."""

    client_queries: ClassVar[Mapping[str, ClientQuery]] = {
        "probe_losses": probe_losses, "probe_failing": probe_failing,
        "probe_not_records": probe_not_records}

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.probed: dict[int, dict[str, list[float]]] = {}
        self.echoes: list[float] = []

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The round's train messages, once their nodes have answered the probe."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        nodes = [message.metadata.dst_node_id for message in messages]
        asked = query_messages("probe_losses", nodes, self.round_models, {"probe-scale": 1.5})
        fields = {LOSSES: MetricField(length=len(self.round_models), low=0.0), ECHO: MetricField()}
        valid = self.check_replies(self.send(grid, asked), None, "probe", fields, trains=False)
        self.probed[server_round] = {str(reply.metadata.src_node_id): list(
            reply_metrics(reply)[LOSSES]) for reply in valid}  # type: ignore[arg-type]
        self.echoes += [float(reply_metrics(reply)[ECHO]) for reply in valid]  # type: ignore[arg-type]
        for failing in ("probe_failing", "probe_not_records", "no_strategy_declares_this"):
            self.check_replies(self.send(grid, query_messages(failing, nodes)), None, failing,
                               {}, trains=False)
        return messages

    def summary_fields(self) -> dict[str, Any]:
        """Every round's probe answers and their echoes, and the base's fields."""
        return {"probed": self.probed, "echoes": self.echoes, **super().summary_fields()}


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, type]]:
    """A registry for one test: what a test registers is gone after it."""
    monkeypatch.setattr(ClusteredStrategy, "registry", dict(ClusteredStrategy.registry))
    yield ClusteredStrategy.registry


@pytest.fixture
def probe(registry: dict[str, type]) -> type[ClusteredStrategy]:
    """:class:`ProbeStrategy` registered as ``probe`` for one test."""
    return type("Probe", (ProbeStrategy,), {"name": "probe", "paper": "a test"})


def test_a_strategys_query_round_trips_through_a_federation(
    probe: type[ClusteredStrategy], tmp_path: Path
) -> None:
    with in_process_server():
        summary = loopback_run({"strategy": "probe"}, tmp_path)
    rounds = int(TINY_JOB["num-rounds"])
    # Every node answered the probe in every round, with the loss of the one model sent.
    assert sorted(summary["probed"]) == [str(r) for r in range(1, rounds + 1)]
    for answers in summary["probed"].values():
        assert len(answers) == NUM_NODES
        assert all(len(losses) == 1 and 0.0 < losses[0] < math.inf
                   for losses in answers.values())
    assert summary["echoes"] == [3.0] * (rounds * NUM_NODES)
    # Training went on: each round's answers are the losses of another model.
    assert summary["probed"]["1"] != summary["probed"][str(rounds)]
    # The three failing queries got error replies from every node in every round,
    # counted as rejected; none stopped the run.
    assert summary["rejected_replies"] == 3 * rounds * NUM_NODES


def node_context(settings: dict[str, Any], partition: int) -> Context:
    return Context(run_id=1, node_id=1000 + partition,
                   node_config={"partition-id": partition, "num-partitions": NUM_NODES},
                   state=RecordDict(), run_config=dict(settings))


def perturbed(model: ArrayRecord, scale: float) -> ArrayRecord:
    """``model`` with every array plus ``scale`` times noise: another model of its shape."""
    rng = np.random.default_rng(0)
    return numpy_to_record(list(model.keys()), [
        array + (scale * rng.normal(size=array.shape)).astype(array.dtype)
        for array in record_to_numpy(model)])


def test_the_built_in_client_answers_with_the_declared_function(
    probe: type[ClusteredStrategy],
) -> None:
    settings = parse_run_config({**TINY_JOB, "min-nodes": NUM_NODES})
    context = node_context(settings, 2)
    learner = learner_for(context, settings)
    start = model_to_arrays(learner.model)
    models = [start, perturbed(start, 0.5)]
    grid = LoopbackGrid(build_client_app(settings), NUM_NODES, settings)
    [reply] = grid.send_and_receive(query_messages("probe_losses", [1002], models,
                                                   {"probe-scale": 0.25}))
    assert not reply.has_error()
    metrics = reply_metrics(reply)
    expected = [float(learner.per_sample_losses(model, "train").mean()) for model in models]
    assert metrics[LOSSES] == pytest.approx(expected)
    assert metrics[ECHO] == 0.5
    assert metrics[p.M_NUM_EXAMPLES] == learner.num_examples()


class Flipped(TensorDataset):
    """A 2-class problem of 4 features (tuple batches), its labels flipped or not."""

    def __init__(self, n: int, flip: bool) -> None:
        x = torch.from_numpy(np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32))
        y = (x[:, 0] > 0).long()
        super().__init__(x, 1 - y if flip else y)


def linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def test_a_clustered_client_answers_with_the_declared_function(
    probe: type[ClusteredStrategy],
) -> None:
    app = ClientApp()
    loaders = (DataLoader(Flipped(40, True), batch_size=8), DataLoader(Flipped(16, True), 16))
    clustered = ClusteredClient(app, linear, lambda context: loaders)
    start = ArrayRecord(linear().state_dict())
    models = [start, perturbed(start, 1.0)]
    grid = LoopbackGrid(app, 1, {})
    [reply] = grid.send_and_receive(query_messages("probe_losses", [1000], models,
                                                   {"probe-scale": 2.0}))
    assert not reply.has_error()
    learner = clustered.learner(grid.contexts[1000])
    expected = [float(learner.per_sample_losses(model, "train").mean()) for model in models]
    assert reply_metrics(reply)[LOSSES] == pytest.approx(expected)
    assert reply_metrics(reply)[ECHO] == 4.0
    assert reply_metrics(reply)[p.M_NUM_EXAMPLES] == 40


def error_of(app: ClientApp, message: Message) -> str:
    """The reason of ``app``'s error reply to ``message`` on a one-node loopback grid."""
    [reply] = LoopbackGrid(app, 1, {}).send_and_receive([message])
    assert reply.has_error()
    return reply.error.reason


def test_an_unknown_or_malformed_query_gets_an_error_reply_naming_the_fix(
    probe: type[ClusteredStrategy],
) -> None:
    app = ClientApp()
    ClusteredClient(app, linear, lambda context: (
        DataLoader(Flipped(8, False), 8), DataLoader(Flipped(8, False), 8)))
    [unknown] = query_messages("no_strategy_declares_this", [1000])
    reason = error_of(app, unknown)
    assert "'no_strategy_declares_this'" in reason and "install the package" in reason
    nameless = Message(RecordDict({p.CONFIG: ConfigRecord({})}), dst_node_id=1000,
                       message_type=p.QUERY_STRATEGY)
    assert f"under '{p.CFG_QUERY}'" in error_of(app, nameless)
    [spaced] = query_messages("probe_losses", [1000])
    spaced.content[p.CONFIG][p.CFG_QUERY] = "probe losses"
    assert "not a Python identifier" in error_of(app, spaced)
    [wrong] = query_messages("probe_not_records", [1000])
    assert "returned a dict, not the reply's RecordDict" in error_of(app, wrong)
    [failing] = query_messages("probe_failing", [1000])
    assert "the probe failed on this node" in error_of(app, failing)


def test_a_query_name_must_be_an_identifier_and_answered_by_a_function(
    registry: dict[str, type],
) -> None:
    with pytest.raises(ValueError, match="'probe losses' is not a Python identifier"):
        type("Spaced", (ProbeStrategy,), {"client_queries": {"probe losses": probe_losses}})
    with pytest.raises(TypeError, match=r"Called.client_queries\['probe'\] is a str"):
        type("Called", (ProbeStrategy,), {"client_queries": {"probe": "probe_losses"}})
    with pytest.raises(ValueError, match="not a Python identifier"):
        query_messages("probe-losses", [1])


def test_two_strategies_cannot_answer_one_query_name_differently(
    probe: type[ClusteredStrategy],
) -> None:
    with pytest.raises(ValueError, match="'probe_losses' is already answered by another "
                       "function of the registered strategy Probe"):
        type("Other", (HardClusteredStrategy,),
             {"name": "other", "client_queries": {"probe_losses": other_losses}})
    assert "other" not in ClusteredStrategy.registry
    # The class a module defines again replaces its registration, functions included.
    again = type("Probe", (ProbeStrategy,), {
        "name": "probe", "client_queries": {"probe_losses": other_losses}})
    assert ClusteredStrategy.registry["probe"] is again
    # A subclass answers with its base's functions: no clash.
    child = type("Child", (again,), {"name": "child"})
    assert ClusteredStrategy.registry["child"] is child
