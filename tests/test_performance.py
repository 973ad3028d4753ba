"""Fast paths of the client: index-slice batching, per-process learner and data caches."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fl_clusters import client_app
from fl_clusters.client import node_data
from fl_clusters.client.choice import choose_cluster
from fl_clusters.client.queries import report_reply
from fl_clusters.data import DATASET_SHAPES, load_dataset
from fl_clusters.data import loaders as data_loaders
from fl_clusters.learner import TorchLearner
from fl_clusters.models import arrays_to_model, build_model, model_to_arrays
from fl_clusters.server_app import initial_arrays

ROOT = Path(__file__).resolve().parent.parent


class _Generic(Dataset):
    """Same samples as a TensorDataset, but a Dataset the learner must load with a DataLoader."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _data(n: int = 53) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(n, 1, 8, 8)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, size=n).astype(np.int64))
    return x, y


def _learners() -> tuple[TorchLearner, TorchLearner]:
    x, y = _data()
    fast = TorchLearner(build_model("mlp", (1, 8, 8), 10), TensorDataset(x, y), TensorDataset(x, y))
    slow = TorchLearner(build_model("mlp", (1, 8, 8), 10), _Generic(x, y), _Generic(x, y))
    return fast, slow


@pytest.mark.parametrize("n", [53, 48])  # a partial last batch, and none
def test_fast_batches_follow_the_seeded_dataloader_order_over_epochs(n: int) -> None:
    x, y = _data(n)
    learner = TorchLearner(
        build_model("mlp", (1, 8, 8), 10), TensorDataset(x, y), TensorDataset(x, y)
    )
    fast_gen, loader_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=loader_gen)
    for _ in range(3):
        fast = [yb.tolist() for _, yb in learner._batches("train", 16, fast_gen)]
        expected = [yb.tolist() for _, yb in loader]
        assert fast == expected
    # Every sample exactly once per epoch, in a seeded order that is not the identity.
    order = torch.cat(
        [xb for xb, _ in learner._batches("train", 16, torch.Generator().manual_seed(1))]
    )
    rows = [int(np.flatnonzero((x == row).all(dim=(1, 2, 3)))[0]) for row in order]
    assert sorted(rows) == list(range(n)) and rows != list(range(n))


def test_fast_path_trains_and_scores_like_the_dataloader_path() -> None:
    fast, slow = _learners()
    start = model_to_arrays(build_model("mlp", (1, 8, 8), 10, seed=3))
    for steps, epochs in [(0, 2), (5, 1)]:
        fast_arrays, fast_loss = fast.train(
            start, lr=0.1, batch_size=16, epochs=epochs, steps=steps, seed=4
        )
        slow_arrays, slow_loss = slow.train(
            start, lr=0.1, batch_size=16, epochs=epochs, steps=steps, seed=4
        )
        assert fast_loss == pytest.approx(slow_loss, rel=1e-6)
        for name in fast_arrays:
            np.testing.assert_allclose(
                fast_arrays[name].numpy(), slow_arrays[name].numpy(), atol=1e-6
            )
    np.testing.assert_allclose(
        fast.per_sample_losses(start), slow.per_sample_losses(start), rtol=1e-6
    )
    assert (fast.per_sample_correct(start) == slow.per_sample_correct(start)).all()
    assert fast.evaluate(start) == pytest.approx(slow.evaluate(start))
    # The report's single test pass gives what evaluate and per_sample_correct give.
    losses, correct = fast.per_sample_scores(start)
    assert (losses.mean(), correct.mean()) == pytest.approx(slow.evaluate(start), rel=1e-6)
    assert (correct == slow.per_sample_correct(start)).all()
    fast_grad, fast_total = fast.gradient(start)
    slow_grad, slow_total = slow.gradient(start)
    assert fast_total == pytest.approx(slow_total)
    for name in fast_grad:
        np.testing.assert_allclose(fast_grad[name].numpy(), slow_grad[name].numpy(), atol=1e-6)
    np.testing.assert_array_equal(
        fast.feature_mean("train", 20, seed=2), slow.feature_mean("train", 20, seed=2)
    )


def _context(partition_id: int, num_partitions: int, run_id: int = 1) -> Context:
    node_config = {"partition-id": partition_id, "num-partitions": num_partitions}
    return Context(run_id=run_id, node_id=partition_id, node_config=node_config,
                   state=RecordDict(), run_config={})


