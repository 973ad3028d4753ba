"""How much a checkpoint may make its reader allocate, and how deep its tree may go.

A checkpoint is read whole into memory before anything in it is trusted, so a
file could otherwise exhaust the machine that resumes from it: a small zip that
declares gigabytes, an array header that declares 10**12 values, a tree nested
past Python's recursion limit. :class:`CheckpointLimits` bounds each; its
defaults hold every checkpoint fl-clusters writes with room to spare.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB, MIB = 1 << 30, 1 << 20


@dataclass(frozen=True)
class CheckpointLimits:
    """The most a checkpoint file may declare, each checked before it is allocated.

    Parameters
    ----------
    max_bytes : int
        The declared size of all parts together (the archive, its ``arrays.npz``
        and the arrays in it). 4 GiB by default: the largest checkpoint a run
        writes is FedSoft's, one CNN (about 2.2 MB of float32) kept per client,
        about 2.2 GB for 1000 clients.
    max_state_bytes : int
        The size of ``state.json``. 256 MiB by default: it holds no array, and
        its largest part, the assignment history (rounds x nodes), is about
        30 MB for 1000 rounds of 1000 nodes; Python objects built from JSON take
        several times its size in memory.
    max_depth : int
        How deeply the state tree may nest. 64 by default: a strategy's state
        nests about 7 deep as built, and Python's recursion limit (1000) is far away.
    """

    max_bytes: int = 4 * GIB
    max_state_bytes: int = 256 * MIB
    max_depth: int = 64
