"""Cost of a simulated federation against the same local work in one plain PyTorch loop.

For every (data set, strategy, number of clients) job, runs the app's own federation
(``flwr run`` from the project root, or ``flwr.simulation.run_simulation`` in a fresh
process) and then the same work without Flower: the same partitions, model, seeds and
local SGD steps per client per round, FedAvg with Flower's own averaging (or
IFCA's loss-based choice and fl-clusters' per-cluster averaging) and every client's
test evaluation each round, one client after the other in one process with one torch
thread (a client's ``torch-threads``).

Round times are the ServerApp's own (``seconds`` in the run's rounds.jsonl: from
sending a round's training messages to aggregating its evaluation). Start-up is
measured from the start of the federation's (or the plain loop's) process to the
arrival of Flower's ``[ROUND 1/N]`` log line, which ``flwr run --stream`` delivers in
batches every 0.2 to 0.5 s; Flower's own time of all rounds (``strategy_s``, round 1
included) is recorded next to them. Bytes, ARI and accuracy come
from the run's ``summary.json``. Peak memory is reported twice: ``getrusage``'s maxrss
of one process (see the ``memory`` entries' ``rusage`` text) and the peak summed RSS of
the process tree, sampled every 0.5 s from /proc (shared pages count once per process).
Writes JSON to ``--out`` (the run's ``provenance``, the machine and the jobs) and
prints a markdown table.

    python benchmarks/overhead.py [--clients 20 100 1000] [--datasets digits fashion-mnist]
        [--strategies fedavg ifca] [--rounds 5] [--via flwr-run|simulation]
        [--max-in-flight 0 32 512] [--model mlp|cnn] [--num-gpus 0.1] [--data-root DIR]
        [--out benchmarks/measured/overhead.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import cache
from importlib.metadata import version
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from flwr.simulation import run_simulation
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.client_app import build_client_app
from fl_clusters.clustering import group_by_kmeans, output_layer_profiles, weighted_average
from fl_clusters.config import parse_run_config, partition_settings
from fl_clusters.data import load_client_data, load_dataset
from fl_clusters.files import atomic_output
from fl_clusters.learner import TorchLearner, resolve_device
from fl_clusters.models import build_model
from fl_clusters.server_app import build_server_app, initial_arrays
from fl_clusters.sweep.provenance import measurement_provenance

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "measured" / "overhead.json"
ROUND_LINE = re.compile(r"\[ROUND (\d+)/\d+\]")
FINISHED_LINE = re.compile(r"Strategy execution finished in ([0-9.]+)s")
# The ServerApp's own clock of its start-up phases (fl_clusters.server_app.start_up).
STARTUP_LINES = {
    "nodes_connected_s": re.compile(r"start-up: \d+ nodes connected after ([0-9.]+) s"),
    "handshake_s": re.compile(r"start-up: handshake with \d+ nodes took ([0-9.]+) s"),
}
MEMORY_PERIOD_S = 0.5
SUPERLINK_WAIT_S = 900.0
SUPERLINK_POLL_S = 5.0
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


class RoundMarks(logging.Handler):
    """The monotonic time at which each round began and the last one ended.

    Fed either by the ``flwr`` logger (``run_simulation`` in this process) or line by
    line from a streamed output (:meth:`note`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.starts: dict[int, float] = {}
        self.finished: float | None = None
        self.strategy_s: float | None = None
        self.startup_phases: dict[str, float] = {}

    def note(self, text: str, now: float) -> None:
        """Record ``now`` if ``text`` is a round's first line or the strategy's last one,
        and the seconds of a start-up phase the ServerApp logged."""
        for phase, pattern in STARTUP_LINES.items():
            if phase not in self.startup_phases and (timed := pattern.search(text)):
                self.startup_phases[phase] = float(timed.group(1))
        found = ROUND_LINE.search(text)
        if found:
            self.starts.setdefault(int(found.group(1)), now)
        elif (finished := FINISHED_LINE.search(text)) and self.finished is None:
            self.finished = now
            self.strategy_s = float(finished.group(1))

    def emit(self, record: logging.LogRecord) -> None:
        """Note a log record at the time it is emitted."""
        self.note(record.getMessage(), time.monotonic())

    def check_complete(self, rounds: int) -> None:
        """Raise ``RuntimeError`` unless every round's line and the end of the last were seen.

        Round times come from rounds.jsonl; the lines only show that the run finished.
        """
        missing = [r for r in range(1, rounds + 1) if r not in self.starts]
        if missing or self.finished is None:
            raise RuntimeError(
                f"the output lacks round lines: saw rounds {sorted(self.starts)} of {rounds}, "
                f"the end of the last one {'seen' if self.finished else 'not seen'}"
            )


class TreeMemory:
    """Peak summed RSS (MB) of a process and all its descendants, sampled from /proc.

    Parameters
    ----------
    root : int
        PID of the tree's root.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(MEMORY_PERIOD_S):
            self.peak_mb = max(self.peak_mb, self.sample_mb())

    def sample_mb(self) -> float:
        """Summed RSS of the tree now."""
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # the process ended while we looked
                continue
            # Fields after the command name, which may hold spaces: ppid is the 2nd, rss the 22nd.
            fields = stat.rsplit(")", 1)[1].split()
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            rss[pid] = int(fields[21])
        total, stack = 0, [self.root]
        while stack:
            pid = stack.pop()
            total += rss.get(pid, 0)
            stack.extend(children.get(pid, []))
        return total * PAGE_MB


def _maxrss_mb(usage: resource.struct_rusage) -> float:
    return usage.ru_maxrss / 1024  # Linux reports KiB


def run_config(
    dataset: str, strategy: str, clients: int, rounds: int, results_dir: str,
    max_in_flight: int = 0, overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run-config keys a job sets, then ``overrides`` (e.g. ``model``, ``data-root``);
    every other key keeps its default."""
    return {
        "strategy": strategy,
        "dataset": dataset,
        "num-rounds": rounds,
        "min-nodes": clients,
        "plots": False,
        # Flower's own round lines: RoundMarks times the rounds from them.
        "verbose": True,
        "results-dir": results_dir,
        "max-in-flight": max_in_flight,
        **(overrides or {}),
    }


def read_summary(results_dir: str) -> dict[str, Any]:
    """The summary.json fields this benchmark reports and the round times, from a job's
    results folder (``round_s``: every round's ``seconds`` in rounds.jsonl).

    Raises
    ------
    RuntimeError
        If the run wrote no single summary.json (``flwr run`` exits 0 when it fails).
    """
    found = list(Path(results_dir).glob("*/summary.json"))
    if len(found) != 1:
        raise RuntimeError(f"expected one summary.json under {results_dir}, found {len(found)}")
    summary = json.loads(found[0].read_text())
    keys = ("wall_time_s", "bytes_sent", "bytes_received", "ari", "personalized_accuracy",
            "placement")
    rounds = (found[0].parent / "rounds.jsonl").read_text().splitlines()
    return {
        **{key: summary[key] for key in keys},
        "round_s": [json.loads(line)["seconds"] for line in rounds],
    }


def round_stats(round_s: list[float]) -> dict[str, Any]:
    """Per-round times and their mean over rounds 2..N (round 1 loads the data)."""
    later = round_s[1:] or round_s
    return {
        "round_s": round_s,
        "round_mean_s": float(np.mean(later)),
        "round_mean_over": "rounds 2..N" if len(round_s) > 1 else "round 1 (only one round)",
    }


def federation_stats(
    t0: float, round_s: list[float], round1_start: float, strategy_s: float
) -> dict[str, Any]:
    """Round times, start-up, and Flower's own clock of all rounds (``strategy_s``).

    ``strategy_s`` is the ServerApp's "Strategy execution finished in" figure: exact
    even where the round marks are not (``flwr run``'s stream), but it includes round 1.
    """
    return {
        **round_stats(round_s),
        "startup_s": round1_start - t0,
        "startup_to_round1_end_s": round1_start - t0 + round_s[0],
        "strategy_s": strategy_s,
        "strategy_round_mean_s": strategy_s / len(round_s),
    }


def _wait_for_no_superlink() -> None:
    """Wait until no ``flower-superlink`` runs (another job's run must end first)."""
    deadline = time.monotonic() + SUPERLINK_WAIT_S
    while True:
        found = subprocess.run(
            ["pgrep", "-f", "flower-superlink"], capture_output=True, text=True, check=False
        ).stdout.split()
        if not found:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"a flower-superlink (PIDs {found}) still runs after {SUPERLINK_WAIT_S:.0f} s; "
                "if it is a leftover, stop it with deploy/stop-local-superlink.sh"
            )
        print(f"waiting for flower-superlink {found} to end", file=sys.stderr, flush=True)
        time.sleep(SUPERLINK_POLL_S)


