"""Clustering-matrix cells with run-config overrides, each in a results file of its own.

The matrix itself (every strategy with its defaults x structure x data set x model x
seed, FedAvg and local-only beside them) is the sweep files
``benchmarks/sweeps/clustering-matrix-*.toml``, rendered in docs/clustering-matrix.md.
This script runs matrix cells with non-default settings (``--set``) into their own
files, for the experiments of docs/clustering-defaults.md, and holds the cells it
measured before the sweeps existed (``benchmarks/measured/clustering_matrix.json``,
cited there). Every cell is one real Flower simulation (Ray backend, the fl-clusters
ServerApp and ClientApp); results are written after every run, so an interrupted run
resumes where it stopped, with the ``provenance`` of the invocation that wrote it last.

    python benchmarks/clustering_matrix.py cfl --data digits --model cnn --structure rotation \
        --set cfl-min-silhouette=0.3 --out benchmarks/measured/clustering_matrix-cfl-x.json
    python benchmarks/clustering_matrix.py ifca --data fashion-mnist --model cnn \
        --num-gpus 0.1                                               # 10 clients per GPU
    python benchmarks/clustering_matrix.py flhc --quick --structure rotation --no-baselines \
        --out benchmarks/measured/clustering_matrix-flhc.json       # cells in their own file

Strategy names are any ``strategy`` the run config accepts (``fedsoft`` runs on the
mixture structures only, as its model needs).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fl_clusters.sweep.provenance import measurement_provenance

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "measured" / "clustering_matrix.json"

# name -> run-config overrides. "unequal" is 4 rotation groups of 40/30/20/10 %.
STRUCTURES: dict[str, dict[str, Any]] = {
    "rotation": {"cluster-structure": "rotation", "num-clusters": 4},
    "label-permutation": {"cluster-structure": "label-permutation", "num-clusters": 4},
    "label-permutation-dir0.5": {
        "cluster-structure": "label-permutation", "num-clusters": 4, "dirichlet-alpha": 0.5,
    },
    "none": {"cluster-structure": "none", "num-clusters": 1},
    "unequal": {
        "cluster-structure": "rotation", "num-clusters": 4, "group-sizes": "0.4,0.3,0.2,0.1",
    },
    "rotation-mixture": {"cluster-structure": "rotation-mixture", "num-clusters": 2},
    "label-permutation-mixture": {
        "cluster-structure": "label-permutation-mixture", "num-clusters": 2,
    },
}
MIXTURES = ("rotation-mixture", "label-permutation-mixture")
# Soft strategies run on the mixtures only; hard ones on the group structures only.
SOFT = ("fedsoft", "fedem")
DATASETS = ("digits", "fashion-mnist")
MODELS = ("mlp", "cnn")
BASELINES = ("fedavg", "local")
# Digits: 20 clients of ~63 samples; Fashion-MNIST: 20 clients of ~2,800.
CLIENTS = 20
ROUNDS = {"ifca": 15, "cfl": 25, "acfl": 20, "fedsoft": 30, "flhc": 15, "wecfl": 15,
          "fedem": 20}
DATA_SETTINGS = {"fashion-mnist": {"acfl-trial-epochs": 3}}


def cell_key(strategy: str, structure: str, data: str, model: str, seed: int) -> str:
    """The cell's id in the results file."""
    return f"{strategy}|{structure}|{data}|{model}|{seed}"


