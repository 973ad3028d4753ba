"""ClusteredClient: a FedAvg-style app's own handlers served on clustered messages."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.metrics import homogeneity_score
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, Dataset

from fl_clusters import protocol as p
from fl_clusters.adapter import ClusteredClient
from fl_clusters.learner import TorchLearner
from fl_clusters.strategies.kit.evaluation import per_cluster_evaluate
from tests.conftest import SharedRay

pytestmark = pytest.mark.usefixtures("server_identity")

torch.set_num_threads(1)


class DictDigits(Dataset):
    """A tiny 2-class problem whose batches are dicts {"img", "label"} (flwr-datasets style)."""

    def __init__(self, n: int, flip: bool, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = torch.from_numpy(rng.normal(size=(n, 4)).astype(np.float32))
        y = (self.x[:, 0] > 0).long()
        self.y = 1 - y if flip else y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"img": self.x[i], "label": self.y[i]}


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def user_train(net: nn.Module, loader: DataLoader, lr: float, extra=None) -> float:
    """The user's own loop: SGD with momentum 0.9, dict batches."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    net.train()
    total = 0.0
    for batch in loader:
        optimizer.zero_grad()
        loss = criterion(net(batch["img"]), batch["label"])
        if extra is not None:
            loss = loss + extra(net)
        loss.backward()
        optimizer.step()
        total += float(loss)
    return total / len(loader)


def model_fitting(flip: bool) -> ArrayRecord:
    """A model that classifies one group perfectly (and the other group wrongly)."""
    net = make_net()
    with torch.no_grad():
        net.weight.zero_()
        net.bias.zero_()
        sign = -1.0 if flip else 1.0
        net.weight[1, 0], net.weight[0, 0] = 5 * sign, -5 * sign
    return ArrayRecord(net.state_dict())


def context(run_config: dict | None = None) -> Context:
    return Context(
        run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 1},
        state=RecordDict(), run_config=run_config or {},
    )


def train_message(models: list[ArrayRecord], config: dict) -> Message:
    content = RecordDict({p.CLUSTERS: p.pack_clusters(models), p.CONFIG: ConfigRecord(config)})
    return Message(content=content, dst_node_id=7, message_type="train")


def build(flip: bool, batch_keys=("img", "label"), seen: dict | None = None,
          validation: bool = False):
    """A user's ClientApp whose handlers are wrapped by ClusteredClient."""
    app = ClientApp()
    train_set = DictDigits(64, flip)
    loaders: tuple = (DataLoader(train_set, batch_size=16), DataLoader(DictDigits(32, flip, 1), 32))
    if validation:
        # 24 held-out samples, a size no other split has.
        loaders = (loaders[0], DataLoader(DictDigits(24, flip, 2), 8), loaders[1])
    clustered = ClusteredClient(app, make_net, lambda ctx: loaders, batch_keys=batch_keys)
    seen = {} if seen is None else seen

    @clustered.train
    def train(msg: Message, ctx: Context) -> Message:
        net = make_net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        seen["arrays"] = msg.content["arrays"]
        seen["config"] = dict(msg.content["config"])
        seen["run_config"] = dict(ctx.run_config)
        lr = float(msg.content["config"]["lr"])
        loss = user_train(net, loaders[0], lr, clustered.regularizer)
        seen["regularizer"] = float(clustered.regularizer(net))
        metrics = MetricRecord({"train_loss": loss, "num-examples": len(train_set)})
        content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    @clustered.evaluate
    def evaluate(msg: Message, ctx: Context) -> Message:
        seen["eval_arrays"] = msg.content["arrays"]
        metrics = MetricRecord({"eval_loss": 0.5, "eval_acc": 0.75, "num-examples": 32})
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    return clustered, train, evaluate, seen


@pytest.mark.parametrize("flip", [False, True])
def test_user_handler_gets_the_best_cluster_model_and_config(flip: bool) -> None:
    _, train, _, seen = build(flip)
    models = [model_fitting(False), model_fitting(True)]
    message = train_message(models, {"lr": 0.05, "my-key": "kept"})
    reply = train(message, context({"local-epochs": 5}))
    metrics = reply.content.metric_records["metrics"]
    assert metrics[p.M_CLUSTER] == int(flip)
    assert list(seen["arrays"].keys()) == list(models[int(flip)].keys())
    assert np.array_equal(seen["arrays"]["weight"].numpy(), models[int(flip)]["weight"].numpy())
    assert seen["config"] == {"lr": 0.05, "my-key": "kept"}
    assert seen["run_config"] == {"local-epochs": 5}
    assert metrics[p.M_TRAIN_LOSS] == metrics["train_loss"]
    assert seen["regularizer"] == 0.0