@cache
def app_copy() -> Path:
    """A copy of the app (the files git lists) for `flwr run`, made once per process.

    `flwr run` 1.41 moves pyproject.toml's ``[tool.flwr.federations]`` table to the
    Flower config and comments it out in place: a benchmark must not change the
    checkout it measures.
    """
    destination = Path(tempfile.mkdtemp(prefix="overhead-app-"))
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, destination / name)
    return destination


def federation_flwr_run(config: dict[str, Any], clients: int) -> dict[str, Any]:
    """Run one job with ``flwr run . --stream`` as ``make run`` does; stop its SuperLink.

    Instead of stopping a SuperLink found before the run (``make run``), this waits
    for it to end: on a shared machine it may belong to another job's run.

    Parameters
    ----------
    config : dict[str, Any]
        Run-config overrides (:func:`run_config`).
    clients : int
        ``num-supernodes``.
    """
    overrides = " ".join(
        f"{key}={json.dumps(value) if isinstance(value, bool) else repr(value)}"
        for key, value in config.items()
    )
    command = [
        "flwr", "run", ".", "--stream",
        "--federation-config", f"num-supernodes={clients} client-resources-num-cpus=1",
        "--run-config", overrides,
    ]
    env = {
        **os.environ,
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",  # as the Makefile sets it
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    _wait_for_no_superlink()
    marks, tail = RoundMarks(), []
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            command, cwd=app_copy(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True
        )
        with TreeMemory(proc.pid) as memory:
            for line in proc.stdout:  # type: ignore[union-attr]
                marks.note(line, time.monotonic())
                tail = [*tail[-40:], line]
            # wait4 reports this child's own rusage, not that of every child so far.
            _, status, usage = os.wait4(proc.pid, 0)
        end = time.monotonic()
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        subprocess.run([ROOT / "deploy" / "stop-local-superlink.sh", "--quiet"], check=True)
    try:
        summary = read_summary(config["results-dir"])
        marks.check_complete(config["num-rounds"])
    except RuntimeError as err:
        raise RuntimeError(f"{err}; flwr run exited {proc.returncode}:\n{''.join(tail)}") from err
    return {
        "command": command,
        "wall_s": end - t0,
        **federation_stats(t0, summary.pop("round_s"), marks.starts[1], marks.strategy_s),  # type: ignore[arg-type]
        "round_marks": "round 1's start: arrival of its streamed line (lines come in batches "
        "every 0.2 to 0.5 s); round times: the ServerApp's, from rounds.jsonl",
        "startup_phases": marks.startup_phases,
        "summary": summary,
        "memory": {
            "rusage_maxrss_mb": _maxrss_mb(usage),
            "rusage": "maxrss of the flwr CLI process and its waited children (wait4); the "
            "detached SuperLink and its simulation are not among them",
            "tree_peak_rss_mb": memory.peak_mb,
            "tree": "flwr CLI and descendants (the SuperLink, its simulation, Ray workers)",
        },
    }


def in_fresh_process(
    target: Callable[..., None], *args: Any
) -> tuple[dict[str, Any], float, float]:
    """Run ``target(*args, t0, conn)`` in a spawned process; its result and where it ran.

    ``target`` sends one dict through ``conn``. Returns that dict, ``t0`` (the
    monotonic time just before the process started: the clock is the same for all
    processes) and the peak summed RSS (MB) of the process and its descendants.
    """
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    t0 = time.monotonic()
    proc = context.Process(target=target, args=(*args, t0, send))
    proc.start()
    send.close()
    with TreeMemory(proc.pid) as memory:
        try:
            result = receive.recv()
        except EOFError:
            proc.join()
            raise RuntimeError(f"{target.__name__} exited {proc.exitcode} (see above)") from None
    proc.join()
    return result, t0, memory.peak_mb


def _simulation_child(
    config: dict[str, Any], clients: int, num_gpus: float, t0: float, conn: Any
) -> None:
    marks = RoundMarks()
    logging.getLogger("flwr").addHandler(marks)
    run_simulation(
        server_app=build_server_app(config),
        client_app=build_client_app(config),
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": num_gpus}},
    )
    conn.send(
        {
            "end": time.monotonic(),
            "round1_start": marks.starts[1],
            "strategy_s": marks.strategy_s,
            "startup_phases": marks.startup_phases,
            "maxrss_mb": _maxrss_mb(resource.getrusage(resource.RUSAGE_SELF)),
        }
    )


def federation_simulation(
    config: dict[str, Any], clients: int, num_gpus: float = 0.0
) -> dict[str, Any]:
    """Run one job with ``run_simulation`` (as tests/conftest.py does) in a fresh process,
    one CPU and ``num_gpus`` GPUs per client."""
    result, t0, tree_mb = in_fresh_process(_simulation_child, config, clients, num_gpus)
    summary = read_summary(config["results-dir"])
    return {
        "command": "flwr.simulation.run_simulation in a spawned process",
        "wall_s": result["end"] - t0,
        **federation_stats(t0, summary.pop("round_s"), result["round1_start"],
                           result["strategy_s"]),
        "round_marks": "round 1's start: emission of the flwr logger's record in the "
        "simulation's process; round times: the ServerApp's, from rounds.jsonl",
        "startup_phases": result["startup_phases"],
        "summary": summary,
        "memory": {
            "rusage_maxrss_mb": result["maxrss_mb"],
            "rusage": "maxrss of the process that called run_simulation (RUSAGE_SELF): the "
            "ServerApp and the simulation engine, not the Ray workers running the ClientApps",
            "tree_peak_rss_mb": tree_mb,
            "tree": "that process and its descendants (Ray and its workers)",
        },
    }


def client_learner(
    settings: dict[str, Any], client: int, clients: int, model: torch.nn.Module | None = None
) -> TorchLearner:
    """Client ``client``'s learner (of ``clients``), with the ClientApp's partition.

    ``model``: the network to share with other learners (a new one when ``None``).
    """
    root = settings["data-root"] or None
    data = load_client_data(settings["dataset"], root, client, clients,
                            **partition_settings(settings))
    if model is None:
        num_classes = load_dataset(settings["dataset"], root).num_classes
        model = build_model(
            settings["model"], tuple(data.x_train.shape[1:]), num_classes  # type: ignore[arg-type]
        )
    return TorchLearner(
        model,
        TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
        TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)),
        device=resolve_device(settings["device"]),
    )


