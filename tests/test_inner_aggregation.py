"""Flower's strategies inside each cluster: what they compute, their state, their refusals.

The federations (same seed same result, resume equals uninterrupted with FedAdam
in every cluster) are the conformance check ``inner_aggregation``
(tests/test_conformance.py); here each piece is checked on hand-made replies.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    FedAdam,
    FedMedian,
    FedTrimmedAvg,
    Krum,
)

from fl_clusters import protocol as p
from fl_clusters.config import parse_run_config
from fl_clusters.state_tree import StateReader, StateWriter
from fl_clusters.strategies import CFL, FLDC, IFCA
from fl_clusters.strategies.kit.inner_aggregation import (
    INNER_STRATEGIES,
    InnerAggregationError,
    build_inner,
    restored,
    strategy_state,
)
from fl_clusters.strategy_builder import build_strategy
from fl_clusters.testing import in_process_server, loopback_run
from tests.conftest import START, train_reply

# Messages are made as a ServerApp makes them: under a run id.
pytestmark = pytest.mark.usefixtures("server_identity")
# Five members of one cluster: four honest updates near 1, one attacker at -50.
VALUES = [1.0, 1.1, 0.9, 1.05, -50.0]


def _replies(values: list[float], examples: list[int] | None = None) -> list[Message]:
    """One train reply per value: the START model filled with it, from node 100 + i."""
    replies = []
    for i, value in enumerate(values):
        request = Message(RecordDict(), dst_node_id=100 + i, message_type=MessageType.TRAIN)
        arrays = p.numpy_to_record(list(START), [np.full_like(a.numpy(), value)
                                                 for a in START.values()])
        replies.append(train_reply(request, arrays, (examples or [10] * len(values))[i], 0))
    return replies


def _weight(record: p.ArrayRecord) -> np.ndarray:
    return record["layer.weight"].numpy()


def test_fedmedian_inside_a_cluster_is_the_coordinate_median_the_mean_is_dragged() -> None:
    median = CFL(inner=FedMedian()).aggregate_cluster(1, 0, START, _replies(VALUES),
                                                      weighted=True)
    mean = CFL().aggregate_cluster(1, 0, START, _replies(VALUES), weighted=True)
    np.testing.assert_allclose(_weight(median), np.median(VALUES))
    np.testing.assert_allclose(_weight(mean), np.mean(VALUES), rtol=1e-6)
    assert _weight(median).dtype == np.float32


def test_trimmed_mean_cuts_the_outlier_and_krum_picks_an_honest_member() -> None:
    trimmed = CFL(inner=FedTrimmedAvg(beta=0.2)).aggregate_cluster(
        1, 0, START, _replies(VALUES), weighted=True)
    np.testing.assert_allclose(_weight(trimmed), np.mean(sorted(VALUES)[1:-1]), rtol=1e-6)
    krum = CFL(inner=Krum(num_malicious_nodes=1)).aggregate_cluster(
        1, 0, START, _replies(VALUES), weighted=True)
    assert np.isclose(np.float32(VALUES[:4]), _weight(krum).flat[0]).any()


def test_every_named_flower_strategy_aggregates_a_cluster_from_the_run_config() -> None:
    options = {"dp-fixed-clipping": "noise_multiplier=0.0, clipping_norm=100.0",
               "dp-adaptive-clipping": "noise_multiplier=0.0, initial_clipping_norm=100.0"}
    for name in INNER_STRATEGIES:
        settings = parse_run_config({"strategy": "cfl", "inner-aggregation": name,
                                     "inner-options": options.get(name, "")})
        strategy = build_strategy(settings)
        assert type(strategy.inner) is INNER_STRATEGIES[name], name
        result = strategy.aggregate_cluster(1, 0, START, _replies(VALUES[:4]), weighted=True)
        assert list(result) == list(START), name
        assert np.isfinite(_weight(result)).all(), name
        assert strategy.inner_fallbacks == [], (name, strategy.inner_fallbacks)


def test_a_cluster_too_small_for_krum_falls_back_to_the_mean_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = IFCA(num_clusters=2, inner=Krum(num_malicious_nodes=1))
    with caplog.at_level(logging.WARNING):
        result = strategy.aggregate_cluster(3, 1, START, _replies(VALUES[:3]), weighted=False)
    np.testing.assert_allclose(_weight(result), np.mean(VALUES[:3]), rtol=1e-6)
    assert strategy.inner_fallbacks == [{"round": 3, "cluster": 1, "members": 3,
                                         "why": "Krum with f=1 needs > 4 members"}]
    assert "averaged with the mean: Krum with f=1 needs > 4 members" in caplog.text
    assert strategy.summary_fields()["inner_fallbacks"] == strategy.inner_fallbacks


def test_fedadam_keeps_one_state_per_cluster_and_it_survives_the_checkpoint_tree() -> None:
    strategy = FLDC(inner=FedAdam(eta=0.05))
    for server_round in (1, 2):
        strategy.aggregate_cluster(server_round, 0, START, _replies([1.0, 2.0]), weighted=True)
    strategy.aggregate_cluster(1, 1, START, _replies([-1.0, -2.0]), weighted=True)
    moments = [strategy.inner_states[c]["attributes"]["m_t"]["layer.weight"] for c in (0, 1)]
    assert np.all(moments[0] > 0) and np.all(moments[1] < 0)

    writer = StateWriter()
    tree = writer.tree(strategy.checkpoint_state(), "strategy")
    state = StateReader(writer.arrays).value(tree)
    assert "inner" not in state and "_states_before" not in state
    resumed = FLDC(inner=FedAdam(eta=0.05))
    vars(resumed).update(state)
    next_round = [s.aggregate_cluster(3, 0, START, _replies([1.5, 2.5]), weighted=True)
                  for s in (strategy, resumed)]
    np.testing.assert_array_equal(_weight(next_round[0]), _weight(next_round[1]))
    fresh = FLDC(inner=FedAdam(eta=0.05)).aggregate_cluster(
        3, 0, START, _replies([1.5, 2.5]), weighted=True)
    assert not np.array_equal(_weight(fresh), _weight(next_round[0]))


def test_a_state_read_out_sets_back_on_a_copy() -> None:
    adam = FedAdam(eta=0.05)
    CFL(inner=adam)  # the template itself is never trained
    trained = restored(adam, None)
    trained.current_arrays = {"w": np.ones(2)}
    trained.m_t = {"w": np.full(2, 0.5)}
    copy = restored(adam, strategy_state(trained))
    np.testing.assert_array_equal(copy.m_t["w"], [0.5, 0.5])
    assert adam.m_t is None


@pytest.mark.parametrize(("settings", "message"), [
    ({"strategy": "fedsoft", "inner-aggregation": "fedmedian"},
     "strategy 'fedsoft' takes no inner aggregation (inner-aggregation='fedmedian'): every "
     "client counts in every cluster with its importance weight"),
    ({"strategy": "fedavg", "inner-aggregation": "krum"},
     "choose it as the strategy (e.g. strategy='fedmedian')"),
    ({"strategy": "local", "inner-options": "beta=0.2"}, "takes no inner aggregation"),
    ({"strategy": "cfl", "inner-aggregation": "fedtrimmedavg", "inner-options": "bta=0.1"},
     "run-config key 'inner-options': FedTrimmedAvg takes no bta; it takes beta"),
    ({"strategy": "cfl", "inner-options": "beta=0.2"}, "'inner-aggregation' is 'mean'"),
    ({"strategy": "cfl", "inner-aggregation": "krum", "inner-options": "num_malicious_nodes"},
     "must be 'name=value' items"),
    ({"strategy": "ifca", "inner-aggregation": "fedmedian", "ifca-mode": "gradient"},
     "use mode 'model' with it"),
])
def test_what_cannot_run_is_refused_naming_the_key_and_the_fix(
    settings: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match="") as raised:
        build_strategy(parse_run_config(settings))
    assert message in str(raised.value)


def test_python_arguments_take_flower_objects_and_refuse_the_others() -> None:
    assert isinstance(IFCA(num_clusters=2, inner=FedTrimmedAvg(beta=0.2)).inner, FedTrimmedAvg)
    with pytest.raises(ValueError, match="inner must be an instance of flwr"):
        CFL(inner="fedmedian")
    with pytest.raises(InnerAggregationError, match="not both"):
        CFL(inner=FedMedian(), inner_aggregation="krum")
    with pytest.raises(InnerAggregationError, match="server-side DP clipping wrapper"):
        CFL(inner=DifferentialPrivacyClientSideFixedClipping(FedMedian(), 0.1, 1.0, 5))
    assert build_inner("mean", "") is None


def test_a_median_inside_ifca_s_clusters_keeps_the_honest_clients_sign_flippers_break(
    tmp_path: Path,
) -> None:
    """12 digits clients in 2 rotation groups, 3 of them sign-flipping their updates 10x:
    plain IFCA's clusters collapse; with FedMedian inside them the honest clients keep
    most of their clean accuracy and the groups are recovered."""
    job = {"strategy": "ifca", "cluster-structure": "rotation", "num-groups": 2,
           "num-clusters": 2, "num-rounds": 10, "local-steps": 10}
    attacked = {"attack": "sign-flip", "attack-share": 0.25}
    with in_process_server():
        clean = loopback_run(job, tmp_path / "clean", num_clients=12)
        plain = loopback_run({**job, **attacked}, tmp_path / "plain", num_clients=12)
        median = loopback_run({**job, **attacked, "inner-aggregation": "fedmedian"},
                              tmp_path / "median", num_clients=12)
    assert len(plain["attack"]["attackers"]) == 3
    assert plain["attack"]["honest_personalized_accuracy"] < 0.5
    assert median["attack"]["honest_personalized_accuracy"] > (
        clean["personalized_accuracy"] - 0.1)
    assert median["ari"] == 1.0 and median["inner_aggregation"] == "FedMedian()"