def test_reply_is_the_users_momentum_training_not_plain_sgd() -> None:
    _, train, _, _ = build(False)
    start = ArrayRecord(make_net().state_dict())
    reply = train(
        Message(RecordDict({p.ARRAYS: start, p.CONFIG: ConfigRecord({"lr": 0.1})}), 7, "train"),
        context(),
    )
    got = reply.content["arrays"]["weight"].numpy()
    # The same loop run by hand reproduces the reply exactly.
    net = make_net()
    user_train(net, DataLoader(DictDigits(64, False), batch_size=16), 0.1)
    assert np.allclose(got, net.weight.detach().numpy())
    # fl-clusters' built-in learner (plain SGD) lands elsewhere from the same start.
    data = DictDigits(64, False)
    plain, _ = TorchLearner(
        make_net(), torch.utils.data.TensorDataset(data.x, data.y), []  # type: ignore[arg-type]
    ).train(start, lr=0.1, batch_size=16, epochs=1)
    assert not np.allclose(got, plain["weight"].numpy(), atol=1e-3)


def test_proximal_mu_reaches_the_users_loss_through_the_regularizer() -> None:
    _, train, _, seen = build(False)
    config = {"lr": 0.1, p.CFG_PROX_MU: 1.0}
    train(train_message([model_fitting(False), model_fitting(True)], config), context())
    assert seen["regularizer"] > 0.0


def test_fedem_trains_the_components_as_the_users_handler_last_trained() -> None:
    """FedEM's M-step weighs samples, so fl-clusters trains the components, with the
    user's optimizer, hyperparameters and number of steps once the handler has trained."""
    _, train, _, _ = build(False)
    ctx = context()
    models = [model_fitting(False), model_fitting(True)]
    mixture = {"lr": 0.5, p.CFG_MIXTURE: True, p.CFG_ROUND: 2}
    stepped: list[tuple] = []
    hook = register_optimizer_step_post_hook(lambda optimizer, *_: stepped.append(
        (type(optimizer), optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["momentum"])))
    try:
        # Before the handler ever trained here: plain SGD, no optimizer steps.
        train(train_message(models, mixture), ctx)
        assert stepped == []
        train(train_message(models, {"lr": 0.05}), ctx)  # 64 samples, batches of 16
        assert stepped == [(torch.optim.SGD, 0.05, 0.9)] * 4
        stepped.clear()
        reply = train(train_message(models, mixture), ctx)
    finally:
        hook.remove()
    # Each of the 2 components: the handler's 4 momentum steps at its lr, not the server's.
    assert stepped == [(torch.optim.SGD, 0.05, 0.9)] * 8
    assert len(p.unpack_clusters(reply.content[p.ARRAYS])) == 2


def test_evaluate_reply_carries_protocol_names_and_cluster() -> None:
    _, _, evaluate, seen = build(True)
    message = train_message([model_fitting(False), model_fitting(True)], {})
    reply = evaluate(message, context())
    metrics = reply.content.metric_records["metrics"]
    assert (metrics[p.M_ACCURACY], metrics[p.M_LOSS], metrics[p.M_CLUSTER]) == (0.75, 0.5, 1)
    expected = model_fitting(True)["weight"].numpy()
    assert np.array_equal(seen["eval_arrays"]["weight"].numpy(), expected)
    # The original message is untouched for Flower (reply_to, later handlers).
    assert p.CLUSTERS in message.content.array_records


def validation_message(model: ArrayRecord) -> Message:
    """ACFL's trial evaluation: one model, scored on the validation split."""
    content = RecordDict({p.ARRAYS: model, p.CONFIG: ConfigRecord({p.CFG_SPLIT: "validation"})})
    return Message(content=content, dst_node_id=7, message_type="evaluate")


