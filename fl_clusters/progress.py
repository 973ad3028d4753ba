"""One line per finished round: how far the run is, time left, accuracy, ARI, clusters."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table
from sklearn.metrics import adjusted_rand_score

# Wide enough for the bar and every field; Flower's log stream is no terminal, so
# the width cannot be read from it.
LINE_WIDTH = 100
BAR_WIDTH = 20


def format_seconds(seconds: float) -> str:
    """``m:ss`` (or ``h:mm:ss``) for a duration in seconds."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """A bar of ``width`` characters, filled in proportion to ``done / total``.

    Drawn as text rather than with rich's live bar: Flower's log stream is no
    terminal, and a bar that redraws itself there would print as garbage.
    """
    filled = round(width * done / total) if total else width
    return "█" * filled + "░" * (width - filled)


def round_ari(truth: Mapping[int, int], used: Mapping[int, int]) -> float | None:
    """ARI of the clusters the evaluated nodes used against their known groups.

    ``None`` when fewer than two evaluated nodes reported a group.
    """
    nodes = [node for node in used if node in truth]
    if len(nodes) < 2:
        return None
    return float(adjusted_rand_score([truth[n] for n in nodes], [used[n] for n in nodes]))


class RoundProgress:
    """Print a progress line after every round (the default instead of Flower's log).

    The line holds a bar with the rounds done, the time left (the mean round so
    far times the rounds to go), the round's seconds, its personalized accuracy,
    the ARI of the clusters the nodes used against their ground-truth groups when
    the nodes told it at the handshake, and how many clusters were in use.

    Parameters
    ----------
    num_rounds : int
        The run's last round.
    truth : Mapping[int, int]
        Node id -> ground-truth group, for the nodes that reported one (metrics
        only: no strategy sees it).
    console : Console | None
        Where the lines go; standard output (what ``flwr run`` streams) by default.
    """

    def __init__(
        self,
        num_rounds: int,
        truth: Mapping[int, int],
        console: Console | None = None,
    ) -> None:
        self.num_rounds = num_rounds
        self.truth = dict(truth)
        self.console = console or Console(file=sys.stdout, width=LINE_WIDTH, highlight=False)
        self.seconds: list[float] = []

    def round_done(
        self,
        server_round: int,
        seconds: float,
        accuracy: float | None,
        used: Mapping[int, int] | None,
        num_clusters: int,
    ) -> None:
        """Print the line of ``server_round``.

        Parameters
        ----------
        server_round : int
            The round that ended (absolute).
        seconds : float
            Its wall-clock seconds.
        accuracy : float | None
            Its personalized accuracy (``None``: nobody was evaluated).
        used : Mapping[int, int] | None
            Node id -> the cluster the node used this round, if known.
        num_clusters : int
            Clusters in use (cluster models for a strategy that does not say).
        """
        self.seconds.append(seconds)
        left = (self.num_rounds - server_round) * sum(self.seconds) / len(self.seconds)
        ari = round_ari(self.truth, used) if used else None
        line = Table.grid(padding=(0, 1))
        line.add_row(
            f"round {server_round:>{len(str(self.num_rounds))}}/{self.num_rounds}",
            progress_bar(server_round, self.num_rounds),
            f"{format_seconds(left)} left",
            f"| {seconds:6.2f} s",
            f"| accuracy {'-' if accuracy is None else f'{accuracy:.4f}'}",
            f"| ARI {'-' if ari is None else f'{ari:.3f}'}",
            f"| clusters {num_clusters}",
        )
        self.console.print(line)
