"""Flower's quickstart-pytorch with fl-clusters plugged in as the docs show, run in process.

The quickstart's ClientApp and ServerApp (Flower 1.41, verbatim:
benchmarks/quickstart_pytorch.py) get the README's client and server diffs, the
server's strategy line becomes the constructor call docs/plugin.md gives a
strategy, and the app runs on the task of
``examples/quickstart-pytorch-clustered`` (offline digits, groups whose labels
conflict), with diffs to that task where a setting changes it. The tests
(tests/test_plugin_readme.py, tests/test_plugin_groups.py) and the held-out
settings sweep (benchmarks/plugin_settings.py) run the same apps from here.

:class:`~fl_clusters.loopback.LoopbackGrid` hands every message to a ClientApp in
this process, one node after another, with one persistent ``Context`` per node
(``partition-id``, ``num-partitions`` and the run config, as ``flwr run`` gives
them). No Ray, no SuperLink: a run costs only its training.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from benchmarks.quickstart_pytorch import QUICKSTART_CLIENT, QUICKSTART_SERVER
from fl_clusters.logical_grid import LogicalClientGrid
from fl_clusters.loopback import LoopbackGrid

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "quickstart-pytorch-clustered"
README_SECTION = "## Plug into your own Flower app"


def run_server(
    server_app: ServerApp,
    client_app: ClientApp,
    num_nodes: int,
    run_config: Mapping[str, Any],
    seed: int = 0,
    pool: int = 0,
) -> LoopbackGrid:
    """Run ``server_app`` against ``num_nodes`` loopback nodes; return the grid.

    Every node runs in this process, one message after another, so seeding
    torch's generator once (the apps' initial weights, loader shuffles) makes
    the whole run repeat. ``pool`` > 0: the ``num_nodes`` are logical clients
    served by that many nodes, the one line a user's ServerApp adds
    (``LogicalClientGrid(grid, num_clients)``).
    """
    torch.manual_seed(seed)
    grid = LoopbackGrid(client_app, pool or num_nodes, run_config)
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config)
    )
    server_app(LogicalClientGrid(grid, num_nodes) if pool else grid, context)
    return grid


@contextmanager
def app_package(folder: Path, name: str = "pytorchexample") -> Iterator[None]:
    """Import the package ``name`` from ``folder`` (and only there) inside the block.

    The example and the written apps share the quickstart's package name, so
    modules imported from one must not serve the other.
    """

    def forget() -> None:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]

    forget()
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        forget()


def readme_diffs() -> list[str]:
    """The fenced ``diff`` blocks of the README's plug-in section, in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index(README_SECTION)
    end = text.index("\n## ", start + len(README_SECTION))
    return re.findall(r"```diff\n(.*?)```", text[start:end], flags=re.S)


def apply_diff(source: str, diff: str) -> str:
    """Apply a README-style diff: ``...`` skips lines, the other lines match in order.

    A context (`` ``) or removed (``-``) line must be the next line of ``source``,
    or any later one after ``...`` (and at the start); ``+`` lines go in where the
    cursor is.

    Raises
    ------
    ValueError
        A diff line that matches nothing (a README drifting from the quickstart), or
        one that starts with neither `` ``, ``-`` nor ``+``.
    """
    lines = source.splitlines()
    cursor, skip = 0, True
    for raw in diff.splitlines():
        if raw.strip() == "...":
            skip = True
            continue
        sign, text = (raw[0], raw[1:]) if raw else (" ", "")
        if sign == "+":
            lines.insert(cursor, text)
            cursor += 1
            continue
        if sign not in " -":
            raise ValueError(f"diff line {raw!r} starts with neither ' ', '-' nor '+'")
        candidates = range(cursor, len(lines)) if skip else range(cursor, cursor + 1)
        found = next((i for i in candidates if i < len(lines) and lines[i] == text), None)
        if found is None:
            raise ValueError(f"diff line {raw!r} matches no line of the source it is applied to")
        cursor, skip = found, False
        if sign == "-":
            del lines[cursor]
        else:
            cursor += 1
    return "\n".join(lines) + "\n"


