"""One simulated federation in this process, on a Ray session shared by many runs.

Every run is one ``flwr.simulation.run_simulation`` of the fl-clusters ServerApp
and ClientApp. Flower starts Ray only when it is not running yet, but its Ray
backend shuts Ray down at the end of every simulation
(``RayBackend.terminate``), so back-to-back simulations would each pay Ray's
start-up. :class:`RaySession` starts Ray once for many runs and, while it is
open, lets a simulation's end terminate only its own ClientApp actors.
:func:`simulate` runs one federation (with a time limit, :func:`stop_at_deadline`)
and :func:`output_to` sends its output to the run's log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fl_clusters.apps import pass_ray_messages_inline

if TYPE_CHECKING:
    from flwr.clientapp.typing import Mod

# Ray's own settings for a simulation (flwr.supercore.constant.DEFAULT_SIMULATION_CONFIG).
RAY_LOGGING_LEVEL = "WARNING"


class RunTimeoutError(TimeoutError):
    """A run took longer than the sweep file's ``run-timeout-s``."""


class RaySession(contextlib.AbstractContextManager["RaySession"]):
    """Ray started once for many simulations in this process.

    On entry Ray starts as Flower's simulation would start it (no dashboard,
    Ray's WARNING log, this process's ``sys.path`` for the workers) and sees every
    GPU of the machine, so clients may ask for a fraction of one
    (``client-resources-num-gpus``). Until exit, Flower's ``RayBackend.terminate``
    terminates the simulation's actors and leaves Ray running; exit restores it
    and shuts Ray down.
    """

    def __enter__(self) -> RaySession:
        import ray
        from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

        if ray.is_initialized():
            raise RuntimeError("Ray is already running in this process; a sweep starts its own")
        # Read by Ray when it starts: messages travel inline with their task.
        pass_ray_messages_inline()
        pythonpath = os.pathsep.join(
            [*sys.path, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
        )
        ray.init(
            include_dashboard=False, logging_level=RAY_LOGGING_LEVEL, log_to_driver=True,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
        )
        self._backend = RayBackend
        self._terminate = RayBackend.terminate

        def terminate_actors_only(backend: Any) -> None:
            if backend.pool:
                backend.pool.terminate_all_actors()

        RayBackend.terminate = terminate_actors_only  # type: ignore[method-assign]
        self.node_id = ray.get_runtime_context().get_node_id()
        self.resources = dict(ray.cluster_resources())
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        self._backend.terminate = self._terminate  # type: ignore[method-assign]
        ray.shutdown()


def stop_at_deadline(grid: Any, deadline: float, limit_s: float) -> None:
    """Make ``grid`` raise :class:`RunTimeoutError` on any use after ``deadline``.

    The ServerApp exchanges messages with its clients through these calls and,
    while it waits for replies, pulls at least every 0.5 s, so a run past its
    time stops there; Flower then ends the simulation as for any ServerApp error.
    Only this run's grid object is changed (its class stays Flower's, which the
    ServerApp's message window checks for).
    """
    for name in ("get_node_ids", "push_messages", "pull_messages", "send_and_receive"):
        method = getattr(grid, name)

        def checked(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            if time.monotonic() > deadline:
                raise RunTimeoutError(
                    f"the run took longer than run-timeout-s = {limit_s:g} s"
                )
            return _method(*args, **kwargs)

        setattr(grid, name, checked)


@contextlib.contextmanager
def output_to(log: TextIO) -> Iterator[None]:
    """Send this process's output and Flower's log to ``log`` while a run lasts."""
    from flwr.common.logger import FLOWER_LOGGER

    handlers = [
        h for h in FLOWER_LOGGER.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    # Flower's console handler: a file wants times and no colour codes.
    styles = [(getattr(h, "timestamps", None), getattr(h, "colored", None)) for h in handlers]
    streams = [h.setStream(log) for h in handlers]
    for handler in handlers:
        if hasattr(handler, "timestamps"):
            handler.timestamps, handler.colored = True, False  # type: ignore[attr-defined]
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            yield
    finally:
        for handler, stream, (timestamps, colored) in zip(handlers, streams, styles, strict=True):
            if stream is not None:
                handler.setStream(stream)
            if timestamps is not None:
                handler.timestamps, handler.colored = timestamps, colored  # type: ignore[attr-defined]


def simulate(
    settings: Mapping[str, Any],
    federation: Mapping[str, Any],
    timeout_s: float | None,
    client_mods: list[Mod] | None = None,
) -> Path:
    """Run one simulated federation with run config ``settings``; its results folder.

    ``settings["results-dir"]`` must be a folder of this run alone: the run's
    results folder is the one it finds there. The paper preset's training recipe
    is off (run-config key ``paper-recipe``): the run's recipe is ``settings``, as
    a sweep file's cells share theirs. ``client_mods`` are Flower client
    mods wrapped around every client's handlers (:mod:`fl_clusters.fault_injection`'s fault
    injector).

    Raises whatever ended the run: the ServerApp's own error (a configuration it
    cannot run, a failed round), or :class:`RunTimeoutError`.
    """
    from functools import partial

    from flwr.simulation import run_simulation

    from fl_clusters.client_app import build_client_app
    from fl_clusters.config import PAPER_RECIPE
    from fl_clusters.server_app import build_server_app

    settings = {**settings, PAPER_RECIPE: False}
    deadline = time.monotonic() + (timeout_s or 0.0)
    run_simulation(
        server_app=build_server_app(
            settings,
            prepare_grid=None if timeout_s is None
            else partial(stop_at_deadline, deadline=deadline, limit_s=timeout_s),
        ),
        client_app=build_client_app(settings, mods=client_mods),
        num_supernodes=int(federation["num-supernodes"]),
        backend_config={"client_resources": {
            "num_cpus": federation["client-resources-num-cpus"],
            "num_gpus": federation["client-resources-num-gpus"],
        }},
    )
    folders = [path.parent for path in Path(settings["results-dir"]).glob("*/summary.json")]
    if len(folders) != 1:
        raise RuntimeError(
            f"the simulation ended with {len(folders)} results folders in "
            f"{settings['results-dir']}, not one"
        )
    return folders[0]
