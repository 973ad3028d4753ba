"""The ServerApp and ClientApp that ``flwr run .`` loads (pyproject's app components).

Both are registered here without importing torch or scikit-learn; each imports its
implementation (:mod:`fl_clusters.server_app`, :mod:`fl_clusters.client_app`) when
Flower first calls it. Flower's simulation loads the ServerApp and then the
ClientApp under one lock and calls ``ray.init`` only after both have loaded, so
loading the implementations there would keep Ray waiting for their imports (torch,
scikit-learn). Loaded from here, Ray starts at once and the ServerApp imports while
Ray comes up (docs/performance.md).
Code that builds its own apps (tests, notebooks, ``run_simulation``) keeps using
``fl_clusters.server_app.app`` and ``fl_clusters.client_app.build_client_app``.
Importing this module also sets Ray's environment (:mod:`fl_clusters.ray_env`)
before Flower starts Ray. The ServerApp run here
shows one progress line per round instead of Flower's INFO log unless the run-config
key ``verbose`` is true (:mod:`fl_clusters.flower_log`).
"""

from __future__ import annotations

import warnings

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fl_clusters import protocol as p
from fl_clusters.errors import report_configuration_errors_in_one_line
from fl_clusters.flower_log import hide_actor_shutdown_notices, show_warnings_only
from fl_clusters.ray_env import pass_ray_messages_inline, start_own_ray_unless_a_cluster_is_named
from fl_clusters.ray_pool import drop_dead_actors_in_simulation

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
    drop_dead_actors_in_simulation()
    from fl_clusters.server_app import app

    app(grid, context)


def _handle(message: Message, context: Context) -> Message:
    from fl_clusters.client_app import app

    return app(message, context)


client_app = ClientApp()
client_app.train()(_handle)
client_app.evaluate()(_handle)
# The strategies' own queries share one type (query.strategy), so this app answers
# those of a strategy added later too; their functions are found when one comes.
for _query in p.QUERY_TYPES:
    client_app.query(p.action_of(_query))(_handle)