def write_app(folder: Path, diffs: Sequence[str], task_diffs: Sequence[str] = ()) -> Path:
    """The quickstart package under ``folder`` with the client and server ``diffs`` applied.

    ``diffs`` ends with the server's diff; the ones before it go to the client, in
    order (the README's, then e.g. the proximal recipe's, :func:`plugged_diffs`).

    Its ``task.py`` is the example's offline task, with ``task_diffs`` applied in
    order (a setting's change to the user's task). Returns ``folder``.
    """
    package = folder / "pytorchexample"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    task = (EXAMPLE / "pytorchexample" / "task.py").read_text()
    for diff in task_diffs:
        task = apply_diff(task, diff)
    (package / "task.py").write_text(task)
    *clients, server = diffs
    client = QUICKSTART_CLIENT
    for diff in clients:
        client = apply_diff(client, diff)
    (package / "client_app.py").write_text(client)
    (package / "server_app.py").write_text(apply_diff(QUICKSTART_SERVER, server))
    return folder


PROXIMAL_SECTION = "### FedProx / FedSoft proximal term"
# The strategies whose documented recipe adds the proximal term to the user's loss.
PROXIMAL = ("FedSoft",)


def plugin_table_constructors() -> list[str]:
    """The constructor calls of docs/plugin.md's "which strategies" table, row by row."""
    text = (ROOT / "docs" / "plugin.md").read_text()
    start = text.index("| strategy | in your ServerApp |")
    rows = [row for row in text[start:text.index("\n\n", start)].splitlines()[2:]
            if row.startswith("|")]
    return [call for row in rows
            for call in re.findall(r"`([A-Za-z]+\(.*?\))`", row.split("|")[2])]


# The README's lines that a plugged strategy's app changes.
README_STRATEGY = "IFCA(num_clusters=2, fraction_evaluate=fraction_evaluate)"
README_LOADERS = '''+def loaders(context):  # this node's (train, test) loaders
+    node = context.node_config
+    return load_data(node["partition-id"], node["num-partitions"],
+                     context.run_config["batch-size"])'''
TRAIN_HANDLER = " def train(msg: Message, context: Context):"
QUICKSTART_TRAIN_DATA = "    trainloader, _ = load_data(partition_id, num_partitions, batch_size)"
# The quickstart unplugged: Flower's FedAvg, the reference of every comparison.
FEDAVG = "FedAvg"


def documented_call(strategy: str, groups: int = 2) -> str:
    """docs/plugin.md's constructor call for ``strategy``, with the quickstart's argument.

    ACFL's is its section's (a phase 1 that ends within the run), the others' the
    table's. A call that names ``num_clusters=2`` asks for ``groups`` clusters, as a
    user who knows the number of groups writes it.
    """
    text = (ROOT / "docs" / "plugin.md").read_text()
    if strategy == "ACFL":
        found = re.search(r"^strategy = (ACFL\(.*\))$", text, flags=re.M)
        if found is None:
            raise ValueError("docs/plugin.md shows no `strategy = ACFL(...)` line")
        call = found.group(1)
    else:
        documented = [c for c in plugin_table_constructors() if c.startswith(f"{strategy}(")]
        if not documented:
            raise ValueError(f"docs/plugin.md's strategy table has no {strategy}(...) call")
        arguments = documented[0][len(strategy) + 1:-1]
        call = (f"{strategy}({arguments + ', ' if arguments else ''}"
                "fraction_evaluate=fraction_evaluate)")
    return call.replace("num_clusters=2", f"num_clusters={groups}")


def acfl_client(client: str) -> str:
    """The README's client diff with docs/plugin.md's ACFL validation recipe in it."""
    text = (ROOT / "docs" / "plugin.md").read_text()
    section = text[text.index("### ACFL: a validation loader"):]
    recipe = re.search(r"```python\n(.*?)```", section, flags=re.S)
    if recipe is None:
        raise ValueError("docs/plugin.md's ACFL section has no python block")
    for line, name in ((README_LOADERS, "loaders"), (TRAIN_HANDLER, "train handler")):
        if line not in client:
            raise ValueError(f"the README's {name} changed: update {__file__}")
    plus = "\n".join(f"+{line}" for line in recipe.group(1).rstrip("\n").splitlines())
    # The train handler trains on the recipe's train loader, as the docs say.
    handler = (f"{TRAIN_HANDLER}\n ...\n-{QUICKSTART_TRAIN_DATA}\n"
               "+    trainloader, _, _ = loaders(context)")
    return client.replace(README_LOADERS, plus).replace(TRAIN_HANDLER, handler)


