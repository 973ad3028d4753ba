"""summary.json's ``attack`` section: who attacked, and what it did to the honest clients.

The attackers are the ones the run config's rule names
(:func:`fl_clusters.attacks.settings_attackers`, the function the nodes call),
over the federation's partitions; the scores are the final report's, split into
honest clients and attackers, and the final clusters' make-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log

from fl_clusters import protocol as p
from fl_clusters.attacks import NONE, settings_attackers


def num_partitions(rows: Sequence[Mapping[str, Any]]) -> int:
    """The federation's partitions: what the nodes report (``num-partitions``), else
    one more than the largest partition id reported."""
    told = [int(r["num-partitions"]) for r in rows if "num-partitions" in r]
    if told:
        return max(told)
    return max((int(r["partition-id"]) for r in rows if "partition-id" in r), default=-1) + 1


def _mean(values: np.ndarray, weights: np.ndarray, mask: np.ndarray) -> float | None:
    """The ``weights``-weighted mean of ``values`` where ``mask`` (and a weight) is; else None."""
    keep = mask & (weights > 0)
    return float(np.average(values[keep], weights=weights[keep])) if keep.any() else None


def membership(attacker: np.ndarray, assigned: np.ndarray) -> dict[str, Any]:
    """The final clusters' attackers and honest clients, and how the attackers sit in them.

    Returns
    -------
    dict[str, Any]
        ``clusters``: for each cluster used, its ``attackers`` and ``honest``
        clients; ``attackers_isolated``: share of the attackers in clusters with no
        honest client; ``honest_clients_with_attackers``: share of the honest
        clients whose cluster has an attacker (each ``None`` without such clients).
    """
    clusters = [{"cluster": int(j), "attackers": int(np.sum(attacker & (assigned == j))),
                 "honest": int(np.sum(~attacker & (assigned == j)))}
                for j in np.unique(assigned)]
    no_honest = {c["cluster"] for c in clusters if c["honest"] == 0}
    with_attackers = {c["cluster"] for c in clusters if c["attackers"] > 0}
    isolated = [int(j) in no_honest for j in assigned[attacker]]
    exposed = [int(j) in with_attackers for j in assigned[~attacker]]
    return {
        "clusters": clusters,
        "attackers_isolated": float(np.mean(isolated)) if isolated else None,
        "honest_clients_with_attackers": float(np.mean(exposed)) if exposed else None,
    }


def backdoor_scores(rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Each node's backdoor success on the model its personalized accuracy scores, and
    the number of inputs it was measured on (0 where the node reported none).

    The node's own kept model when it has one (``local-backdoor-success``), else its
    cluster's; a mixture's (FedEM) is scored on its cluster's model.
    """
    success, inputs = np.zeros(len(rows)), np.zeros(len(rows))
    for i, row in enumerate(rows):
        if "backdoor-inputs" not in row:
            continue
        scores = row.get(p.M_BACKDOOR_SUCCESS, [])
        value = row.get("local-backdoor-success",
                        scores[row["assigned"]] if row["assigned"] < len(scores) else None)
        if value is not None:
            success[i], inputs[i] = float(value), float(row["backdoor-inputs"])
    return success, inputs


def attack_fields(
    settings: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], personal: Sequence[float]
) -> dict[str, Any]:
    """summary.json's ``attack`` entry: ``None`` for a run without attack clients.

    Parameters
    ----------
    settings : Mapping[str, Any]
        The run's validated run config (a plug-in app's summary has no ``attack``).
    rows : Sequence[Mapping[str, Any]]
        The usable final reports (``partition-id``, ``assigned``, ``num-test``...).
    personal : Sequence[float]
        Each row's personalized accuracy, as summary.json's ``per_client_accuracy``.
    """
    kind = settings.get("attack", NONE)
    if kind == NONE:
        return {"attack": None}
    total = num_partitions(rows)
    attackers = settings_attackers(settings, total)
    attacker = np.array([r.get("partition-id", -1) in attackers for r in rows], dtype=bool)
    told = np.array([bool(r.get("attacker", a)) for r, a in zip(rows, attacker, strict=True)])
    if np.any(told != attacker):
        log(WARNING, "attack: the nodes' own roles differ from the rule's for partitions %s",
            [r.get("partition-id") for r, t, a in zip(rows, told, attacker, strict=True)
             if t != a])
    num_test = np.array([float(r["num-test"]) for r in rows])
    accuracy = np.asarray(personal, dtype=float)
    success, inputs = backdoor_scores(rows)
    log(INFO, "attack %r: partitions %s of %d attacked", kind, attackers, total)
    if not attackers:
        log(WARNING, "attack %r: attack-share=%s of the pool rounds to no attacker",
            kind, settings["attack-share"])
    return {"attack": {
        "kind": kind, "share": settings["attack-share"], "group": settings["attack-group"],
        "scale": settings["attack-scale"], "target": settings["attack-target"],
        "num_partitions": total, "attackers": attackers,
        "honest_personalized_accuracy": _mean(accuracy, num_test, ~attacker),
        "attacker_personalized_accuracy": _mean(accuracy, num_test, attacker),
        "honest_backdoor_success": _mean(success, inputs, ~attacker) if kind == "backdoor"
        else None,
        **membership(attacker, np.array([int(r["assigned"]) for r in rows], dtype=int)),
    }}