def run_cell(
    strategy: str,
    structure: str,
    data: str,
    model: str,
    seed: int,
    num_gpus: float = 0.0,
    data_root: str = "",
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One simulation with default settings; returns the figures the table needs.

    ``num_gpus`` is each client's GPU fraction (0: CPU only); the clients then train
    on CUDA (``device="auto"``), and the cell records where it ran. ``overrides``
    (run-config keys) measure a candidate default; the cell records them.
    """
    import torch
    from flwr.simulation import run_simulation

    from fl_clusters.client_app import build_client_app
    from fl_clusters.server_app import build_server_app

    with tempfile.TemporaryDirectory() as folder:
        settings = {
            **STRUCTURES[structure],
            **DATA_SETTINGS.get(data, {}),
            "strategy": strategy,
            "dataset": data,
            "model": model,
            "seed": seed,
            "num-rounds": ROUNDS.get(strategy, 15),
            "min-nodes": CLIENTS,
            "results-dir": folder,
            **({"data-root": data_root} if data_root else {}),
            **(overrides or {}),
        }
        start = time.time()
        run_simulation(
            server_app=build_server_app(settings),
            client_app=build_client_app(settings),
            num_supernodes=CLIENTS,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": num_gpus}},
        )
        summary = json.loads(next(Path(folder).glob("*/summary.json")).read_text())
    return {
        "ari": summary.get("ari"),
        "num_clusters_found": summary.get("num_clusters_found"),
        "personalized_accuracy": summary.get("personalized_accuracy"),
        "num_rounds": settings["num-rounds"],
        "num_reseeds": summary.get("num_reseeds"),
        "split_rounds": summary.get("split_rounds"),
        "clustering_round": summary.get("clustering_round"),
        "wall_time_s": round(time.time() - start, 1),
        "device": torch.cuda.get_device_name(0) if num_gpus > 0 else "cpu",
        **({"num_gpus": num_gpus} if num_gpus > 0 else {}),
        **({"overrides": overrides} if overrides else {}),
    }


def load(path: Path = OUT) -> dict[str, Any]:
    """The cells measured so far in the results file ``path``."""
    return json.loads(path.read_text()) if path.exists() else {}


def run_config_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs read as ``flwr run --run-config`` reads them (strings quoted)."""
    from flwr.common.config import parse_config_args

    from fl_clusters.config import parse_run_config

    values = parse_config_args([" ".join(pairs)]) if pairs else {}
    parse_run_config(values)  # an unknown key or a bad value fails before any run
    return values


def main(argv: list[str]) -> None:
    """Run the selected cells that are not measured yet."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategies", nargs="*", help="strategies (baselines are added)")
    parser.add_argument("--structure", nargs="*", default=list(STRUCTURES), choices=STRUCTURES)
    parser.add_argument("--data", nargs="*", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--model", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="digits, mlp, seed 0 only")
    parser.add_argument("--no-baselines", action="store_true", help="skip FedAvg/local runs")
    parser.add_argument("--rerun", action="store_true", help="run measured cells again")
    parser.add_argument(
        "--num-gpus", type=float, default=0.0,
        help="GPU fraction per client (e.g. 0.1: ten clients share one GPU); 0 = CPU",
    )
    parser.add_argument("--data-root", default="", help="folder of local data files")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE",
        help="run-config overrides, as flwr run --run-config takes them (key=\"text\" "
             "key=2.0); needs --out, since the matrix itself holds default settings only",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="results file")
    args = parser.parse_args(argv)
    overrides = run_config_overrides(args.set)
    if overrides and args.out.resolve() == OUT.resolve():
        parser.error("--set measures non-default settings: write them elsewhere with --out")
    if args.quick:
        args.data, args.model, args.seeds = ["digits"], ["mlp"], [0]
    results = load(args.out)
    source = measurement_provenance()
    strategies = list(args.strategies) + ([] if args.no_baselines else list(BASELINES))
    for data in args.data:
        for model in args.model:
            for structure in args.structure:
                for seed in args.seeds:
                    for strategy in strategies:
                        if (strategy in SOFT) != (structure in MIXTURES) and \
                                strategy not in BASELINES:
                            continue
                        key = cell_key(strategy, structure, data, model, seed)
                        if key in results and "error" not in results[key] and \
                                not args.rerun:
                            continue
                        print(f"running {key}", flush=True)
                        try:
                            results[key] = run_cell(
                                strategy, structure, data, model, seed,
                                args.num_gpus, args.data_root, overrides,
                            )
                        except Exception as error:
                            # One failing cell must not lose the rest of a long
                            # matrix; the table shows it and the next run retries it.
                            results[key] = {"error": repr(error)}
                        print(f"{key}: {results[key]}", flush=True)
                        results["provenance"] = source
                        args.out.parent.mkdir(parents=True, exist_ok=True)
                        args.out.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