@pytest.fixture
def keep_torch_threads() -> Iterator[None]:
    """Building a learner sets the process's torch threads; give later tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("keep_torch_threads")
def test_a_process_keeps_the_learners_and_data_of_the_nodes_it_served_last() -> None:
    overrides = {"dataset": "digits", "torch-threads": 1}
    kept = node_data.NODES_KEPT
    first = node_data.learner_for(_context(0, 80), overrides)
    assert node_data.learner_for(_context(0, 80), overrides) is first
    other = node_data.learner_for(_context(1, 80), overrides)
    assert other is not first and other.model is first.model  # one model per architecture
    assert torch.get_num_threads() == 1
    # The last NODES_KEPT nodes are kept; one served before them is built again,
    # from the same plan, with the same samples.
    data = [node_data.client_data_for(_context(i, 80), overrides) for i in range(80)]
    recent = range(80 - kept, 80)
    assert all(node_data.client_data_for(_context(i, 80), overrides) is data[i] for i in recent)
    again = node_data.client_data_for(_context(0, 80), overrides)
    assert again is not data[0]
    np.testing.assert_array_equal(again.x_train, data[0].x_train)
    np.testing.assert_array_equal(again.y_test, data[0].y_test)
    for i in range(80):
        node_data.learner_for(_context(i, 80), overrides)
    assert node_data._cached_learner.cache_info().currsize == kept
    rebuilt = node_data.learner_for(_context(0, 80), overrides)
    assert rebuilt is not first and rebuilt.model is first.model
    assert torch.equal(rebuilt._tensors["train"][0], first._tensors["train"][0])
    # An actor kept for the next run of a sweep drops this run's nodes on its first
    # message: nothing of one run is served to another, and memory does not pile up.
    next_run = node_data.learner_for(_context(0, 80, run_id=2), overrides)
    assert next_run is not rebuilt and next_run.model is first.model
    assert node_data.client_data_for(_context(79, 80, run_id=2), overrides) is not data[79]


@pytest.mark.usefixtures("keep_torch_threads")
def test_a_node_sees_only_the_weights_it_is_sent_though_the_model_is_shared() -> None:
    overrides = {"dataset": "digits"}
    a = node_data.learner_for(_context(2, 20), overrides)
    b = node_data.learner_for(_context(3, 20), overrides)
    start = model_to_arrays(build_model("mlp", (1, 8, 8), 10, seed=1))
    before = a.evaluate(start)
    b.train(start, lr=0.5, batch_size=8, epochs=2)
    assert a.evaluate(start) == before


@pytest.mark.parametrize("name", ["digits", "fashion-mnist"])
def test_dataset_shapes_match_the_loaded_data(name: str) -> None:
    dataset = load_dataset(name)
    assert DATASET_SHAPES[name] == (tuple(dataset.x.shape[1:]), dataset.num_classes)


def test_server_sizes_the_model_without_loading_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("the server loaded the data set")

    monkeypatch.setattr(data_loaders, "_load_cached", refuse)
    settings = {"dataset": "fashion-mnist", "model": "cnn", "seed": 0}
    arrays = initial_arrays(settings)
    model = build_model("cnn", (1, 28, 28), 10, seed=0)
    assert list(arrays.keys()) == list(model.state_dict().keys())
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(arrays[name].numpy(), value.numpy())


def test_the_cnn_keeps_channels_last_weights_with_the_values_and_outputs_of_nchw() -> None:
    # Channels-last halves the CNN's scoring time on 28x28 inputs (CPU max pooling;
    # benchmarks/model_layout_speed.py); it must not change what a client sends or
    # what the model computes beyond float rounding.
    model = build_model("cnn", (1, 28, 28), 10, seed=3)
    plain = build_model("cnn", (1, 28, 28), 10, seed=3).to(memory_format=torch.contiguous_format)
    assert model.body[3].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.body[3].weight.is_contiguous()
    mine, theirs = model_to_arrays(model), model_to_arrays(plain)
    for name in theirs:
        assert mine[name].data == theirs[name].data, name
    # Arrays from an NCHW model load into it and come back byte for byte.
    trained = model_to_arrays(build_model("cnn", (1, 28, 28), 10, seed=4))
    back = model_to_arrays(arrays_to_model(model, trained))
    assert all(back[name].data == trained[name].data for name in trained)
    x = torch.randn(64, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(arrays_to_model(plain, trained)(x), model(x),
                                   rtol=1e-5, atol=1e-5)


class _CountingLearner(TorchLearner):
    """Counts the passes over each split."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.passes: dict[str, int] = {"train": 0, "test": 0}

    def per_sample_losses(self, arrays, split="train"):  # type: ignore[no-untyped-def]
        self.passes[split] += 1
        return super().per_sample_losses(arrays, split)


