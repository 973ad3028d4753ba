"""Read cluster models back out of a strategy's result."""

from __future__ import annotations

from flwr.app import ArrayRecord
from flwr.serverapp.strategy import Result

from fl_clusters.protocol import unpack_clusters


def cluster_models(result: Result | ArrayRecord) -> list[ArrayRecord]:
    """The k cluster models (full models, shared layers included) of a finished run.

    Parameters
    ----------
    result : Result | ArrayRecord
        What ``strategy.start(...)`` returned, or its ``arrays``. A FedAvg result
        gives a list of one model.
    """
    arrays = result.arrays if isinstance(result, Result) else result
    if len(arrays) == 0:
        raise ValueError("the result holds no arrays: no round produced an aggregate")
    return unpack_clusters(arrays)