def build_learners(settings: dict[str, Any], clients: int) -> list[TorchLearner]:
    """Every client's learner, with the ClientApp's partition and one shared model."""
    learners: list[TorchLearner] = []
    for client in range(clients):
        learners.append(client_learner(settings, client, clients,
                                       learners[0].model if learners else None))
    return learners


def choose(learner: TorchLearner, models: list[ArrayRecord], known: dict[bytes, float]) -> int:
    """The model with the lowest mean training loss (IFCA's choice; 0 for one model).

    ``known`` is the client's losses of the models it scored last, as the ClientApp
    keeps them in the node's context: each model is scored once.
    """
    if len(models) == 1:
        return 0
    return int(np.argmin(learner.mean_losses(models, "train", known)))


def average(models: list[ArrayRecord], weights: list[float]) -> ArrayRecord:
    """Example-weighted mean of models."""
    names = list(models[0].keys())
    layers = [[m[name].numpy() for name in names] for m in models]
    return p.numpy_to_record(names, weighted_average(layers, weights))


def fedavg_average(models: list[ArrayRecord], weights: list[float]) -> ArrayRecord:
    """Flower's FedAvg mean (its own function: float32 sums in the replies' order)."""
    records = [
        RecordDict({"arrays": m, "metrics": MetricRecord({"num-examples": w})})
        for m, w in zip(models, weights, strict=True)
    ]
    return aggregate_arrayrecords(records, "num-examples")


