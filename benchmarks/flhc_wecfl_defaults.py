"""How FL+HC's cut and WeCFL's first k-means were chosen: client updates after FedAvg rounds.

For every case (data set, model, group structure; 20 clients, the run config's
default local training: 10 SGD steps of 32 samples, lr 0.1) the clients run FedAvg
in process (the fl-clusters learner, no Flower), and after w = 0..ROUNDS rounds
every client trains once more from the global model. On those updates:

- FL+HC (Euclidean, ward): the largest jump between consecutive merge heights
  and what the default gap cut gives; the range of relative cuts
  (``distance_ratio`` x the median distance to the nearest other update) that
  recover the groups exactly (ARI 1), or, without groups, keep every client in one
  cluster; and what the absolute cut 0.9 gives.
- WeCFL: the ARI of the first weighted k-means (w = 0, all clients trained the
  initial model) with ten k-means++ starts (worst over 5 seeds) and with one
  (mean over 10 seeds).

Results go to ``benchmarks/measured/flhc_wecfl_defaults.json``.

``--copies``: the default cut on the same updates after w = 3 rounds with a copy
of client 0's update added (exact, and with noise of 1e-6 x its norm) and with a
close but distinct pair (client 0 plus noise of 2 % of the median
nearest-neighbour distance), against the previous gap rule (the largest jump over
every merge height, copies included), into ``benchmarks/measured/flhc_copies.json``.
``--wecfl-runs SEED ...``: WeCFL Flower simulations (digits, 4 groups, 20
clients, 6 rounds, defaults; ``--model``, ``--structure``: MLP, label
permutations) and the clients each round's fresh k-means moved, appended to
``benchmarks/measured/wecfl_reassigned.json``.

    PYTHONPATH=. python benchmarks/flhc_wecfl_defaults.py
    PYTHONPATH=. python benchmarks/flhc_wecfl_defaults.py --copies
    PYTHONPATH=. python benchmarks/flhc_wecfl_defaults.py --wecfl-runs 0 1
    PYTHONPATH=. python benchmarks/flhc_wecfl_defaults.py --wecfl-runs 0 --model cnn \
        --structure rotation
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import adjusted_rand_score
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.clustering import UpdateHierarchy, initial_kmeans, weighted_average
from fl_clusters.data import DATASET_SHAPES, load_dataset, partition_dataset
from fl_clusters.learner import TorchLearner
from fl_clusters.models import build_model, model_to_arrays
from fl_clusters.sweep.provenance import measurement_provenance

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "measured" / "flhc_wecfl_defaults.json"
COPIES_OUT = ROOT / "benchmarks" / "measured" / "flhc_copies.json"
WECFL_OUT = ROOT / "benchmarks" / "measured" / "wecfl_reassigned.json"
COPY_CASES = [
    ("digits", "mlp", "rotation"),
    ("digits", "mlp", "label-permutation"),
    ("digits", "mlp", "none"),
    ("fashion-mnist", "mlp", "rotation"),
    ("fashion-mnist", "mlp", "none"),
]
COPY_WARMUP = 3
CLIENTS = 20
ROUNDS = 5
RATIOS = np.round(np.arange(1.0, 4.01, 0.05), 2)
CASES = [
    ("digits", "mlp", "rotation"),
    ("digits", "mlp", "label-permutation"),
    ("digits", "mlp", "none"),
    ("digits", "cnn", "rotation"),
    ("digits", "cnn", "none"),
    ("fashion-mnist", "mlp", "rotation"),
    ("fashion-mnist", "mlp", "label-permutation"),
    ("fashion-mnist", "mlp", "none"),
    ("fashion-mnist", "cnn", "rotation"),
]


def client_updates(
    data: str, model: str, structure: str, seed: int = 0, rounds: int = ROUNDS
) -> dict[str, Any]:
    """Updates of every client after w = 0..rounds FedAvg rounds, with truth and sizes."""
    torch.set_num_threads(1)
    clients = partition_dataset(
        load_dataset(data), CLIENTS, structure=structure,
        num_groups=1 if structure == "none" else 4, seed=seed,
    )
    shape, classes = DATASET_SHAPES[data]
    learners = [
        TorchLearner(
            build_model(model, shape, classes),
            TensorDataset(torch.tensor(c.x_train), torch.tensor(c.y_train)),
            TensorDataset(torch.tensor(c.x_test), torch.tensor(c.y_test)),
        )
        for c in clients
    ]
    sizes = np.array([len(c.y_train) for c in clients], dtype=float)
    arrays = model_to_arrays(build_model(model, shape, classes, seed=seed))
    names = list(arrays.keys())
    updates = []
    for w in range(rounds + 1):
        trained = [
            learner.train(arrays, lr=0.1, batch_size=32, steps=10, seed=w * 100_003 + i)[0]
            for i, learner in enumerate(learners)
        ]
        start = np.concatenate([arrays[n].numpy().ravel() for n in names])
        models = [[t[n].numpy() for n in names] for t in trained]
        updates.append(np.stack([np.concatenate([a.ravel() for a in m]) for m in models]) - start)
        arrays = p.numpy_to_record(names, weighted_average(models, sizes))
    return {"truth": np.array([c.true_cluster for c in clients]), "sizes": sizes,
            "updates": updates}


def _recovered(truth: np.ndarray, labels: np.ndarray) -> bool:
    if len(set(truth.tolist())) == 1:
        return len(set(labels.tolist())) == 1
    return adjusted_rand_score(truth, labels) == 1.0


def flhc_figures(truth: np.ndarray, updates: np.ndarray) -> dict[str, Any]:
    """The default gap cut, the relative cuts that recover the groups, the absolute cut."""
    good = [
        float(r) for r in RATIOS
        if _recovered(truth, UpdateHierarchy(threshold="relative", distance_ratio=float(r))
                      .fit_predict(updates))
    ]
    default = UpdateHierarchy().fit(updates)
    absolute = UpdateHierarchy(threshold="absolute").fit(updates)
    return {
        "max_gap": default.max_gap_,
        "default_clusters": default.num_clusters_,
        "default_ari": float(adjusted_rand_score(truth, default.labels_)),
        "good_ratios": [min(good), max(good)] if good else None,
        "absolute_clusters": absolute.num_clusters_,
        "absolute_ari": float(adjusted_rand_score(truth, absolute.labels_)),
        "median_nearest_distance": default.nearest_distance_,
    }


def wecfl_figures(truth: np.ndarray, sizes: np.ndarray, updates: np.ndarray) -> dict[str, Any]:
    """ARI of the first k-means with ten k-means++ starts and with one."""
    k = len(set(truth.tolist()))
    ten = [adjusted_rand_score(truth, initial_kmeans(updates, sizes, k, 10, s)) for s in range(5)]
    one = [adjusted_rand_score(truth, initial_kmeans(updates, sizes, k, 1, s)) for s in range(10)]
    return {"ari_n_init_10_min": float(min(ten)), "ari_n_init_1_mean": float(np.mean(one)),
            "ari_n_init_1_min": float(min(one))}


def previous_gap_clusters(updates: np.ndarray, min_gap: float = 1.6) -> int:
    """Clusters of the gap cut before copies were collapsed: the largest jump over every
    ward merge height, a jump from height 0 counting as infinite."""
    tree = AgglomerativeClustering(n_clusters=1, compute_distances=True).fit(updates)
    heights = np.sort(tree.distances_)
    low, high = heights[:-1], heights[1:]
    jumps = np.divide(high, low, out=np.full_like(high, np.inf), where=low > 0)
    i = int(np.argmax(jumps))
    if jumps[i] < min_gap:
        return 1
    cut = np.sqrt(low[i] * high[i]) if low[i] > 0 else high[i] / 2
    return int(AgglomerativeClustering(n_clusters=None, distance_threshold=cut)
               .fit(updates).n_clusters_)


def copy_figures(truth: np.ndarray, updates: np.ndarray) -> dict[str, Any]:
    """The default cut and the previous rule with a copy of client 0's update added."""
    rng = np.random.default_rng(0)
    source = updates[0]
    noise = rng.normal(size=source.size) / np.sqrt(source.size)
    nearest = UpdateHierarchy().fit(updates).nearest_distance_
    added = {
        "none": None,
        "exact_copy": source,
        "near_copy_1e-6": source + 1e-6 * np.linalg.norm(source) * noise,
        "close_pair_0.02": source + 0.02 * nearest * noise,
    }
    row: dict[str, Any] = {}
    for name, extra in added.items():
        points = updates if extra is None else np.vstack([updates, extra])
        default = UpdateHierarchy().fit(points)
        row[name] = {
            "clusters": default.num_clusters_,
            "ari_of_the_20": float(adjusted_rand_score(truth, default.labels_[: len(truth)])),
            "max_gap": default.max_gap_,
            "distinct": default.num_distinct_,
            "previous_rule_clusters": previous_gap_clusters(points),
        }
    return row


