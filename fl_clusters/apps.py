"""The ServerApp and ClientApp that ``flwr run .`` loads (pyproject's app components).

Both are registered here without importing torch or scikit-learn; each imports its
implementation (:mod:`fl_clusters.server_app`, :mod:`fl_clusters.client_app`) when
Flower first calls it. Flower's simulation loads the ServerApp and then the
ClientApp under one lock and calls ``ray.init`` only after both have loaded, so
loading the implementations there kept Ray waiting for about 3 s of imports.
Loaded from here, Ray starts at once and the ServerApp imports while Ray comes up
(docs/performance.md).
Code that builds its own apps (tests, notebooks, ``run_simulation``) keeps using
``fl_clusters.server_app.app`` and ``fl_clusters.client_app.build_client_app``.
Importing this module also asks Ray to pass messages inline
(:func:`pass_ray_messages_inline`), before Flower starts Ray. The ServerApp run here
shows one progress line per round instead of Flower's INFO log unless the run-config
key ``verbose`` is true (:mod:`fl_clusters.flower_log`).
"""

from __future__ import annotations

import os
import warnings

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fl_clusters.errors import report_configuration_errors_in_one_line
from fl_clusters.flower_log import hide_actor_shutdown_notices, show_warnings_only

# The query actions fl_clusters.client_app registers (a test checks the two apps
# answer the same message types).
QUERY_ACTIONS = (
    "report",
    "sample_assignment",
    "cluster_losses",
    "features",
    "identity",
    "state",
    "restore",
)

# Ray hands an actor an argument or return value above its
# max_direct_call_object_size (100 KiB by default) through its shared-memory object
# store, where the raylet seals, pins and frees each one. A Flower message is read
# once, so the store only adds work: with a Fashion-MNIST MLP (0.64 MB) in every
# message the raylet was the third-busiest process, and 100 clients' FedAvg round
# took 2.20 s against 1.52 s inline (docs/performance.md). 10 MiB is Ray's cap on
# the inline bytes of one task; larger messages still go through the store.
RAY_INLINE_BYTES = 10 * 1024 * 1024
RAY_INLINE_ENV = "RAY_max_direct_call_object_size"
RAY_ADDRESS_ENV = "RAY_ADDRESS"
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def pass_ray_messages_inline() -> None:
    """Have Ray pass messages up to ``RAY_INLINE_BYTES`` inline with their task.

    Ray reads the setting when it starts (``ray.init``), so call this before; Flower's
    simulation imports this module before starting Ray. A value already in the
    environment is kept.
    """
    os.environ.setdefault(RAY_INLINE_ENV, str(RAY_INLINE_BYTES))


def start_own_ray_unless_a_cluster_is_named() -> None:
    """Have a simulation start its own Ray, on loopback, unless ``RAY_ADDRESS`` names one.

    Flower's simulation calls a plain ``ray.init()``, which joins the cluster
    recorded in Ray's ``ray_current_cluster`` file when one is there: a cluster
    stopped without removing that file would make every later run wait for it.
    ``RAY_ADDRESS=local`` always starts a fresh local Ray, and
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` has it listen and connect on
    127.0.0.1 instead of the machine's network address (a single-machine run has
    no other machine to reach). A user who wants a cluster sets ``RAY_ADDRESS``
    to its head (docs/cluster.md), and then neither is touched.
    """
    if os.environ.get(RAY_ADDRESS_ENV):
        return
    os.environ[RAY_ADDRESS_ENV] = "local"
    os.environ.setdefault(RAY_LOOPBACK_ENV, "0")


pass_ray_messages_inline()
start_own_ray_unless_a_cluster_is_named()
# Before Flower starts Ray: a configuration Ray refuses is reported in one line too.
report_configuration_errors_in_one_line()
# Ray's tip about a future default for CPU-only actors' CUDA_VISIBLE_DEVICES asks
# nothing of a Flower user and would print at every run's start.
warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
# The ClientApp actors import this module too: their shutdown notices would
# otherwise print after the run's last line (its results folder).
hide_actor_shutdown_notices()

server_app = ServerApp()


@server_app.main()
def _run_server(grid: Grid, context: Context) -> None:
    # This process is the run's own (flwr run): after the results line only Flower's
    # exit notice follows, and without the key it is quiet too.
    if context.run_config.get("verbose") is not True:
        show_warnings_only()
    from fl_clusters.server_app import app

    app(grid, context)


def _handle(message: Message, context: Context) -> Message:
    from fl_clusters.client_app import app

    return app(message, context)


client_app = ClientApp()
client_app.train()(_handle)
client_app.evaluate()(_handle)
for _action in QUERY_ACTIONS:
    client_app.query(_action)(_handle)