def plain_round(
    learners: list[TorchLearner], models: list[ArrayRecord], settings: dict[str, Any],
    server_round: int, num_clusters: int, known: list[dict[bytes, float]],
) -> list[ArrayRecord]:
    """One round of training without Flower; the new models.

    Every client trains the model of lowest training loss among ``models`` with the
    seed the ClientApp uses; each model becomes the example-weighted mean of its
    clients' models (one without clients keeps its own). IFCA's first round is its
    local-kmeans warm start: every client trains the single initial model for
    ``ifca-init-steps`` steps and k-means over the output-layer updates forms the
    ``num_clusters`` groups. IFCA's re-seeding of idle clusters is not repeated.
    """
    warm_start = num_clusters > 1 and len(models) == 1
    steps = settings["ifca-init-steps"] if warm_start else settings["local-steps"]
    chosen, trained = [], []
    for client, learner in enumerate(learners):
        cluster = choose(learner, models, known[client])
        arrays, _ = learner.train(
            models[cluster],
            lr=settings["lr"],
            batch_size=settings["batch-size"],
            epochs=settings["local-epochs"],
            steps=steps,
            seed=server_round * 100_003 + client % 100_003,
        )
        chosen.append(cluster)
        trained.append(arrays)
    if warm_start:
        start = models[0]
        last = [name for name in start if start[name].numpy().ndim == 2][-1]
        updates = np.stack([m[last].numpy() - start[last].numpy() for m in trained])
        chosen = group_by_kmeans(
            output_layer_profiles(updates.astype(np.float64)), num_clusters, settings["seed"]
        ).tolist()
        models = models * num_clusters
    weights = [float(learner.num_examples("train")) for learner in learners]
    # FedAvg averages as Flower's FedAvg does, IFCA as fl-clusters' strategies do.
    mean = fedavg_average if num_clusters == 1 else average
    new_models = []
    for j, model in enumerate(models):
        members = [i for i, cluster in enumerate(chosen) if cluster == j]
        new_models.append(
            mean([trained[i] for i in members], [weights[i] for i in members])
            if members
            else model
        )
    return new_models


