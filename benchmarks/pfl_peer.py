"""Apple's pfl-research (PyPI ``pfl``) on benchmarks/scale.py's job, as its peer (issue 54).

The job: Fashion-MNIST (train and test parts, 70,000 images) in four rotation groups
with a copy of the data set per group (user ``u`` is in group ``u % 4``, its images
turned by ``90 * (u % 4)`` degrees), 50 images a user (40 to train, 10 held out:
fl-clusters' default test fraction 0.2), the MLP 784-200-200-10, one local epoch of
SGD (lr 0.05, batch 10), ``--sampled`` users a round, FedAvg, ``--users`` users in all.
A user's data are built from its id when it is drawn (slice ``u // 4`` of its group's
seeded shuffle, wrapping around), so nothing is kept for users that are not drawn.

Every job runs in a fresh process timed from its spawn (imports included): pfl with
its ``FederatedDataset`` (a make-dataset-from-user-id function, its random user
sampler), ``PyTorchModel``, ``SimulatedBackend`` and ``FederatedAveraging``; with
``--processes 2`` pfl's multi-process mode (``torchrun``, which pfl's
``PyTorchDistributedContext`` reads: each worker trains its share of the cohort and
the updates are all-reduced). Then the same work in a plain PyTorch loop. The script
imports neither fl_clusters nor flwr: it runs in a virtual environment of its own,

    python3 -m venv .venv-pfl && echo '*' > .venv-pfl/.gitignore
    .venv-pfl/bin/pip install torch==2.14.1 pfl==0.6.0
    .venv-pfl/bin/python benchmarks/pfl_peer.py --users 1000 10000 100000 1000000
        [--sampled 100] [--rounds 10] [--processes 1 2] [--evaluate each-round none]
        [--out benchmarks/measured/scale-pfl.json]

Rows already in ``--out`` are kept (a job measured again replaces its row); the file
is written after every job and a markdown table is printed at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "measured" / "scale-pfl.json"
DATA_ROOT = Path("/usr/share/datasets/fashion-mnist")
GROUPS = 4
TRAIN_PER_USER, TEST_PER_USER = 40, 10
LR, BATCH, EPOCHS = 0.05, 10, 1
FRAMEWORKS = ("pfl", "plain")
WHAT = {
    "pfl": "pfl {pfl}, torch {torch}: FederatedDataset (users built from their id when "
           "drawn, pfl's random sampler), PyTorchModel, SimulatedBackend, FederatedAveraging "
           "(central SGD lr 1.0 on the mean model difference); {procs}.",
    "plain": "the same work in one plain PyTorch loop, one process: {sampled} users drawn a "
             "round (with replacement, as pfl's sampler), built from their id, 1 epoch of "
             "SGD each from the global model, the mean difference added to it.",
}
EVALUATE = {
    "each-round": "Each round {sampled} more users drawn score the model on their 10 held-out "
                  "images (pfl: its val population; pfl also scores every trained user on its "
                  "training data before and after training); accuracy: the last round's.",
    "none": "No evaluation (pfl's round 1 still scores its trained users on their training "
            "data: pfl always evaluates in iteration 0).",
}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST's format), ``.gz`` or not, as a uint8 array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        data = stream.read()
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class Users:
    """Every user's data, built from the user's id when asked (nothing kept per user).

    Parameters
    ----------
    root : Path
        Folder of Fashion-MNIST's four IDX files.
    seed : int
        Seed of the held-out choice and of the groups' shuffles.
    """

    def __init__(self, root: Path, seed: int) -> None:
        x_train, y_train, x_test, y_test = (
            read_idx(next(f for f in (root / f"{stem}.gz", root / stem) if f.exists()))
            for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
        self.images = np.concatenate([x_train, x_test])
        self.labels = np.concatenate([y_train, y_test]).astype(np.int64)
        rng = np.random.default_rng(seed)
        # A held-out image is held out in every group's copy.
        held_out = rng.permutation(len(self.labels))
        test = held_out[: len(held_out) * TEST_PER_USER // (TRAIN_PER_USER + TEST_PER_USER)]
        train = np.setdiff1d(held_out, test)
        self.order = {"train": [rng.permutation(train) for _ in range(GROUPS)],
                      "test": [rng.permutation(test) for _ in range(GROUPS)]}

    def arrays(self, user: int, part: str) -> tuple[np.ndarray, np.ndarray]:
        """User ``user``'s ``part`` ("train" or "test"): float32 (n, 784) images, int64 labels."""
        group, slot = user % GROUPS, user // GROUPS
        n = TRAIN_PER_USER if part == "train" else TEST_PER_USER
        order = self.order[part][group]
        index = order[(slot * n + np.arange(n)) % len(order)]
        x = np.rot90(self.images[index], k=group, axes=(1, 2))
        return (x.reshape(n, -1).astype(np.float32) / 255.0, self.labels[index])


