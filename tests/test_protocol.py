"""Packing cluster models into one ArrayRecord, and checking client replies."""

import numpy as np
from flwr.app import Array, ArrayRecord

from fl_clusters import protocol as p
from fl_clusters.drawing import random_like
from fl_clusters.protocol import head_keys
from fl_clusters.strategies import cluster_models


def _model(value: float) -> ArrayRecord:
    return ArrayRecord(
        {
            "body.weight": Array(np.full((3, 2), value, dtype=np.float32)),
            "head.weight": Array(np.full((2, 3), value, dtype=np.float32)),
            "head.bias": Array(np.full(2, value, dtype=np.float32)),
        }
    )


def test_pack_unpack_round_trip() -> None:
    packed = p.pack_clusters([_model(1.0), _model(2.0), _model(3.0)])
    assert p.is_packed(packed)
    assert p.num_packed_clusters(packed) == 3
    models = cluster_models(packed)
    assert [float(m["head.bias"].numpy()[0]) for m in models] == [1.0, 2.0, 3.0]
    assert set(models[0]) == set(_model(0.0))


def test_shared_body_goes_into_every_cluster() -> None:
    heads = head_keys(_model(0.0), 1)
    assert heads == ["head.weight", "head.bias"]
    body, _ = p.split_shared(_model(7.0), heads)
    _, h1 = p.split_shared(_model(1.0), heads)
    _, h2 = p.split_shared(_model(2.0), heads)
    models = p.unpack_clusters(p.pack_clusters([h1, h2], shared=body))
    assert [float(m["body.weight"].numpy()[0, 0]) for m in models] == [7.0, 7.0]
    assert [float(m["head.weight"].numpy()[0, 0]) for m in models] == [1.0, 2.0]


def test_plain_model_is_one_cluster() -> None:
    assert not p.is_packed(_model(1.0))
    assert len(p.unpack_clusters(_model(1.0))) == 1


def test_reply_checks_name_the_problem() -> None:
    reference = _model(0.0)
    assert p.check_model_reply(_model(1.0), reference) is None
    bad = _model(1.0)
    bad["head.bias"] = Array(np.array([np.nan, 0.0], dtype=np.float32))
    assert "NaN" in p.check_model_reply(bad, reference)
    wrong = _model(1.0)
    wrong["head.bias"] = Array(np.zeros(3, dtype=np.float32))
    assert "shape" in p.check_model_reply(wrong, reference)
    missing = ArrayRecord({"body.weight": reference["body.weight"]})
    assert "keys differ" in p.check_model_reply(missing, reference)


def test_random_like_draws_different_models_of_same_scale() -> None:
    rng = np.random.default_rng(0)
    base = ArrayRecord({"w": Array(rng.uniform(-0.5, 0.5, (50, 50)).astype(np.float32))})
    a, b = random_like(base, rng), random_like(base, rng)
    assert not np.allclose(a["w"].numpy(), b["w"].numpy())
    assert abs(a["w"].numpy().std() - base["w"].numpy().std()) < 0.02