def proximal_recipe() -> tuple[str, str]:
    """docs/plugin.md's proximal-term recipe: the ``task.py`` diff and the train
    handler's diff."""
    text = (ROOT / "docs" / "plugin.md").read_text()
    section = text[text.index(PROXIMAL_SECTION):]
    task_diff, handler_diff = re.findall(r"```diff\n(.*?)```", section, flags=re.S)[:2]
    return task_diff, handler_diff


def plugged_diffs(strategy: str, groups: int = 2) -> list[str]:
    """The client and server diffs that plug ``strategy`` into the quickstart.

    The README's, with its IFCA line swapped for :func:`documented_call`; ACFL's
    client also takes the validation recipe (:func:`acfl_client`), FedSoft's the
    proximal term in its train handler (:func:`proximal_recipe`; the example's
    ``train()`` takes the ``regularizer`` the recipe's ``task.py`` diff adds).
    :data:`FEDAVG` is the quickstart as it is (no diff). The last diff is the
    server's (:func:`write_app`).
    """
    if strategy == FEDAVG:
        return ["", ""]
    client, server = readme_diffs()
    if README_STRATEGY not in server:
        raise ValueError(f"the README's strategy line changed: update {__file__}")
    server = server.replace(README_STRATEGY, documented_call(strategy, groups)).replace(
        "import IFCA, cluster_models", f"import {strategy}, cluster_models")
    if strategy == "ACFL":
        client = acfl_client(client)
    if strategy in PROXIMAL:
        return [client, proximal_recipe()[1], server]
    return [client, server]


@dataclass(frozen=True)
class Outcome:
    """What a run of a written app left: every partition's group, model and accuracy.

    ``chosen[i]`` is the saved model (index into ``models``, in saving order) of
    lowest training loss on partition ``i``, as the wrapper chooses, and
    ``accuracy[i]`` that model's accuracy on the partition's test loader.
    """

    groups: list[int]
    chosen: list[int]
    accuracy: list[float]
    models: list[Path]
    grid: LoopbackGrid


def saved_models(folder: Path) -> list[Path]:
    """The models the app saved in ``folder``: ``final_model.pt`` or ``final_model_<j>.pt``,
    ordered by ``j``."""
    return sorted(folder.glob("final_model*.pt"), key=lambda path: (len(path.name), path.name))


def run_app(folder: Path, num_nodes: int, run_config: Mapping[str, Any],
            seed: int = 0, pool: int = 0) -> Outcome:
    """Run the app :func:`write_app` wrote in ``folder`` (also its working directory), then
    score the models it saved on every partition (``pool``: :func:`run_server`'s)."""
    with app_package(folder), contextlib.chdir(folder):
        client_app = importlib.import_module("pytorchexample.client_app")
        server_app = importlib.import_module("pytorchexample.server_app")
        task = importlib.import_module("pytorchexample.task")
        grid = run_server(server_app.app, client_app.app, num_nodes, run_config, seed, pool)
        models = saved_models(folder)
        if not models:
            raise FileNotFoundError(f"the app saved no final_model*.pt in {folder}")
        nets = []
        for path in models:
            nets.append(task.Net())
            nets[-1].load_state_dict(torch.load(path))
        chosen, accuracy = [], []
        cpu = torch.device("cpu")
        for partition in range(num_nodes):
            train, test = task.load_data(partition, num_nodes, 64)
            losses = [task.test(net, train, cpu)[0] for net in nets]
            chosen.append(int(np.argmin(losses)))
            accuracy.append(float(task.test(nets[chosen[-1]], test, cpu)[1]))
        groups = [int(task.group_of(partition)) for partition in range(num_nodes)]
    return Outcome(groups, chosen, accuracy, models, grid)