@pytest.mark.parametrize("assigned", [-1, 1])
def test_the_report_scores_training_data_only_for_a_node_that_chooses_itself(
    assigned: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 18: with many clusters the training passes were the report's largest cost.
    from flwr.app import ConfigRecord, Message
    from flwr.supercore.task_identity import TaskIdentity

    from fl_clusters import protocol as p

    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    x, y = _data()
    learner = _CountingLearner(build_model("mlp", (1, 8, 8), 10), TensorDataset(x, y),
                               TensorDataset(x, y))
    models = [model_to_arrays(build_model("mlp", (1, 8, 8), 10, seed=s)) for s in range(3)]
    message = Message(RecordDict({
        p.CLUSTERS: p.pack_clusters(models),
        p.CONFIG: ConfigRecord({p.CFG_ASSIGNED: assigned}),
    }), dst_node_id=1, message_type=p.QUERY_REPORT)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    metrics = report_reply(learner, message, context, {}).content.metric_records[p.METRICS]
    assert len(metrics["test-accuracy"]) == 3  # type: ignore[arg-type]
    if assigned < 0:
        assert len(metrics["train-loss"]) == 3 and learner.passes["train"] == 3  # type: ignore[arg-type]
    else:
        assert "train-loss" not in metrics and learner.passes["train"] == 0


def test_a_node_scores_the_same_cluster_models_once_across_evaluate_and_train() -> None:
    # Issue 18: round t's evaluation and round t+1's training offer a choosing node
    # the same aggregated models; the second set of k passes is skipped. The losses
    # live in the node's context, so another actor (a new learner) reuses them too.
    from flwr.app import ConfigRecord

    x, y = _data()

    def counting() -> _CountingLearner:
        return _CountingLearner(build_model("mlp", (1, 8, 8), 10), TensorDataset(x, y),
                                TensorDataset(x, y))

    learner = counting()
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    models = [model_to_arrays(build_model("mlp", (1, 8, 8), 10, seed=s)) for s in range(3)]
    config = ConfigRecord()
    first = choose_cluster(learner, models, config, context)
    assert learner.passes["train"] == 3
    # Fresh records with equal contents, as the next message carries them, on
    # another process's learner.
    again = [ArrayRecord(m.to_torch_state_dict()) for m in models]
    other = counting()
    assert choose_cluster(other, again, config, context) == first
    assert other.passes["train"] == 0
    assert first[1] == [float(learner.per_sample_losses(m).mean()) for m in models]
    # One changed model is scored again, the unchanged ones are not.
    changed = [*models[:2], model_to_arrays(build_model("mlp", (1, 8, 8), 10, seed=9))]
    choose_cluster(other, changed, config, context)
    assert other.passes["train"] == 1
    # A node without kept losses (a new context) scores every model.
    fresh = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    choose_cluster(other, changed, config, fresh)
    assert other.passes["train"] == 4


def _sgd_reference(
    learner: TorchLearner, start: ArrayRecord, steps: int, lr: float, mu: float, seed: int
) -> dict[str, np.ndarray]:
    """``steps`` steps of ``torch.optim.SGD`` over the learner's own batches and loss."""
    model = build_model("cnn", (1, 8, 8), 10)
    model.load_state_dict(start.to_torch_state_dict())
    center = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = learner._batches("train", 16, torch.Generator().manual_seed(seed))
    model.train()
    for _, (x, y) in zip(range(steps), batches, strict=False):
        optimizer.zero_grad()
        loss = learner.loss_fn(model(x), y).mean()
        params = model.named_parameters()
        loss = loss + mu / 2 * sum(((p - center[n]) ** 2).sum() for n, p in params)
        loss.backward()
        optimizer.step()
    return {name: value.detach().numpy() for name, value in model.state_dict().items()}


def test_local_sgd_steps_are_torch_optim_sgd_steps_bit_for_bit() -> None:
    # The learner updates the weights itself (torch.optim.SGD's constructor imports
    # torch._dynamo, ~1 s per process): the result must be SGD's to the last bit.
    x, y = _data(64)
    data = TensorDataset(x, y)
    learner = TorchLearner(build_model("cnn", (1, 8, 8), 10), data, data)
    start = model_to_arrays(build_model("cnn", (1, 8, 8), 10, seed=5))
    trained, _ = learner.train(
        start, lr=0.05, batch_size=16, steps=3, proximal_centers=[(start, 0.1)], seed=7
    )
    expected = _sgd_reference(learner, start, steps=3, lr=0.05, mu=0.1, seed=7)
    assert set(expected) == set(trained.keys())
    for name, value in expected.items():
        np.testing.assert_array_equal(trained[name].numpy(), value)
    assert any(not np.array_equal(trained[n].numpy(), start[n].numpy()) for n in expected)


def test_importing_the_package_or_training_pulls_no_heavy_modules() -> None:
    # `flwr run` finds the app with find_spec, which imports the package: torch and
    # scikit-learn there cost every run 2.6 s. The apps `flwr run` loads must not
    # import them either (Ray waits for that load). A client's first SGD step must
    # not import torch._dynamo (what torch.optim.SGD's constructor does).
    script = (
        "import sys\n"
        "import fl_clusters\n"
        "import fl_clusters.apps\n"
        "assert not {'torch', 'sklearn'} & set(sys.modules), sorted(sys.modules)\n"
        "assert fl_clusters.ClusteredClient.__name__ == 'ClusteredClient'\n"
        "import torch\n"
        "from torch.utils.data import TensorDataset\n"
        "from fl_clusters.learner import TorchLearner\n"
        "from fl_clusters.models import arrays_to_model, build_model, model_to_arrays\n"
        "data = TensorDataset(torch.zeros(8, 1, 8, 8), torch.zeros(8, dtype=torch.long))\n"
        "model = build_model('mlp', (1, 8, 8), 10)\n"
        "TorchLearner(model, data, data).train(model_to_arrays(model), lr=0.1, batch_size=4)\n"
        "assert 'torch._dynamo' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)


# A Ray actor reports the object store's use while it holds its argument (1.2 MB:
# between a Fashion-MNIST MLP message, 0.64 MB, and a CNN one, 1.7 MB): with Ray's
# default such an argument goes through the store (1 object); after the app module's
# import, inline (0).
_RAY_ARGUMENT_PATH = """
import re, sys
import numpy as np
if sys.argv[1] == "with-app":
    import fl_clusters.apps
import ray
from ray._private.internal_api import memory_summary

ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")


@ray.remote
class Holder:
    def objects_while_holding(self, x):
        stats = memory_summary(ray.get_runtime_context().gcs_address, stats_only=True)
        return int(re.search(r"Plasma memory usage \\d+ MiB, (\\d+) objects", stats)[1])


print("objects", ray.get(Holder.remote().objects_while_holding.remote(np.zeros(300_000, "f4"))))
ray.shutdown()
"""


@pytest.mark.parametrize(("mode", "objects"), [("with-app", 0), ("ray-default", 1)])
def test_after_the_apps_load_ray_passes_a_model_sized_message_inline(
    mode: str, objects: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fl_clusters.ray_env import RAY_INLINE_ENV

    monkeypatch.delenv(RAY_INLINE_ENV, raising=False)
    done = subprocess.run(
        [sys.executable, "-c", _RAY_ARGUMENT_PATH, mode],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    assert f"objects {objects}" in done.stdout, done.stdout + done.stderr


def test_building_a_client_app_asks_ray_for_inline_messages_and_keeps_a_users_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr.clientapp import ClientApp

    from fl_clusters.adapter import ClusteredClient
    from fl_clusters.ray_env import RAY_INLINE_BYTES, RAY_INLINE_ENV

    def no_loaders(context: Context) -> tuple[DataLoader, DataLoader]:
        raise AssertionError("not called while building")

    for build in (
        client_app.build_client_app,
        lambda: ClusteredClient(ClientApp(), lambda: torch.nn.Linear(2, 2), no_loaders),
    ):
        monkeypatch.delenv(RAY_INLINE_ENV, raising=False)
        build()
        assert int(os.environ[RAY_INLINE_ENV]) == RAY_INLINE_BYTES
        monkeypatch.setenv(RAY_INLINE_ENV, "4096")
        build()
        assert os.environ[RAY_INLINE_ENV] == "4096"


def test_the_apps_flwr_run_loads_answer_what_the_implementation_answers() -> None:
    from fl_clusters import apps

    assert apps.client_app._registered_funcs.keys() == client_app.app._registered_funcs.keys()
    components = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert components["components"] == {
        "serverapp": "fl_clusters.apps:server_app",
        "clientapp": "fl_clusters.apps:client_app",
    }


def test_the_light_client_app_hands_a_message_to_the_implementation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fl_clusters import apps

    for name in ("_run_id", "_node_id", "_task_id"):  # Message() needs a run identity
        monkeypatch.setattr(TaskIdentity, name, 1)
    seen: list[tuple[Message, Context]] = []

    def answer(message: Message, context: Context) -> Message:
        seen.append((message, context))
        return Message(RecordDict(), reply_to=message)

    monkeypatch.setattr(client_app, "app", answer)
    message = Message(RecordDict(), dst_node_id=1, message_type="query.identity")
    context = _context(0, 1)
    apps.client_app(message, context)
    assert seen == [(message, context)]


def test_gpu_check_says_why_it_measures_nothing_without_a_gpu(tmp_path: Path) -> None:
    """benchmarks/gpu_cluster.py on a machine with no CUDA GPU: a clear skip, no file."""
    out = tmp_path / "gpu_cluster.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_cluster.py"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU on this machine" in result.stdout
    assert "nothing measured" in result.stdout
    assert not out.exists()
