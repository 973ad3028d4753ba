"""How much of Flower's own log a run shows.

By default a run prints one progress line per round (:mod:`fl_clusters.progress`)
and Flower's warnings and errors; Flower's step-by-step INFO log (every
``configure_train``, every round's metric records) comes back with the
run-config key ``verbose``. Kept free of torch and scikit-learn: the apps that
``flwr run`` loads import it.
"""

from __future__ import annotations

import logging

from flwr.common.logger import FLOWER_LOGGER

# Ray's actors log this at every normal shutdown, after the run's last line.
ACTOR_SHUTDOWN_NOTICE = "Manually terminating %s"


class ActorShutdownNotices(logging.Filter):
    """Drop the WARNING each ClientApp actor logs when the simulation ends normally."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every record but the actors' shutdown notice."""
        return record.msg != ACTOR_SHUTDOWN_NOTICE


def show_warnings_only() -> None:
    """Let Flower's logger pass warnings and errors only, for the rest of the process."""
    FLOWER_LOGGER.setLevel(logging.WARNING)


def hide_actor_shutdown_notices() -> None:
    """Install :class:`ActorShutdownNotices` on Flower's logger (once)."""
    logger = FLOWER_LOGGER
    if not any(isinstance(f, ActorShutdownNotices) for f in logger.filters):
        logger.addFilter(ActorShutdownNotices())