class MLP(torch.nn.Module):
    """784-200-200-10 with ReLU; ``loss`` and ``metrics`` as pfl's PyTorchModel asks."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(784, 200), torch.nn.ReLU(), torch.nn.Linear(200, 200),
            torch.nn.ReLU(), torch.nn.Linear(200, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of flat images."""
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of a batch (pfl hands labels over as float32)."""
        self.train()
        return torch.nn.functional.cross_entropy(self(x), y.long())

    @torch.no_grad()
    def scores(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """Summed cross-entropy and number of correct answers of a batch."""
        self.eval()
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits, y.long(), reduction="sum")
        return float(loss), float((logits.argmax(1) == y.long()).sum())

    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        """pfl's metrics of a batch: mean loss and accuracy, weighted by its size."""
        from pfl.metrics import Weighted

        loss, correct = self.scores(x, y)
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}


def _timing_callback() -> Any:
    """A pfl callback that marks the end of every round and keeps the last metrics."""
    from pfl.callback.base import TrainingProcessCallback
    from pfl.metrics import Metrics

    class RoundMarks(TrainingProcessCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.metrics: dict[str, float] = {}

        def after_central_iteration(self, aggregate_metrics: Any, model: Any, *,
                                    central_iteration: int) -> tuple[bool, Any]:
            self.ends.append(time.monotonic())
            self.metrics = aggregate_metrics.to_simple_dict()
            return False, Metrics()

    return RoundMarks()


def pfl_job(args: argparse.Namespace) -> dict[str, Any]:
    """One pfl run of the job in this process (a torchrun worker with 2 processes)."""
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module
    from pfl.model.pytorch import PyTorchModel

    users = Users(args.data_root, args.seed)

    def population(part: str) -> FederatedDataset:
        def make(user: int) -> Dataset:
            return Dataset(users.arrays(user, part), user_id=str(user))
        return FederatedDataset(make, get_user_sampler("random", range(args.users)))

    mlp = MLP()
    model = PyTorchModel(mlp, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(mlp.parameters(), lr=1.0))
    evaluate = args.evaluate == "each-round"
    params = NNAlgorithmParams(
        central_num_iterations=args.rounds, evaluation_frequency=1 if evaluate else 10**9,
        train_cohort_size=args.sampled, val_cohort_size=args.sampled if evaluate else None)
    marks = _timing_callback()
    start = time.monotonic()
    FederatedAveraging().run(
        algorithm_params=params,
        backend=SimulatedBackend(training_data=population("train"), val_data=population("test")),
        model=model,
        model_train_params=NNTrainHyperParams(local_num_epochs=EPOCHS, local_learning_rate=LR,
                                              local_batch_size=BATCH),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[marks], send_metrics_to_platform=False)
    accuracy = [v for k, v in marks.metrics.items()
                if k.startswith("Val population") and "accuracy" in k]
    return {"round_ends": marks.ends, "run_start": start,
            "accuracy": accuracy[0] if accuracy else None,
            "rank": get_default_framework_module().distributed.global_rank}


def _train_user(model: MLP, xs: np.ndarray, ys: np.ndarray) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = torch.from_numpy(xs), torch.from_numpy(ys)
    for _ in range(EPOCHS):
        for first in range(0, len(y), BATCH):
            optimizer.zero_grad()
            model.loss(x[first:first + BATCH], y[first:first + BATCH]).backward()
            optimizer.step()


def plain_job(args: argparse.Namespace) -> dict[str, Any]:
    """The same work in one plain PyTorch loop in this process."""
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    users = Users(args.data_root, args.seed)
    model = MLP()
    flat, unflat = torch.nn.utils.parameters_to_vector, torch.nn.utils.vector_to_parameters
    current = flat(model.parameters()).detach().clone()
    ends, accuracy, start = [], None, time.monotonic()
    for _ in range(args.rounds):
        total = torch.zeros_like(current)
        drawn = rng.integers(0, args.users, size=args.sampled)
        for user in drawn:
            unflat(current.clone(), model.parameters())
            _train_user(model, *users.arrays(int(user), "train"))
            total += flat(model.parameters()).detach() - current
        current = current + total / len(drawn)
        if args.evaluate == "each-round":
            unflat(current.clone(), model.parameters())
            correct = sum(model.scores(*map(torch.from_numpy, users.arrays(int(u), "test")))[1]
                          for u in rng.integers(0, args.users, size=args.sampled))
            accuracy = correct / (args.sampled * TEST_PER_USER)
        ends.append(time.monotonic())
    return {"round_ends": ends, "run_start": start, "accuracy": accuracy, "rank": 0}


def child(args: argparse.Namespace) -> None:
    """Run one job in this (fresh) process and write what it measured to ``--result``."""
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    result = (pfl_job if args.child == "pfl" else plain_job)(args)
    result.update(torch_threads=torch.get_num_threads(),
                  maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    Path(f"{args.result}.rank{result['rank']}").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        # torchrun workers abort in teardown at times ("terminate called without an active
        # exception", 2 runs in 5 here, with destroy_process_group too): skip it.
        os._exit(0)


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:  # pfl, outside its virtual environment
        return None


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout


def provenance() -> dict[str, Any]:
    """The file's provenance record, as fl_clusters.sweep.provenance writes it (this script
    runs without fl_clusters): command, commit, changed code, date, machine, versions."""
    changed = sorted(line[3:].split(" -> ")[-1] for line in _git(
        "status", "--porcelain", "--untracked-files=no").splitlines()
        if line[3:].endswith((".py", ".toml", ".sh", ".cfg", ".txt"))
        and not line[3:].startswith("benchmarks/measured/"))
    return {
        "command": [sys.executable, *sys.argv], "cwd": os.getcwd(),
        "commit": _git("rev-parse", "HEAD").strip(), "dirty": bool(changed),
        "changed_code": changed, "cores": os.cpu_count(),
        "date": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "platform": platform.platform(), "python": platform.python_version(),
        "executable": sys.executable,
        "versions": {p: _version(p) for p in ("pfl", "torch", "numpy")},
    }


def job_command(framework: str, users: int, processes: int, args: argparse.Namespace,
                result: Path) -> list[str]:
    """The command line of one job: the script as a child, under torchrun for 2+ processes."""
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone",
                     f"--nproc-per-node={processes}"]
    return [*launcher, str(Path(__file__).resolve()), "--child", framework,
            "--users", str(users), "--sampled", str(args.sampled), "--rounds", str(args.rounds),
            "--evaluate", args.evaluate_mode, "--data-root", str(args.data_root),
            "--seed", str(args.seed), "--torch-threads", str(args.torch_threads),
            "--result", str(result)]


def run_job(framework: str, users: int, processes: int, args: argparse.Namespace,
            scratch: Path) -> dict[str, Any]:
    """Spawn one job, time it from the spawn and measure its memory; its row."""
    result = scratch / f"{framework}-{users}-{processes}-{args.evaluate_mode}"
    command = job_command(framework, users, processes, args, result)
    log = scratch / f"{result.name}.log"
    if str(ROOT) not in sys.path:  # benchmarks/processes.py needs only the standard library
        sys.path.insert(0, str(ROOT))
    from benchmarks.processes import TreeMemory

    load_before = os.getloadavg()
    with log.open("wb") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        with TreeMemory(proc.pid) as memory:
            _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}")
    ranks = [json.loads(Path(f"{result}.rank{r}").read_text()) for r in range(processes)]
    ends = ranks[0]["round_ends"]
    round_s = np.diff([ranks[0]["run_start"], *ends]).tolist()
    return {
        "framework": framework, "users": users, "sampled": args.sampled, "rounds": args.rounds,
        "processes": processes, "evaluate": args.evaluate_mode,
        "torch_threads_asked": args.torch_threads,
        "startup_to_round1_end_s": ends[0] - t0,
        "round_mean_s": float(np.mean(round_s[1:] or round_s)),
        "round_median_s": float(np.median(round_s[1:] or round_s)),
        "round_s": round_s, "accuracy": ranks[0]["accuracy"],
        "torch_threads": [r["torch_threads"] for r in ranks],
        "memory": {
            "rusage_maxrss_mb": usage.ru_maxrss / 1024,
            "rusage": "maxrss (wait4) of the job's process and its waited children: the "
                      "largest single process, torchrun's workers included",
            "worker_maxrss_mb": [r["maxrss_mb"] for r in ranks],
            "tree_peak_rss_mb": memory.peak_mb,
            "tree": "summed RSS of the job's process tree (benchmarks/processes.py)",
        },
        "pfl_version": _version("pfl"), "torch_version": torch.__version__,
        "command": command,
        "machine": {"cpu_count": os.cpu_count(), "load_average_before": load_before,
                    "load_average_after": os.getloadavg()},
        "what_was_measured": describe(framework, processes, args),
    }


