"""A failing ClientApp in the server's log: one line per reply, its traceback once.

Flower's error reply carries the client's exception as text: ``<class ...>:<'...
Message: <the client's message>'>``, and in simulation that text holds Ray's whole
remote traceback (about 20 lines) before the message. A node that fails fails the
same way in every round, so the server logs one line per node and round (the
exception's last line, :func:`error_line`) and the whole text once per distinct
error and run (:func:`show_once`). Kept free of torch: the apps that ``flwr run``
loads import it.
"""

from __future__ import annotations

import re
from logging import WARNING

from flwr.common.logger import log

# What Flower's ClientAppException puts before the client's own message.
CLIENT_MESSAGE_MARKER = "Message: "
# A traceback's frame lines: what the error is, without the process ids around it.
FRAME_LINE = re.compile(r'^\s*File "[^"]+", line \d+, in ')

# Keys (:func:`error_key`) of the errors shown in full in this run.
_shown: set[str] = set()


def client_error_message(reason: str) -> str:
    """The client's own exception message out of Flower's error reason.

    Flower wraps it as ``<class ...>:<'... Message: <text>'>``; in simulation the
    reason also carries Ray's whole remote traceback before that last part.
    """
    text = reason.rsplit(CLIENT_MESSAGE_MARKER, 1)[-1]
    return text.removesuffix("'>").strip()


def error_line(reason: str) -> str:
    """One line for Flower's error ``reason``: the client's exception, as a traceback ends.

    ``RuntimeError: the loader is broken`` where the reason holds the client's
    traceback (simulation); the client's message alone where it does not (a
    deployed SuperNode logs the traceback itself).
    """
    message = client_error_message(reason)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "no reason given"
    ending = re.compile(r"^[A-Za-z_][\w.]*: " + re.escape(lines[0]) + "$")
    for line in reason.splitlines():
        line = line.strip()
        if ending.match(line) and "ClientAppException" not in line:
            return line
    return lines[0] if len(lines) == 1 else f"{lines[0]} (+{len(lines) - 1} lines)"


def error_key(reason: str) -> str:
    """What makes two error reasons the same error: the frames they went through and
    the exception, not the process, actor and address that Ray puts around them."""
    frames = [line.strip() for line in reason.splitlines() if FRAME_LINE.match(line)]
    return "\n".join([*frames, error_line(reason)])


def show_once(reason: str, source: str) -> None:
    """Log ``reason`` in full the first time its error (:func:`error_key`) comes in this run.

    Parameters
    ----------
    reason : str
        Flower's error reason of a reply.
    source : str
        Who sent it, for the log line (e.g. ``"partition 3"``).
    """
    key = error_key(reason)
    if key in _shown:
        return
    _shown.add(key)
    log(WARNING, "client error from %s, in full (shown once per distinct error; later "
        "replies with it get one line):\n%s", source, reason)


def forget_shown() -> None:
    """Start a new run: every error is shown in full again the first time it comes."""
    _shown.clear()


def describe_error(reason: str, source: str) -> str:
    """``client error: <its last line>`` for the reply of ``source``; the whole reason is
    logged the first time its error comes (:func:`show_once`)."""
    show_once(reason, source)
    return f"client error: {error_line(reason)}"
