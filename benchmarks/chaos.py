"""Chaos run: 30 % of the replies fail and the server is killed once; the result holds.

The default job (IFCA on digits, 20 clients in 4 rotation groups, 15 rounds, one
CPU a client) runs twice with the same seed (:func:`fl_clusters.chaos.run_chaos`):

* clean;
* chaotic: 30 % of the train and evaluate replies fail (1 % stall past the
  round timeout, the other 29 % split equally among a raised exception and four
  malformed replies: ``num-examples`` = inf, a NaN in the model, a wrong shape,
  a missing metric), and the simulation process with its Ray is killed with
  SIGKILL once round ``KILL_AFTER_ROUND`` is done, then resumed from its last
  checkpoint (every ``CHECKPOINT_EVERY`` rounds) to the end.

Stalls are rare because each round phase with one waits the whole round timeout,
which is long (``ROUND_TIMEOUT``) so that a busy machine's cold start is not taken
for a fault.

Writes ``benchmarks/measured/chaos.json`` (both runs' final accuracy, ARI, cluster
models, rounds, rejected and unanswered replies, the faults injected by kind, the
round of the kill and of the checkpoint resumed from)::

    nice -n 10 .venv/bin/python benchmarks/chaos.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from fl_clusters.chaos import run_chaos
from fl_clusters.fault_injection import FaultInjector
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "chaos.json"
NUM_CLIENTS = 20
CLIENT_CPUS = 1.0  # the default federation's (pyproject.toml)
ROUND_TIMEOUT = 40.0
CHECKPOINT_EVERY = 5
KILL_AFTER_ROUND = 7  # killed in round 8: rounds 6 and 7 are lost and run again
SETTINGS: dict[str, Any] = {
    "seed": 0, "num-rounds": 15, "round-timeout": ROUND_TIMEOUT,
    "checkpoint-every": CHECKPOINT_EVERY, "min-nodes": NUM_CLIENTS, "plots": False,
}
FAULTS = FaultInjector(rate=0.3, seed=0, stall_rate=0.01, stall_s=ROUND_TIMEOUT + 5)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        result = run_chaos(SETTINGS, NUM_CLIENTS, FAULTS, KILL_AFTER_ROUND, Path(scratch),
                           client_cpus=CLIENT_CPUS)
    document = {
        "provenance": measurement_provenance(),
        "settings": SETTINGS,
        "num_clients": NUM_CLIENTS,
        "client_cpus": CLIENT_CPUS,
        "faults": {k: v for k, v in dataclasses.asdict(FAULTS).items() if k != "log_dir"},
        "kill_after_round": KILL_AFTER_ROUND,
        **result,
        "accuracy_gap": (result["chaos"]["personalized_accuracy"]
                         - result["clean"]["personalized_accuracy"]),
    }
    partial = OUT.with_suffix(".json.partial")
    partial.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(partial, OUT)
    print(json.dumps({k: document[k] for k in ("clean", "chaos", "accuracy_gap")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
