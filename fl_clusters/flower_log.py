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

from fl_clusters.client_errors import describe_error

# Ray's actors log this at every normal shutdown, after the run's last line.
ACTOR_SHUTDOWN_NOTICE = "Manually terminating %s"
# Flower's simulation logs a ClientApp's exception three times before it reaches the
# strategy as an error reply: this notice of its Ray backend, then the exception and
# its traceback from the worker that runs the message (flwr vce_api.worker).
RAY_BACKEND_NOTICE = "An exception was raised when processing a message by %s"
CLIENT_APP_EXCEPTION = "ClientAppException"
# How Flower's own FedAvg/FedProx log an error reply (flwr.serverapp.strategy.FedAvg).
FLOWER_ERROR_REPLY = "\t> Received error in reply from node %d: %s"


class ActorShutdownNotices(logging.Filter):
    """Drop the WARNING each ClientApp actor logs when the simulation ends normally."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every record but the actors' shutdown notice."""
        return record.msg != ACTOR_SHUTDOWN_NOTICE


class ClientErrorsInOneLine(logging.Filter):
    """A failing ClientApp's error: one line per reply, not three tracebacks per reply.

    Drops the records Flower's simulation logs about a ClientApp's exception
    (:data:`RAY_BACKEND_NOTICE`, the exception, its traceback): the error reply
    that follows carries the same text, which the strategy logs in one line per
    node and round and in full once per distinct error
    (:mod:`fl_clusters.client_errors`). Flower's own FedAvg/FedProx log that reply
    themselves (:data:`FLOWER_ERROR_REPLY`): their record is shortened the same way.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Drop the simulation's copies of a client's exception; shorten FedAvg's line."""
        if record.msg == RAY_BACKEND_NOTICE:
            return False
        if record.msg == FLOWER_ERROR_REPLY and isinstance(record.args, tuple) \
                and len(record.args) == 2:
            node, reason = record.args
            record.args = (node, describe_error(str(reason), f"node {node}"))
            return True
        text = str(record.msg)
        copy = isinstance(record.msg, BaseException) or text.startswith("Traceback")
        return not (copy and CLIENT_APP_EXCEPTION in text)


def log_client_errors_in_one_line() -> None:
    """Install :class:`ClientErrorsInOneLine` on Flower's logger (once)."""
    logger = FLOWER_LOGGER
    if not any(isinstance(f, ClientErrorsInOneLine) for f in logger.filters):
        logger.addFilter(ClientErrorsInOneLine())


def show_warnings_only() -> None:
    """Let Flower's logger pass warnings and errors only, for the rest of the process."""
    FLOWER_LOGGER.setLevel(logging.WARNING)


def hide_actor_shutdown_notices() -> None:
    """Install :class:`ActorShutdownNotices` on Flower's logger (once)."""
    logger = FLOWER_LOGGER
    if not any(isinstance(f, ActorShutdownNotices) for f in logger.filters):
        logger.addFilter(ActorShutdownNotices())
