"""Chaos: a federation with faulty replies, killed mid-way and resumed, against a clean one.

:func:`run_chaos` runs one federation twice with the same seed: clean, and with
the faults of :class:`~fl_clusters.fault_injection.FaultInjector`, where the
simulation process (and the Ray it started) is killed with SIGKILL after a
checkpoint and resumed from it. Each simulation runs in a child process
(:class:`ChildRun`, :func:`main`). tests/test_chaos.py and benchmarks/chaos.py use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fl_clusters import protocol as p
from fl_clusters.checkpoint import CHECKPOINT_FILE
from fl_clusters.fault_injection import FaultInjector, count_faults, read_fault_log

# The progress line the ServerApp prints after every round (fl_clusters.progress).
_ROUND_DONE = re.compile(r"^round\s+(\d+)/\d+\s", re.MULTILINE)
# The child's program: main() with the run's JSON spec (ChildRun.start).
_CHILD = "import sys; from fl_clusters.chaos import main; sys.exit(main(sys.argv[1:]))"
# How often run_until_killed looks at the child's checkpoint and log.
_POLL_S = 0.1
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class ChildRun:
    """One simulated federation, run in a child process.

    Parameters
    ----------
    settings : Mapping[str, Any]
        Run config; ``results-dir`` is a folder of this run alone.
    num_clients : int
        Simulated SuperNodes.
    client_cpus : float
        Ray CPUs per client (below 1, more clients run at once: a stalled client
        sleeps without holding up the others).
    faults : FaultInjector | None
        The client mod injecting faults, if any.
    """

    settings: Mapping[str, Any]
    num_clients: int
    client_cpus: float
    faults: FaultInjector | None = None

    @property
    def results_dir(self) -> Path:
        """The folder that receives the run's results folder."""
        return Path(self.settings["results-dir"])

    def start(self, log: Path) -> subprocess.Popen[bytes]:
        """Start the run in a new session (its Ray too), its output in ``log``."""
        spec = {
            "settings": dict(self.settings), "num-supernodes": self.num_clients,
            "client-cpus": self.client_cpus,
            "faults": None if self.faults is None else dataclasses.asdict(self.faults),
        }
        source = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
        with log.open("wb") as out:
            return subprocess.Popen(
                [sys.executable, "-c", _CHILD, json.dumps(spec)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )

    def run(self, log: Path, timeout_s: float) -> Path:
        """Run to the end; the run's results folder."""
        child = self.start(log)
        try:
            code = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the run took longer than {timeout_s:g} s; see {log}") from None
        finally:
            _kill(child)  # a run past its time
        folders = [path.parent for path in self.results_dir.glob("*/summary.json")]
        if code != 0 or len(folders) != 1:
            raise RuntimeError(f"the run exited with status {code} and {len(folders)} results "
                               f"folders; see {log}")
        return folders[0]

    def run_until_killed(self, log: Path, after_round: int, timeout_s: float) -> tuple[Path, int]:
        """Kill the run (SIGKILL to its whole session) once a checkpoint exists and
        round ``after_round`` is done.

        Returns
        -------
        tuple[Path, int]
            The killed run's results folder (holding its last checkpoint) and the
            last round it finished.
        """
        child = self.start(log)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                checkpoint = find_checkpoint(self.results_dir)
                if checkpoint is not None and rounds_done(log) >= after_round:
                    _kill(child)
                    return checkpoint.parent, rounds_done(log)
                if child.poll() is not None:
                    raise RuntimeError(f"the run ended (status {child.returncode}) before it "
                                       f"was killed after round {after_round}; see {log}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"round {after_round} and a checkpoint not reached in "
                                       f"{timeout_s:g} s; see {log}")
                time.sleep(_POLL_S)
        finally:
            _kill(child)


def _kill(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's session, the simulation and the Ray processes it started,
    while the child runs (once it has ended, its id may be another process's)."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def find_checkpoint(results_dir: Path) -> Path | None:
    """The checkpoint a run under ``results_dir`` wrote (its only run), if any."""
    found = sorted(results_dir.glob(f"*/{CHECKPOINT_FILE}"))
    return found[0] if found else None


def rounds_done(log: Path) -> int:
    """The last round whose progress line is in the run's output ``log`` (0: none)."""
    return max(map(int, _ROUND_DONE.findall(log.read_text(errors="replace"))), default=0)


# -------------------------------------------------------------- the experiment
def run_outcome(folder: Path) -> dict[str, Any]:
    """What a run's results folder says about its end."""
    summary = json.loads((folder / "summary.json").read_text())
    rounds = (folder / "rounds.jsonl").read_text().splitlines()
    with np.load(folder / "models.npz") as models:
        saved = [cluster for cluster in range(summary["num_cluster_models"])
                 if any(key.startswith(p.cluster_prefix(cluster)) for key in models.files)]
        finite = all(np.isfinite(models[key]).all() for key in models.files)
    return {
        "personalized_accuracy": summary["personalized_accuracy"],
        "ari": summary["ari"],
        "num_cluster_models": summary["num_cluster_models"],
        "num_clusters_found": summary["num_clusters_found"],
        "models_saved": len(saved),
        "models_finite": bool(finite),
        "rounds_recorded": len(rounds),
        "num_clients": summary["num_clients"],
        "rejected_replies": summary["rejected_replies"],
        "unanswered_messages": summary["unanswered_messages"],
        "resumed_after_round": summary["resumed_after_round"],
        "unreported_nodes": len(summary["unreported_nodes"]),
    }


def run_chaos(
    settings: Mapping[str, Any],
    num_clients: int,
    faults: FaultInjector,
    kill_after_round: int,
    folder: Path,
    client_cpus: float = 0.25,
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """Run a federation clean, then with faults, killed once and resumed; both outcomes.

    Parameters
    ----------
    settings : Mapping[str, Any]
        The run config of both runs (``seed`` included); needs ``checkpoint-every``
        > 0 and ``round-timeout`` below ``faults.stall_s``.
    num_clients : int
        Simulated SuperNodes.
    faults : FaultInjector
        The faults of the chaotic run; its ``log_dir`` is set here.
    kill_after_round : int
        The chaotic run is killed once this round is done and a checkpoint exists,
        then resumed from that checkpoint.
    folder : Path
        Receives every run's results, output and the fault log.
    client_cpus : float
        Ray CPUs per client.
    timeout_s : float
        Limit of each of the three simulations.

    Returns
    -------
    dict[str, Any]
        ``clean`` and ``chaos``: each run's outcome (:func:`run_outcome`); ``chaos``
        also holds ``last_round_before_kill``, the faults injected in the rounds the
        result is made of (``faults_injected``: the killed run's up to its
        checkpoint, then the resumed run's) and in the rounds the kill lost
        (``faults_lost``); ``seconds`` of each simulation.
    """
    _check_chaos_settings(settings, faults)
    fault_logs = _fault_log_folders(folder)
    seconds: dict[str, float] = {}
    clean = ChildRun({**settings, "results-dir": str(folder / "clean")}, num_clients, client_cpus)
    clean_folder = _timed(seconds, "clean", lambda: clean.run(folder / "clean.log", timeout_s))
    killed = ChildRun(
        {**settings, "results-dir": str(folder / "killed")}, num_clients, client_cpus,
        dataclasses.replace(faults, log_dir=str(fault_logs["killed"])),
    )
    killed_folder, last_round = _timed(seconds, "killed", lambda: killed.run_until_killed(
        folder / "killed.log", kill_after_round, timeout_s))
    resumed = ChildRun(
        {**settings, "results-dir": str(folder / "resumed"), "resume-from": str(killed_folder)},
        num_clients, client_cpus, dataclasses.replace(faults, log_dir=str(fault_logs["resumed"])),
    )
    resumed_folder = _timed(seconds, "resumed",
                            lambda: resumed.run(folder / "resumed.log", timeout_s))
    chaos = _chaos_outcome(resumed_folder, fault_logs, last_round)
    return {"clean": run_outcome(clean_folder), "chaos": chaos, "seconds": seconds}


def _check_chaos_settings(settings: Mapping[str, Any], faults: FaultInjector) -> None:
    """Refuse settings under which the killed run cannot resume or a stall is no stall."""
    if settings.get("checkpoint-every", 0) <= 0:
        raise ValueError("run_chaos: settings need checkpoint-every > 0 to resume the killed run")
    if faults.stall_rate > 0 and faults.stall_s <= settings.get("round-timeout", 3600.0):
        raise ValueError(f"run_chaos: stall_s={faults.stall_s} must exceed round-timeout="
                         f"{settings.get('round-timeout', 3600.0)}")


def _fault_log_folders(folder: Path) -> dict[str, Path]:
    """Create ``folder`` and in it a fault log folder each for the killed and the resumed run."""
    folder.mkdir(parents=True, exist_ok=True)
    fault_logs = {name: folder / f"faults-{name}" for name in ("killed", "resumed")}
    for path in fault_logs.values():
        path.mkdir(exist_ok=True)
    return fault_logs


def _timed(seconds: dict[str, float], name: str, run: Callable[[], _Result]) -> _Result:
    """What ``run`` returns; the seconds it took go to ``seconds[name]``."""
    started = time.monotonic()
    result = run()
    seconds[name] = time.monotonic() - started
    return result


def _chaos_outcome(resumed_folder: Path, fault_logs: Mapping[str, Path],
                   last_round: int) -> dict[str, Any]:
    """The chaotic run's outcome, with the faults its result is made of and those lost.

    The killed run's faults count up to the checkpoint the resumed run started
    from; those of its later rounds were lost with the kill.
    """
    chaos = run_outcome(resumed_folder)
    checkpoint_round = chaos["resumed_after_round"]
    before_kill = read_fault_log(fault_logs["killed"])
    kept = [f for f in before_kill if f["round"] <= checkpoint_round]
    lost = [f for f in before_kill if f["round"] > checkpoint_round]
    chaos.update(
        last_round_before_kill=last_round,
        faults_injected=count_faults(kept + read_fault_log(fault_logs["resumed"])),
        faults_lost=count_faults(lost),
    )
    return chaos


def main(argv: Sequence[str]) -> int:
    """Run one simulation from the JSON spec (``argv[0]``) of :meth:`ChildRun.start`."""
    from fl_clusters.sweep.simulation import simulate

    spec = json.loads(argv[0])
    faults = spec["faults"]
    mods = None if faults is None else [
        FaultInjector(**{**faults, "kinds": tuple(faults["kinds"])})
    ]
    simulate(spec["settings"], {
        "num-supernodes": spec["num-supernodes"],
        "client-resources-num-cpus": spec["client-cpus"], "client-resources-num-gpus": 0.0,
    }, None, client_mods=mods)
    return 0

