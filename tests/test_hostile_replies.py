"""Hostile replies (issue 59) are rejected with a one-line reason, counted, and change no model.

Each case feeds one reply that lies in a single way to the function or strategy that
reads it: a huge ``num-examples``, an array whose dtype differs from the model sent,
a ``cluster-id`` beyond the models offered, and a node claiming another's identity.
"""

from __future__ import annotations

import io
import logging
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.clustering import weighted_average
from fl_clusters.strategies import IFCA
from tests.conftest import StubGrid, train_reply

NODES = [1, 2, 3, 4]


def _model(value: float) -> ArrayRecord:
    return p.numpy_to_record(
        ["layer.weight", "layer.bias"],
        [np.full((3, 4), value, np.float32), np.full(3, value, np.float32)],
    )


def _one_line(reason: str | None) -> str:
    assert reason is not None and "\n" not in reason, reason
    return reason


def _started_ifca(grid: StubGrid, num_clusters: int = 2) -> IFCA:
    strategy = IFCA(num_clusters=num_clusters, init="random", restarts=1,
                    min_available_nodes=len(grid.nodes))
    strategy.prepare(grid, 60.0, 3)  # type: ignore[arg-type]
    return strategy


def _train_round(
    strategy: IFCA, grid: StubGrid, replies: dict[int, tuple[ArrayRecord, float, int]]
) -> tuple[list[ArrayRecord], ArrayRecord | None]:
    """One IFCA round: node -> (model, num-examples, cluster); the models sent, the result."""
    requests = list(strategy.configure_train(1, _model(0.0), ConfigRecord(), grid))  # type: ignore[arg-type]
    sent = p.unpack_clusters(requests[0].content.array_records[p.CLUSTERS])
    answers = [train_reply(m, *replies[m.metadata.dst_node_id]) for m in requests]  # type: ignore[arg-type]
    packed, _ = strategy.aggregate_train(1, answers)
    return sent, packed


def _same(a: ArrayRecord, b: ArrayRecord) -> bool:
    return all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


# --------------------------------------------------------------- 1. num-examples
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (1e308, "'num-examples' is 1e+308, above the 2147483647 one reply may claim"),
        (2.0**31, "above the 2147483647"),
        (0.5, "'num-examples' must hold whole numbers, got 0.5"),
        (math.nan, "'num-examples' holds NaN or Inf"),
        (0, "must be > 0"),
    ],
)
def test_num_examples_must_be_a_whole_count_below_the_declared_ceiling(
    value: float, reason: str
) -> None:
    found = p.check_metrics(MetricRecord({p.M_NUM_EXAMPLES: value}), {})
    assert reason in _one_line(found)


def test_the_ceiling_itself_is_accepted() -> None:
    assert p.check_metrics(MetricRecord({p.M_NUM_EXAMPLES: p.MAX_NUM_EXAMPLES}), {}) is None
    assert p.check_metrics(MetricRecord({p.M_NUM_EXAMPLES: 12.0}), {}) is None