def plain_evaluate(
    learners: list[TorchLearner], models: list[ArrayRecord], known: list[dict[bytes, float]]
) -> float:
    """Test accuracy over all clients, each with its model of lowest training loss."""
    correct, total = 0.0, 0
    for learner, kept in zip(learners, known, strict=True):
        _, accuracy = learner.evaluate(models[choose(learner, models, kept)], "test")
        correct += accuracy * learner.num_examples("test")
        total += learner.num_examples("test")
    return correct / total


def _plain_child(config: dict[str, Any], clients: int, t0: float, conn: Any) -> None:
    settings = parse_run_config(config)
    torch.set_num_threads(settings["torch-threads"])
    num_clusters = settings["num-clusters"] if settings["strategy"] == "ifca" else 1
    start = time.monotonic()
    learners = build_learners(settings, clients)
    loaded = time.monotonic()
    models, round_s, accuracy = [initial_arrays(settings)], [], 0.0
    known: list[dict[bytes, float]] = [{} for _ in learners]
    for server_round in range(1, settings["num-rounds"] + 1):
        round_start = time.monotonic()
        models = plain_round(learners, models, settings, server_round, num_clusters, known)
        accuracy = plain_evaluate(learners, models, known)
        round_s.append(time.monotonic() - round_start)
    conn.send(
        {
            "start": start,
            "data_load_s": loaded - start,
            "round_s": round_s,
            "accuracy": accuracy,
            "torch_threads": torch.get_num_threads(),
            "maxrss_mb": _maxrss_mb(resource.getrusage(resource.RUSAGE_SELF)),
        }
    )


def plain_loop(config: dict[str, Any], clients: int) -> dict[str, Any]:
    """The job's work in one plain PyTorch loop, in a fresh process."""
    result, t0, tree_mb = in_fresh_process(_plain_child, config, clients)
    return {
        "data_load_s": result["data_load_s"],
        # Process start, imports and data loading, then round 1: the federation's
        # start-up to the end of its round 1 covers the same.
        "startup_to_round1_end_s": result["start"] - t0 + result["data_load_s"]
        + result["round_s"][0],
        **round_stats(result["round_s"]),
        "accuracy": result["accuracy"],
        "torch_threads": result["torch_threads"],
        "memory": {
            "rusage_maxrss_mb": result["maxrss_mb"],
            "rusage": "maxrss of the plain loop's process (RUSAGE_SELF)",
            "tree_peak_rss_mb": tree_mb,
        },
    }


