"""A benchmark job's federation: run by ``flwr run`` or ``run_simulation``, and timed.

:func:`federation_flwr_run` runs the app as ``make run`` does (``flwr run . --stream``
in a copy of the checkout), :func:`federation_simulation` with
``flwr.simulation.run_simulation`` in a fresh process. Both return the round
times of the run's rounds.jsonl, its start-up (from the process's start to
Flower's ``[ROUND 1/N]`` line, :class:`RoundMarks`), Flower's own clock of all
rounds, the summary fields the benchmarks report and the peak memory
(benchmarks/overhead.py, benchmarks/scale.py, benchmarks/readme_jobs.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.simulation import run_simulation

from benchmarks.processes import TreeMemory, in_fresh_process, maxrss_mb
from fl_clusters.client_app import build_client_app
from fl_clusters.server_app import build_server_app

ROOT = Path(__file__).resolve().parent.parent
ROUND_LINE = re.compile(r"\[ROUND (\d+)/\d+\]")
FINISHED_LINE = re.compile(r"Strategy execution finished in ([0-9.]+)s")
# The ServerApp's own clock of its start-up phases (fl_clusters.server_app.start_up).
STARTUP_LINES = {
    "nodes_connected_s": re.compile(r"start-up: \d+ nodes connected after ([0-9.]+) s"),
    "handshake_s": re.compile(r"start-up: handshake with \d+ nodes took ([0-9.]+) s"),
}
SUPERLINK_WAIT_S = 900.0
SUPERLINK_POLL_S = 5.0


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
    # What the report's sample was (logical clients: report-clients of num-clients).
    sample = {key: summary[key] for key in ("report_asked", "report_of") if key in summary}
    return {
        **{key: summary[key] for key in keys},
        **sample,
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


def flwr_run_command(config: dict[str, Any], clients: int) -> tuple[list[str], dict[str, str]]:
    """The ``flwr run . --stream`` command of a job and the environment it runs in.

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
    return command, env


def federation_flwr_run(config: dict[str, Any], clients: int) -> dict[str, Any]:
    """Run one job with ``flwr run . --stream`` as ``make run`` does; stop its SuperLink.

    Instead of stopping a SuperLink found before the run (``make run``), this waits
    for it to end: on a shared machine it may belong to another job's run. The
    arguments are :func:`flwr_run_command`'s.
    """
    command, env = flwr_run_command(config, clients)
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
            "rusage_maxrss_mb": maxrss_mb(usage),
            "rusage": "maxrss of the flwr CLI process and its waited children (wait4); the "
            "detached SuperLink and its simulation are not among them",
            "tree_peak_rss_mb": memory.peak_mb,
            "tree": "flwr CLI and descendants (the SuperLink, its simulation, Ray workers)",
        },
    }


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
            "maxrss_mb": maxrss_mb(resource.getrusage(resource.RUSAGE_SELF)),
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
