"""Split a data set over clients that fall into ground-truth groups.

Two independent choices define a federation:

* how samples go to clients: IID (``dirichlet_alpha == 0``, flwr-datasets' IID
  shards cut in one call) or label skew drawn from Dirichlet(``dirichlet_alpha``)
  with flwr-datasets' partitioner (:mod:`fl_clusters.data.sampling`);
* how groups differ (``structure``): client ``i`` belongs to group
  ``i % num_groups`` and the group decides a transform of its images or labels
  (:mod:`fl_clusters.data.groups`).

Each client's held-out test split is drawn from its own samples by index, before any
transform, so it is disjoint from its train split and follows the same distribution.

By default the groups share one copy of the data set, each client getting a disjoint
part of it. With ``copy_per_group`` every group (or mixture source) gets its own
transformed copy of the whole data set, as in IFCA's rotated MNIST (k x the samples):
then which samples are held out is decided once per sample of the data set, so that no
image is trained on in one group and tested on in another.

:class:`~fl_clusters.data.spec.PartitionSpec` lists and explains every keyword
argument of :func:`partition_dataset` and :func:`load_client_data`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from fl_clusters.data.client_data import ClientData, materialize
from fl_clusters.data.loaders import ImageDataset, load_dataset
from fl_clusters.data.plan import Plan, plan_partition
from fl_clusters.data.spec import PartitionSpec, check_int
from fl_clusters.errors import FederationProblem


def partition_dataset(
    dataset: ImageDataset, num_clients: int, **settings: Any
) -> list[ClientData]:
    """Split ``dataset`` over ``num_clients`` clients with a ground-truth group structure.

    Parameters
    ----------
    dataset : ImageDataset
        The whole data set, e.g. from :func:`~fl_clusters.data.load_dataset`.
    num_clients : int
        Number of clients, at least 1 and at most ``len(dataset.y) // 10`` (times
        ``num_groups`` with ``copy_per_group`` in a hard structure), unless
        ``samples_per_client`` sizes the clients; with ``natural_ids`` the number of
        users.
    **settings : Any
        The fields of :class:`~fl_clusters.data.spec.PartitionSpec` (``structure``,
        ``num_groups``, ``dirichlet_alpha``, ``seed``...); the others keep their
        defaults.

    Returns
    -------
    list[ClientData]
        One entry per client, in client-id order. Same arguments give identical
        arrays.

    Raises
    ------
    ValueError
        For an argument outside its allowed values or a data set too small for
        ``num_clients``.
    TypeError
        For a keyword that is not a field of ``PartitionSpec``.
    """
    plan = plan_partition(dataset, num_clients, PartitionSpec(**settings))
    return [materialize(dataset, plan, client) for client in range(num_clients)]


def load_client_data(
    dataset_name: str,
    data_root: str | None,
    partition_id: int,
    num_partitions: int,
    *,
    download: bool = False,
    **partition_kwargs: Any,
) -> ClientData:
    """One client's part of a partition, with data and split computed once per process.

    Parameters
    ----------
    dataset_name : str
        Passed to :func:`~fl_clusters.data.load_dataset`.
    data_root : str | None
        Passed to :func:`~fl_clusters.data.load_dataset`.
    partition_id : int
        This client's id, in ``[0, num_partitions)``.
    num_partitions : int
        Number of clients of the federation.
    download : bool
        Passed to :func:`~fl_clusters.data.load_dataset`.
    **partition_kwargs : Any
        Keyword arguments of :func:`partition_dataset` (``structure``, ``seed``...).

    Returns
    -------
    ClientData
        Equal to ``partition_dataset(...)[partition_id]``.

    Raises
    ------
    ValueError
        For a ``partition_id`` outside ``[0, num_partitions)`` or any error of
        :func:`partition_dataset` or :func:`~fl_clusters.data.load_dataset`.
    """
    check_int("num_partitions", num_partitions, minimum=1)
    check_int("partition_id", partition_id, minimum=0)
    if partition_id >= num_partitions:
        raise ValueError(
            f"partition_id={partition_id} is outside [0, {num_partitions - 1}] for "
            f"num_partitions={num_partitions}"
        )
    dataset = load_dataset(dataset_name, data_root, download=download)
    # Only the index plan of the whole federation is cached: a process that hosts a
    # few clients then holds their pixels, not a transformed copy of the data set.
    plan = cached_plan(
        dataset_name,
        data_root or None,
        download,
        num_partitions,
        tuple(sorted(partition_kwargs.items())),
    )
    return materialize(dataset, plan, partition_id)


def cached_plan(
    dataset_name: str,
    data_root: str | None,
    download: bool,
    num_clients: int,
    partition_kwargs: tuple[tuple[str, Any], ...],
) -> Plan:
    """The plan of a whole federation, kept for the process's next clients.

    Raises
    ------
    FederationProblem
        A ``ValueError``: the plan cannot be made (a client without a test
        sample...). Kept too, so that the process's next clients get the error at
        once instead of computing the whole plan again (a Dirichlet split, one
        partitioner call a client, takes some 40 s at 10,000 clients); every node
        of the federation shares it.
    """
    plan = _plan_or_problem(dataset_name, data_root, download, num_clients, partition_kwargs)
    if isinstance(plan, str):
        raise FederationProblem(plan)
    return plan


@lru_cache(maxsize=4)
def _plan_or_problem(
    dataset_name: str,
    data_root: str | None,
    download: bool,
    num_clients: int,
    partition_kwargs: tuple[tuple[str, Any], ...],
) -> Plan | str:
    """:func:`cached_plan`'s plan, or why it cannot be made."""
    dataset = load_dataset(dataset_name, data_root, download=download)
    try:
        return plan_partition(dataset, num_clients, PartitionSpec(**dict(partition_kwargs)))
    except ValueError as err:
        return str(err)