def measure(
    dataset: str, strategy: str, clients: int, rounds: int, via: str,
    max_in_flight: int = 0, plain: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None, num_gpus: float = 0.0,
) -> dict[str, Any]:
    """One job: the federation, then the plain loop, and their ratio of round times.

    ``plain`` reuses a plain-loop result of the same job (another message window
    does not change the plain loop's work).
    """
    results_dir = tempfile.mkdtemp(prefix="overhead-")
    config = run_config(dataset, strategy, clients, rounds, results_dir, max_in_flight,
                        overrides)
    try:
        if via == "flwr-run":
            federation = federation_flwr_run(config, clients)
        else:
            federation = federation_simulation(config, clients, num_gpus)
    finally:
        shutil.rmtree(results_dir)
    plain = plain or plain_loop(config, clients)
    return {
        "dataset": dataset,
        "strategy": strategy,
        "clients": clients,
        "rounds": rounds,
        "via": via,
        "max_in_flight": max_in_flight,
        "num_gpus_per_client": num_gpus,
        "run_config_overrides": overrides or {},
        "federation": federation,
        "plain_loop": plain,
        "round_ratio": federation["round_mean_s"] / plain["round_mean_s"],
        "startup_to_round1_end_ratio": federation["startup_to_round1_end_s"]
        / plain["startup_to_round1_end_s"],
    }


def machine_info() -> dict[str, Any]:
    """Where the numbers were taken."""
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": version("flwr"),
        "cuda": torch.cuda.is_available(),
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per job: round times, their ratio, start-up, bytes, memory and scores."""
    lines = [
        "| data set | strategy | clients | via | max in flight | fed s/round | plain s/round "
        "| ratio | fed s/round, Flower clock, all rounds | fed start..R1 end s "
        "| plain start..R1 end s | MB sent / recv | fed tree RSS MB | plain RSS MB "
        "| ARI | fed acc | plain acc |",
        "|" + "---|" * 17,
    ]
    for row in rows:
        fed, plain, summary = row["federation"], row["plain_loop"], row["federation"]["summary"]
        lines.append(
            f"| {row['dataset']} | {row['strategy']} | {row['clients']} | {row['via']} "
            f"| {row.get('max_in_flight') or 'default'} "
            f"| {fed['round_mean_s']:.2f} | {plain['round_mean_s']:.3f} "
            f"| {row['round_ratio']:.1f} | {fed['strategy_round_mean_s']:.2f} "
            f"| {fed['startup_to_round1_end_s']:.1f} "
            f"| {plain['startup_to_round1_end_s']:.1f} "
            f"| {summary['bytes_sent'] / 1e6:.2f} / {summary['bytes_received'] / 1e6:.2f} "
            f"| {fed['memory']['tree_peak_rss_mb']:.0f} "
            f"| {plain['memory']['rusage_maxrss_mb']:.0f} | {summary['ari']:.3f} "
            f"| {summary['personalized_accuracy']:.4f} | {plain['accuracy']:.4f} |"
        )
    return "\n".join(lines)


def write_results(
    out: Path, provenance: dict[str, Any], info: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    """Write the run's provenance, the machine facts and the jobs measured so far to ``out``
    (atomically: a run killed while writing leaves the file as it was)."""
    with atomic_output(out) as stream:
        stream.write((json.dumps({"provenance": provenance, "machine": info, "jobs": rows},
                                 indent=2) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--datasets", nargs="+", default=["digits", "fashion-mnist"])
    parser.add_argument("--strategies", nargs="+", choices=("fedavg", "ifca"),
                        default=["fedavg", "ifca"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--via", choices=("flwr-run", "simulation"), default="flwr-run")
    parser.add_argument("--max-in-flight", type=int, nargs="+", default=[0],
                        help="run-config max-in-flight values to try (0 = the app's default)")
    parser.add_argument("--data-root", default="",
                        help="folder of the data set's files ('' = the loader's default)")
    parser.add_argument("--model", default="mlp", help="the run-config key model (mlp, cnn)")
    parser.add_argument("--num-gpus", type=float, default=0.0,
                        help="GPUs per client with --via simulation (0.1: ten clients a GPU)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.num_gpus and args.via != "simulation":
        parser.error("--num-gpus needs --via simulation (flwr run takes the federation's "
                     "client-resources-num-gpus)")
    overrides = {"model": args.model, "data-root": args.data_root}
    source = measurement_provenance()
    info = {**machine_info(), "load_average_before": os.getloadavg()}
    rows: list[dict[str, Any]] = []
    for dataset in args.datasets:
        for strategy in args.strategies:
            for clients in args.clients:
                plain = None
                for window in args.max_in_flight:
                    rows.append(measure(dataset, strategy, clients, args.rounds, args.via,
                                        window, plain, overrides, args.num_gpus))
                    plain = rows[-1]["plain_loop"]
                    # Written after every job: a run cut short keeps what it measured.
                    info["load_average_after"] = os.getloadavg()
                    write_results(args.out, source, info, rows)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