def test_validation_split_without_a_validation_loader_is_refused_not_scored_on_test() -> None:
    _, _, evaluate, seen = build(False)
    with pytest.raises(ValueError, match=r"split 'validation' \(ACFL's trials\).*return "
                       r"\(train, validation, test\)"):
        evaluate(validation_message(model_fitting(False)), context())
    assert "eval_arrays" not in seen


@pytest.mark.parametrize("flip", [False, True])
def test_validation_split_is_scored_on_the_validation_loader(flip: bool) -> None:
    _, _, evaluate, seen = build(False, validation=True)
    reply = evaluate(validation_message(model_fitting(flip)), context())
    metrics = reply.content.metric_records["metrics"]
    # The validation loader's 24 samples, not the test loader's 32: the model that
    # fits the node's group is right on all of them, the other one on none.
    assert metrics[p.M_NUM_EXAMPLES] == 24
    assert metrics[p.M_ACCURACY] == (0.0 if flip else 1.0)
    # The user's handler (test data) never saw the trial.
    assert "eval_arrays" not in seen
    # A plain evaluation still goes to the user's handler.
    evaluate(train_message([model_fitting(False), model_fitting(True)], {}), context())
    assert "eval_arrays" in seen


def test_loaders_of_another_arity_are_refused() -> None:
    app = ClientApp()
    loader = DataLoader(DictDigits(8, False), 4)
    clustered = ClusteredClient(app, make_net, lambda ctx: (loader,))
    with pytest.raises(ValueError, match=r"\(train, test\) or \(train, validation, test\) "
                       r"loaders; got 1 loaders"):
        clustered.learner(context())


def test_gradient_request_is_refused_before_the_users_handler_runs() -> None:
    _, train, _, seen = build(False)
    models = [model_fitting(False), model_fitting(True)]
    message = train_message(models, {p.CFG_RETURN: "gradient"})
    with pytest.raises(ValueError, match="mode='model'"):
        train(message, context())
    assert "arrays" not in seen


def test_wrong_batch_format_names_what_is_expected() -> None:
    _, train, _, _ = build(False, batch_keys=("image", "target"))
    expected = r"dicts with keys 'image'/'target'; got dict with keys \['img', 'label'\]"
    with pytest.raises(ValueError, match=expected):
        train(train_message([model_fitting(False), model_fitting(True)], {}), context())