def test_the_weighted_average_cannot_overflow() -> None:
    models = [[np.full(2, 3.0, np.float32)], [np.full(2, 1.0, np.float32)]]
    # Two weights of 1e308 overflowed the total to Inf and made every average 0.
    np.testing.assert_array_equal(weighted_average(models, [1e308, 1e308])[0], [2.0, 2.0])
    np.testing.assert_array_equal(weighted_average(models, [1e308, 0.0])[0], [3.0, 3.0])
    np.testing.assert_array_equal(weighted_average(models, [5e-324, 5e-324])[0], [2.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        weighted_average(models, [math.inf, 1.0])


def test_huge_num_examples_are_rejected_and_leave_their_cluster_model(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    grid = StubGrid(NODES)
    strategy = _started_ifca(grid)
    hostile = {1: (_model(5.0), 1e308, 0), 2: (_model(7.0), 1e308, 0),
               3: (_model(1.0), 10, 1), 4: (_model(3.0), 30, 1)}
    with caplog.at_level(logging.WARNING):
        sent, packed = _train_round(strategy, grid, hostile)
    assert packed is not None
    cluster0, cluster1 = p.unpack_clusters(packed)
    assert _same(cluster0, sent[0])  # both of its replies were rejected
    np.testing.assert_allclose(cluster1["layer.bias"].numpy(), 2.5)  # (10 + 90) / 40
    assert strategy.rejected_replies == 2
    assert caplog.text.count("above the 2147483647 one reply may claim") == 2


# ------------------------------------------------------------------ 2. dtypes
def _complex_nan() -> Array:
    values = np.zeros(3, np.complex64)
    values[0] = complex(math.nan, 0.0)
    return Array(values)


def _lying_array(declared: str, values: np.ndarray) -> Array:
    """An Array whose metadata declares ``declared`` while its bytes hold ``values``."""
    buffer = io.BytesIO()
    np.save(buffer, values, allow_pickle=False)
    return Array(dtype=declared, shape=tuple(values.shape), stype="numpy.ndarray",
                 data=buffer.getvalue())


@pytest.mark.parametrize(
    ("bias", "reason"),
    [
        (_complex_nan(), "array 'layer.bias' has dtype complex64, expected float32 as sent"),
        (Array(np.zeros(3, np.int64)), "has dtype int64, expected float32"),
        (Array(np.zeros(3, np.float64)), "has dtype float64, expected float32"),
        (_lying_array("float32", np.array([math.nan, 0, 0], np.complex64)),
         "array 'layer.bias' declares float32 (3,) but its data hold complex64 (3,)"),
        (Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=b"not numpy"),
         "array 'layer.bias' holds no readable .npy data"),
        (Array(dtype="float32", shape=(3,), stype="numpy.ndarray",
               data=_lying_array("float32", np.zeros(3, np.float32)).data[:-4]),
         "holds no readable .npy data"),
        (Array(np.array([math.inf, 0, 0], np.float32)), "array 'layer.bias' holds NaN or Inf"),
    ],
)
def test_an_array_must_have_the_dtype_and_data_of_the_array_sent(
    bias: Array, reason: str
) -> None:
    reply = _model(1.0)
    reply["layer.bias"] = bias
    assert reason in _one_line(p.check_model_reply(reply, _model(0.0)))


def test_a_header_claiming_a_huge_array_is_refused_before_it_is_read() -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    reply = _model(1.0)
    reply["layer.bias"] = Array(dtype="float32", shape=(3,), stype="numpy.ndarray",
                                data=buffer.getvalue() + bytes(12))
    found = p.check_model_reply(reply, _model(0.0))
    assert "declares float32 (3,) but its data hold float32 (1000000000000,)" in _one_line(found)


def test_a_complex_nan_reply_is_rejected_and_poisons_no_model(server_identity: None) -> None:
    grid = StubGrid(NODES)
    strategy = _started_ifca(grid)
    poisoned = _model(4.0)
    poisoned["layer.bias"] = _complex_nan()
    replies = {1: (poisoned, 10, 0), 2: (_model(2.0), 10, 0),
               3: (_model(1.0), 10, 1), 4: (_model(3.0), 10, 1)}
    _, packed = _train_round(strategy, grid, replies)
    assert packed is not None
    cluster0 = p.unpack_clusters(packed)[0]
    for name in cluster0:
        assert cluster0[name].dtype == "float32"
        np.testing.assert_array_equal(cluster0[name].numpy(), 2.0)  # node 2's model alone
    assert strategy.rejected_replies == 1


# --------------------------------------------------------------- 3. cluster-id
def test_an_evaluate_reply_naming_a_cluster_not_offered_is_rejected(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    grid = StubGrid(NODES)
    strategy = _started_ifca(grid, num_clusters=3)
    packed = p.pack_clusters([_model(0.0), _model(1.0), _model(2.0)])
    requests = list(strategy.configure_evaluate(1, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    chosen = {1: 99, 2: 3, 3: 2, 4: 0}
    replies = [
        Message(RecordDict({p.METRICS: MetricRecord({
            p.M_NUM_EXAMPLES: 10, p.M_ACCURACY: 0.5, p.M_LOSS: 1.0,
            p.M_CLUSTER: chosen[m.metadata.dst_node_id]})}), reply_to=m)
        for m in requests
    ]
    with caplog.at_level(logging.WARNING):
        assert strategy.aggregate_evaluate(1, replies) is not None
    assert strategy.assignment_history[1] == {3: 2, 4: 0}
    assert strategy.rejected_replies == 2
    assert "'cluster-id' = 99 is outside [0, 2]" in caplog.text
    assert "'cluster-id' = 3 is outside [0, 2]" in caplog.text


def test_a_train_reply_naming_a_cluster_not_offered_is_rejected_by_its_field(
    server_identity: None,
) -> None:
    grid = StubGrid(NODES)
    strategy = _started_ifca(grid)
    replies = {1: (_model(9.0), 10, 5), 2: (_model(2.0), 10, 0),
               3: (_model(1.0), 10, 1), 4: (_model(3.0), 10, 1)}
    _, packed = _train_round(strategy, grid, replies)
    assert packed is not None
    np.testing.assert_array_equal(p.unpack_clusters(packed)[0]["layer.bias"].numpy(), 2.0)
    assert strategy.rejected_replies == 1
    assert 1 not in strategy.assignments


# ------------------------------------------------------------------ end to end
def test_a_first_feature_of_another_length_cannot_reject_the_honest_ones(
    server_identity: None
) -> None:
    from fl_clusters.strategies.kit.options.mcfl import read_features

    def feature_reply(node: int, length: int) -> Message:
        request = Message(RecordDict(), dst_node_id=node, message_type="query")
        return Message(RecordDict({p.METRICS: MetricRecord(
            {p.M_FEATURE_MEAN: [0.5] * length, p.M_NUM_EXAMPLES: 1})}), reply_to=request)

    replies = [feature_reply(1, 5), feature_reply(2, 64), feature_reply(3, 64),
               feature_reply(4, 64)]
    found, rejected = read_features(replies, {})
    assert sorted(found) == [2, 3, 4] and rejected == 1


def test_honest_clients_lose_no_reply_to_these_checks(federation) -> None:  # type: ignore[no-untyped-def]
    # The real client returns the dtypes it was sent, whole example counts, cluster
    # ids among the models offered and the identity it registered.
    summary = federation({"strategy": "ifca", "num-rounds": 2, "num-clusters": 2, "seed": 3},
                         num_clients=6)
    assert summary["rejected_replies"] == 0