def provenance(argv: list[str]) -> dict[str, Any]:
    """The run's record: command, commit (and whether tracked files differed), date, machine."""
    return measurement_provenance([sys.executable, sys.argv[0], *argv])


def measure_copies(argv: list[str]) -> None:
    """The copies study (``--copies``)."""
    results: dict[str, Any] = {"provenance": provenance(argv), "warmup_rounds": COPY_WARMUP}
    for data, model, structure in COPY_CASES:
        case = client_updates(data, model, structure, rounds=COPY_WARMUP)
        row = copy_figures(case["truth"], case["updates"][COPY_WARMUP].astype(np.float64))
        results[f"{data}|{model}|{structure}"] = row
        print(f"{data}|{model}|{structure}: {json.dumps(row)}", flush=True)
    COPIES_OUT.write_text(json.dumps(results, indent=1))


def wecfl_runs(seeds: list[int], argv: list[str], model: str, structure: str) -> None:
    """WeCFL Flower simulations (``--wecfl-runs``): ARI and clients moved per round."""
    from flwr.simulation import run_simulation

    from fl_clusters.client_app import build_client_app
    from fl_clusters.server_app import build_server_app

    results = json.loads(WECFL_OUT.read_text()) if WECFL_OUT.exists() else {"runs": []}
    results["provenance"] = provenance(argv)
    # Runs gather over invocations: each names the one that measured it.
    stamp = {key: results["provenance"][key]
             for key in ("command", "commit", "dirty", "date", "cores")}
    for seed in seeds:
        with tempfile.TemporaryDirectory() as folder:
            settings = {"strategy": "wecfl", "cluster-structure": structure, "model": model,
                        "num-clusters": 4, "num-rounds": 6, "seed": seed,
                        "results-dir": folder, "min-nodes": CLIENTS}
            run_simulation(
                server_app=build_server_app(settings),
                client_app=build_client_app(settings),
                num_supernodes=CLIENTS,
                backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
            )
            summary = json.loads(next(Path(folder).glob("*/summary.json")).read_text())
        row = {"model": model, "structure": structure, "seed": seed, **{k: summary.get(k) for k in (
            "ari", "num_clusters_found", "reassigned_per_round", "personalized_accuracy")},
            **stamp}
        print(json.dumps(row), flush=True)
        results["runs"].append(row)
        WECFL_OUT.write_text(json.dumps(results, indent=1))


def main(argv: list[str]) -> None:
    """Measure every case and write the results file (or run one of the studies)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", action="store_true")
    parser.add_argument("--wecfl-runs", nargs="*", type=int)
    parser.add_argument("--model", default="mlp", help="--wecfl-runs: the model")
    parser.add_argument("--structure", default="label-permutation",
                        help="--wecfl-runs: the cluster structure")
    args = parser.parse_args(argv)
    if args.copies:
        measure_copies(argv)
        return
    if args.wecfl_runs:
        wecfl_runs(args.wecfl_runs, argv, args.model, args.structure)
        return
    results: dict[str, Any] = {"provenance": provenance(argv)}
    for data, model, structure in CASES:
        case = client_updates(data, model, structure)
        truth, sizes = case["truth"], case["sizes"]
        row: dict[str, Any] = {
            f"flhc_after_{w}_rounds": flhc_figures(truth, u.astype(np.float64))
            for w, u in enumerate(case["updates"])
        }
        if structure != "none":
            row["wecfl_round_1"] = wecfl_figures(truth, sizes, case["updates"][0])
        results[f"{data}|{model}|{structure}"] = row
        print(f"{data}|{model}|{structure}: {json.dumps(row)}", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
