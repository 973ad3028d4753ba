"""Speed benchmark of the pairwise cosine similarity that CFL and ACFL run each split.

Compares :func:`fl_clusters.clustering.pairwise_cosine` (one matrix product over
flattened float32 updates) with a Python double loop over client pairs, for model
sizes of the networks we ship. Writes ``benchmarks/measured/similarity_speed.json``
(one row per model size and client count under ``rows``, beside the run's
``provenance``).

    python benchmarks/similarity_speed.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from fl_clusters.clustering import pairwise_cosine
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "similarity_speed.json"
# Parameters of: our digits MLP, IFCA's MNIST MLP (784-200-10), our CNN on 28x28.
MODEL_SIZES = {"mlp-digits": 15_010, "mlp-mnist": 159_010, "cnn-mnist": 421_642}
CLIENTS = (20, 100, 200)
LOOP_MAX_CLIENTS = 100  # the double loop takes minutes beyond this


def pairwise_cosine_loop(vectors: np.ndarray) -> np.ndarray:
    """The naive reference: one dot product per client pair."""
    n = len(vectors)
    out = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            a, b = vectors[i], vectors[j]
            out[i, j] = float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))
    return out


def best_time(function, argument: np.ndarray, repeats: int) -> float:
    """Fastest of ``repeats`` wall-clock timings, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(argument)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    """Time both implementations and write the results file."""
    source = measurement_provenance()
    rng = np.random.default_rng(0)
    rows = []
    for model, size in MODEL_SIZES.items():
        for clients in CLIENTS:
            updates = rng.standard_normal((clients, size), dtype=np.float32)
            row = {
                "model": model,
                "parameters": size,
                "clients": clients,
                "matrix_product_s": best_time(pairwise_cosine, updates, 3),
                "updates_mib": updates.nbytes / 2**20,
            }
            if clients <= LOOP_MAX_CLIENTS:
                row["double_loop_s"] = best_time(pairwise_cosine_loop, updates, 1)
                row["speedup"] = row["double_loop_s"] / row["matrix_product_s"]
                np.testing.assert_allclose(
                    pairwise_cosine(updates), pairwise_cosine_loop(updates), atol=1e-5
                )
            rows.append(row)
            print(json.dumps(row), flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"provenance": source, "rows": rows}, indent=2))
    print(f"results: {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