def handler(msg: Message, ctx: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


@pytest.mark.parametrize("category", ["train", "evaluate"])
def test_an_unwrapped_default_handler_is_refused_when_registered(category: str) -> None:
    app = ClientApp()
    clustered = ClusteredClient(app, make_net, lambda ctx: ([], []))
    register = getattr(app, category)
    with pytest.raises(ValueError, match=rf"handler 'handler' is not wrapped by ClusteredClient"
                       rf".*Put @clustered.{category} directly under @app.{category}\(\)"):
        register()(handler)
    # Decorators in the wrong order register the bare handler: refused too.
    with pytest.raises(ValueError, match="is not wrapped by ClusteredClient"):
        getattr(clustered, category)(register()(handler))
    other = "evaluate" if category == "train" else "train"
    with pytest.raises(ValueError, match=rf"is wrapped with @clustered.{other}"):
        register()(getattr(clustered, other)(handler))
    assert f"{category}.default" not in app._registered_funcs
    register()(getattr(clustered, category)(handler))
    assert f"{category}.default" in app._registered_funcs
    # Named actions are the app's own: strategies never send them.
    register("custom")(handler)
    assert f"{category}.custom" in app._registered_funcs


def test_wrapper_created_after_the_handlers_is_refused() -> None:
    app = ClientApp()
    app.evaluate()(handler)
    with pytest.raises(ValueError, match=r"already has evaluate.default handlers.*right after "
                       r"`app = ClientApp\(\)`"):
        ClusteredClient(app, make_net, lambda ctx: ([], []))


def test_queries_are_registered_on_the_users_app() -> None:
    app = ClientApp()
    ClusteredClient(app, make_net, lambda ctx: ([], []))
    handlers = {k for k in app._registered_funcs}
    assert {"query.report", "query.cluster_losses", "query.sample_assignment",
            "query.features"} <= handlers


def test_evaluate_fn_is_called_per_cluster_model() -> None:
    calls: list[float] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = make_net()
        net.load_state_dict(arrays.to_torch_state_dict())  # fails on packed keys
        calls.append(float(net.weight[0, 0]))
        return MetricRecord({"accuracy": float(net.weight[1, 0])})

    wrapped = per_cluster_evaluate(evaluate_fn)
    models = [model_fitting(False), model_fitting(True)]
    result = wrapped(3, p.pack_clusters(models))
    assert dict(result) == {"cluster-0/accuracy": 5.0, "cluster-1/accuracy": -5.0}
    assert dict(wrapped(0, models[0])) == {"accuracy": 5.0}


# ------------------------------------------------ examples/quickstart-pytorch-clustered
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "quickstart-pytorch-clustered"
SIM_CLIENTS = 6


def test_example_pyproject_config_matches_code_defaults() -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from pytorchexample.task import DEFAULTS
    finally:
        sys.path.remove(str(EXAMPLE))
    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert config["tool"]["flwr"]["app"]["config"] == DEFAULTS


def simulate(results_dir: Path, overrides: dict) -> dict:
    """Run the example in process (Ray) and return its summary.json."""
    from flwr.simulation import run_simulation
    from pytorchexample.client_app import build_client_app
    from pytorchexample.server_app import build_server_app

    config = {"results-dir": str(results_dir), **overrides}
    run_simulation(
        server_app=build_server_app(config),
        client_app=build_client_app(config),
        num_supernodes=SIM_CLIENTS,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    return json.loads((results_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def example_path(shared_ray: SharedRay) -> Iterator[None]:
    """Ray's workers import the example too: give them (and us) its folder."""
    previous = os.environ.get("PYTHONPATH")
    paths = [str(EXAMPLE), str(EXAMPLE.parent.parent)]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([previous] if previous else []))
    sys.path.insert(0, str(EXAMPLE))
    shared_ray.open()
    yield
    sys.path.remove(str(EXAMPLE))
    if previous is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = previous


@pytest.fixture(scope="module")
def fedavg_summary(example_path: None, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return simulate(tmp_path_factory.mktemp("fedavg"), {"strategy": "fedavg"})


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ifca", "cfl", "flhc", "wecfl"])
def test_example_recovers_groups_and_beats_fedavg(
    strategy: str, fedavg_summary: dict, tmp_path: Path
) -> None:
    # CFL runs on its defaults: the relative gate scales with this CNN's update
    # norms (mean ~3, max ~5.7 at the round-3 split; the old absolute defaults
    # 0.4/0.45 never split here).
    overrides = {"strategy": strategy}
    summary = simulate(tmp_path, overrides)
    if strategy != "cfl":
        # IFCA and WeCFL are told k = 2; FL+HC finds 2 in every measured run (largest
        # jump of merge heights ~1.9 at round 4; a cut relative to the nearest
        # distances found 1 here).
        assert summary["num_models"] == 2
        assert summary["ari"] == 1.0, summary
    else:
        # CFL splits the groups apart (3 + 3, first split at round 3-4 in every
        # measured run) but may split a group again: on 240 samples per client the
        # updates of one group's clients are as dissimilar (cosine ~0) as the
        # groups' late in training. No cluster ever mixed the two groups.
        assert summary["num_models"] >= 2
        assert homogeneity_score(summary["groups"], summary["clusters"]) == 1.0, summary
    clustered, fedavg = summary["per_client_accuracy"], fedavg_summary["per_client_accuracy"]
    # Measured: every client 0.93-1.0 with IFCA/CFL/FL+HC/WeCFL; FedAvg serves one group
    # (0.03-0.25 on the other, 0.8-0.95 on its own) and averages ~0.5 per client.
    assert min(clustered) >= 0.8, summary
    assert np.mean(clustered) >= np.mean(fedavg) + 0.2, (summary, fedavg_summary)
    # The app's FedAvg-style evaluate_fn ran once per cluster model: one of them
    # names digits as the central set does (group 0).
    central = summary["central"]
    models = range(summary["num_models"])
    expected = [f"cluster-{j}/{name}" for j in models for name in ("accuracy", "loss")]
    assert sorted(central) == sorted(expected)
    assert max(central[f"cluster-{j}/accuracy"] for j in models) >= 0.9
