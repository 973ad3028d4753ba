"""Runs that cannot start: one error type, reported as one line instead of a traceback.

A configuration the run cannot use (an unknown run-config key, fewer nodes than
the strategy needs, a data set no node can load) is the user's to fix, so the
message names the problem and the fix, and a traceback through Flower's and
fl-clusters' frames only hides it. The run must still end as failed: Flower marks
a run failed when its ServerApp raises, so the error is raised as usual and
:class:`OneLineConfigurationErrors` shortens what Flower logs about it.
"""

from __future__ import annotations

import logging
import sys

from flwr.common.logger import FLOWER_LOGGER


class ConfigurationError(ValueError):
    """The run's configuration cannot run; the message says what to change.

    A ``ValueError`` so that callers checking for bad values keep catching it.
    """


class FederationProblem(ValueError):
    """A reason not to take part that every node of the federation shares.

    Its partition plan cannot be made (a client without a validation sample...):
    the plan is the whole federation's, so every node would say the same. A node
    reports it at the start-up handshake, and the server, which asks one node
    first, stops the run before asking the others (:func:`fl_clusters.handshake.
    identify_federation`).
    """


CLASS_NAME = f"{__name__}.ConfigurationError"

# Configurations Ray itself refuses, in Flower's backend before any app code runs:
# the words of Ray's error -> what to change.
RAY_REFUSALS = {
    "When connecting to an existing cluster, num_cpus and num_gpus must not be provided": (
        "Ray refuses init-args-num-cpus and init-args-num-gpus when the simulation joins "
        "an existing Ray cluster (RAY_ADDRESS is set). Fix: drop them from "
        "--federation-config; each machine declares its own CPUs and GPUs with "
        "`ray start --num-cpus N --num-gpus G` (docs/cluster.md)"
    ),
}


def _configuration_error(record: logging.LogRecord) -> ConfigurationError | None:
    """The :class:`ConfigurationError` behind ``record``'s exception, if one is."""
    if not record.exc_info or record.exc_info[1] is None:
        return None
    error: BaseException | None = record.exc_info[1]
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ConfigurationError):
            return error
        refusal = _ray_refusal(str(error))
        if refusal is not None:
            return ConfigurationError(refusal)
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _ray_refusal(text: str) -> str | None:
    """What to change, when ``text`` holds a configuration Ray refuses."""
    return next((fix for words, fix in RAY_REFUSALS.items() if words in text), None)


def _about_configuration(text: str) -> bool:
    return CLASS_NAME in text or _ray_refusal(text) is not None


class OneLineConfigurationErrors(logging.Filter):
    """Log a :class:`ConfigurationError` that ends a run as one line, without traceback.

    Flower logs the exception that ended the ServerApp with its traceback (the
    simulation: "Simulation raised an exception"; a deployment's ServerApp
    process likewise) and then its exit-code notice, which marks the run failed.
    This filter leaves that notice alone and turns the exception's record into
    ``fl-clusters: <problem and fix>``. Flower also logs some of these errors a
    second time as text (the traceback, or the exception being handled): those
    records are dropped, the one line says it. A configuration Ray refuses before
    the app runs (:data:`RAY_REFUSALS`) is reported the same way. Any other
    record passes unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite or drop a record about a :class:`ConfigurationError`; keep the rest."""
        error = _configuration_error(record)
        if error is not None:
            record.msg, record.args = "fl-clusters: %s", (error,)
            record.exc_info, record.exc_text = None, None
            return True
        if record.levelno < logging.ERROR:
            return True
        # Flower logs some client failures with no exception attached, from inside
        # the except block that handles it: the exception being handled tells.
        handled = sys.exc_info()[1]
        return not _about_configuration(record.getMessage()) and (
            handled is None or not _about_configuration(str(handled))
        )


def report_configuration_errors_in_one_line() -> None:
    """Install :class:`OneLineConfigurationErrors` on Flower's logger (once)."""
    logger = FLOWER_LOGGER
    if not any(isinstance(f, OneLineConfigurationErrors) for f in logger.filters):
        logger.addFilter(OneLineConfigurationErrors())