def describe(framework: str, processes: int, args: argparse.Namespace) -> str:
    """The job's "what was measured" text."""
    procs = ("one process" if processes == 1 else
             f"{processes} processes under torchrun (pfl's multi-process mode)")
    text = (WHAT[framework] + " " + EVALUATE[args.evaluate_mode]).format(
        pfl=_version("pfl"), torch=torch.__version__, procs=procs, sampled=args.sampled)
    return (text + " Start-up to round 1's end: from the job process's spawn (imports, "
            "data files read, model built) to the end of round 1; round_mean_s: mean of "
            "rounds 2..N; each round ends when the new global model is in place.")


def job_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two rows the same job."""
    return tuple(row.get(k, 0) for k in ("framework", "users", "sampled", "rounds", "processes",
                                         "evaluate", "torch_threads_asked"))


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per job."""
    lines = ["| framework | users | processes | evaluate | torch threads | start..R1 end s "
             "| s/round | accuracy | tree peak RSS MB |", "|" + "---|" * 9]
    for r in rows:
        accuracy = "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
        threads = ",".join(map(str, r["torch_threads"]))
        lines.append(f"| {r['framework']} | {r['users']} | {r['processes']} | {r['evaluate']} "
                     f"| {threads} | {r['startup_to_round1_end_s']:.2f} "
                     f"| {r['round_mean_s']:.3f} | {accuracy} "
                     f"| {r['memory']['tree_peak_rss_mb']:.0f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--child`` runs one job in this process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--sampled", type=int, default=100, help="users trained a round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2],
                        help="pfl's processes (the plain loop always runs in one)")
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--evaluate", nargs="+", choices=tuple(EVALUATE),
                        default=["each-round"])
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads in every job process; 0 = torch's default "
                             "(torchrun sets OMP_NUM_THREADS=1 for 2+ processes)")
    parser.add_argument("--data-root", type=Path, default=DATA_ROOT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.users, args.evaluate = args.users[0], args.evaluate[0]
    elif any(args.sampled > users for users in args.users):
        parser.error(f"--sampled {args.sampled} exceeds the smallest --users")
    return args


def jobs(args: argparse.Namespace) -> list[tuple[str, int, int, str]]:
    """(framework, users, processes, evaluate) of every job, in the order they run."""
    return [(framework, users, processes, evaluate)
            for evaluate in args.evaluate for users in args.users
            for framework in args.frameworks
            for processes in (args.processes if framework == "pfl" else [1])]


def main(argv: list[str] | None = None) -> None:
    """Run every job, each in a fresh process, writing ``--out`` after each."""
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    source = provenance()
    earlier = json.loads(args.out.read_text())["jobs"] if args.out.exists() else []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pfl-peer-") as scratch:
        for framework, users, processes, evaluate in jobs(args):
            args.evaluate_mode = evaluate
            rows.append(run_job(framework, users, processes, args, Path(scratch)))
            rows[-1]["run_by"] = {k: source[k] for k in ("command", "commit", "date")}
            keys = {job_key(row) for row in rows}
            kept = [row for row in earlier if job_key(row) not in keys]
            document = {"provenance": source, "what_was_measured": __doc__, "jobs": kept + rows}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
