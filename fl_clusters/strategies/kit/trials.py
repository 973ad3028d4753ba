"""Trial federations: training and validation messages outside the round loop.

A strategy that decides its clusters by trying them (ACFL: a candidate joins a
cluster when a trial federation of the two pays) subclasses
:class:`TrialFederations` beside its base class. It trains local-only models
once per node, scores models on each member's validation split, and runs one
trial of a :class:`~fl_clusters.clustering.GreedyIncentiveClustering` at a time,
counting every message it sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.clustering import GreedyIncentiveClustering
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.replies import average_replies, epochs_done


class TrialFederations(ClusteredStrategy):
    """Trial federations of groups of nodes, each scored on its members' validation splits.

    The strategy sets the attributes below (its ``trial_epochs`` parameter, its
    ``trial_from_local_models`` rule, the counters its summary reports) and calls
    :meth:`local_only_models` once, then :meth:`run_trials`. A node whose train
    handler trains fewer epochs a message than asked (an app's own ``train()``
    reads its run config's ``local-epochs``) and reports them
    (``local-epochs-done``) is asked again from its own model until it has
    trained ``trial_epochs``; a member silent in a validation round is asked once
    more, then left out of the incentive (gain 0), never scored 0.
    """

    trial_epochs: int
    trial_from_local_models: bool
    trial_evaluations: int
    trial_messages: int
    trial_train_messages: int
    trial_failed_members: int
    # Each node's validation size (the noise threshold needs it) and each trial's
    # incentive minus its threshold.
    _validation_sizes: dict[int, float]
    _trial_margins: list[float]
    # The start and config of the paper's trials, which train the group anew.
    _trial_start: ArrayRecord
    _trial_config: ConfigRecord

    def local_only_models(
        self, nodes: Sequence[int], model: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> tuple[dict[int, Message], dict[int, float]]:
        """Each node's model trained alone from ``model`` and its validation accuracy.

        The same training as a trial, for a group of one; ``model`` and ``config``
        are also where the paper's trials start.
        """
        self._trial_start, self._trial_config = model, config
        local_models = self._train_group(nodes, model, config, grid)
        local_acc = self._validation_accuracy(
            {node: msg.content.array_records[p.ARRAYS] for node, msg in local_models.items()},
            grid,
        )
        return local_models, local_acc

    def run_trials(
        self,
        clustering: GreedyIncentiveClustering,
        nodes: Sequence[int],
        local_models: dict[int, Message],
        local_acc: dict[int, float],
        grid: Grid,
    ) -> None:
        """Every trial ``clustering`` asks for, until each of ``nodes`` is placed."""
        while (group := clustering.next_trial()) is not None:
            members = [nodes[int(i)] for i in group]
            self._run_trial(clustering, members, local_models, local_acc, grid)

    def _run_trial(
        self,
        clustering: GreedyIncentiveClustering,
        members: list[int],
        local_models: dict[int, Message],
        local_acc: dict[int, float],
        grid: Grid,
    ) -> None:
        """Score one trial federation (a cluster plus its candidate) and report it.

        Its model is the members' local-only models averaged, or under the paper's
        rule (``trial_from_local_models`` False) a round of the group trained anew.
        """
        trial_model = (average_replies([local_models[n] for n in members])
                       if self.trial_from_local_models
                       else self._trial_federation(members, local_models, grid))
        global_acc = self._trial_accuracy(members, trial_model, grid)
        # A member with no score after a retry is left out of the incentive (gain 0):
        # scoring it 0 would read a lost message as a harmful federation.
        group_acc = np.array([global_acc.get(n, local_acc[n]) for n in members])
        own_acc = np.array([local_acc[n] for n in members])
        sizes = np.array([self._validation_sizes[n] for n in members])
        threshold = clustering.threshold_for(group_acc, own_acc, sizes)
        accepted = clustering.report(group_acc, own_acc, sizes)
        self.trial_evaluations += 1
        self._trial_margins.append(float((group_acc - own_acc).sum()) - threshold)
        # The candidate's own gain is logged apart: the sum can hide what
        # federating costs the newcomer when the group is large.
        log(INFO, "%s trial %d: group of %d, incentive %.3f (threshold %.3g; candidate's "
            "gain %.3f on %d samples): node %d %s", type(self).__name__,
            self.trial_evaluations, len(members),
            float((group_acc - own_acc).sum()), threshold,
            float(group_acc[-1] - own_acc[-1]), int(sizes[-1]), members[-1],
            "joins" if accepted else "is rejected")

    def _trial_federation(
        self, members: list[int], local_models: dict[int, Message], grid: Grid
    ) -> ArrayRecord:
        """The paper's trial: one round of the group from the phase-1 model, averaged.

        A member whose training fails counts in ``trial_failed_members`` and joins
        the average with its local-only model, trained the same way once before.
        """
        trained = self._train_group(members, self._trial_start, self._trial_config, grid)
        failed = [n for n in members if n not in trained]
        if failed:
            self.trial_failed_members += len(failed)
            log(WARNING, "%s trial federation: nodes %s did not train; their local-only "
                "models stand in", type(self).__name__, failed)
        return average_replies([trained.get(n, local_models[n]) for n in members])

    def _train_group(
        self, nodes: Sequence[int], model: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> dict[int, Message]:
        """``trial_epochs`` epochs of training of ``model`` on each node; valid replies by node.

        An app's own train handler trains its run config's ``local-epochs`` whatever the
        message asks. A node whose reply says it trained fewer epochs than
        ``trial_epochs`` (``local-epochs-done``) trains again from its own last model,
        until its epochs reach ``trial_epochs`` (at most ``trial_epochs`` messages): the
        trial scores models trained as long as the parameter says, whatever the handler.
        A node that does not report its epochs keeps its one pass; one that fails a
        later pass keeps its last model.
        """
        trained = self._train_pass(dict.fromkeys(nodes, model), config, grid)
        epochs = {node: epochs_done(msg) for node, msg in trained.items()}
        passes = 1
        while passes < self.trial_epochs and (short := [
            n for n, done in epochs.items() if done is not None and done < self.trial_epochs
        ]):
            again = self._train_pass(
                {n: trained[n].content.array_records[p.ARRAYS] for n in short}, config, grid)
            passes += 1
            for node in short:
                done = epochs_done(again[node]) if node in again else None
                if done:
                    epochs[node] += done  # type: ignore[operator]
                    trained[node] = again[node]
                else:
                    # A failed or unreported pass: the node keeps its last model.
                    epochs[node] = None
        if passes > 1:
            reached = [e for e in epochs.values() if e is not None]
            log(INFO if all(e >= self.trial_epochs for e in reached) else WARNING,
                "%s: the nodes' train handler trains fewer than trial_epochs=%d epochs a "
                "message; %d messages a node took them to %s epochs", type(self).__name__,
                self.trial_epochs, passes,
                f"{min(reached):.3g}" if reached else "an unknown number of")
        return trained

    def _train_pass(
        self, models: dict[int, ArrayRecord], config: ConfigRecord, grid: Grid
    ) -> dict[int, Message]:
        """Each node trains its model of ``models`` once; the valid replies by node."""
        self.trial_train_messages += len(models)
        contents = {node: RecordDict({p.ARRAYS: m, p.CONFIG: config})
                    for node, m in models.items()}
        replies = self.send(grid, self.build_messages(contents, MessageType.TRAIN))
        reference = next(iter(models.values()))
        valid = self.check_replies(replies, reference, f"{type(self).__name__} trial",
                                   trains=False)
        return {m.metadata.src_node_id: m for m in valid}

    def _trial_accuracy(
        self, members: Sequence[int], model: ArrayRecord, grid: Grid
    ) -> dict[int, float]:
        """Each member's validation accuracy under ``model``; silent members are asked twice."""
        scores = self._validation_accuracy(dict.fromkeys(members, model), grid)
        missing = [n for n in members if n not in scores]
        if missing:
            scores.update(self._validation_accuracy(dict.fromkeys(missing, model), grid))
            failed = [n for n in missing if n not in scores]
            self.trial_failed_members += len(failed)
            if failed:
                log(WARNING, "%s trial: nodes %s gave no score after a retry; left out of "
                    "the incentive", type(self).__name__, failed)
        return scores

    def _validation_accuracy(
        self, models: dict[int, ArrayRecord], grid: Grid
    ) -> dict[int, float]:
        """Accuracy of each node's model on its validation split, for the nodes that answer."""
        config = ConfigRecord({p.CFG_SPLIT: "validation"})
        self.trial_messages += len(models)
        contents = {node: RecordDict({p.ARRAYS: m, p.CONFIG: config}) for node, m in models.items()}
        replies = self.send(grid, self.build_messages(contents, MessageType.EVALUATE))
        scores = {}
        for msg in self.check_replies(
            replies, None, f"{type(self).__name__} validation",
            {p.M_ACCURACY: p.EVALUATE_FIELDS[p.M_ACCURACY]},
            trains=False,
        ):
            metrics = msg.content.metric_records[p.METRICS]
            scores[msg.metadata.src_node_id] = float(metrics[p.M_ACCURACY])  # type: ignore[arg-type]
            # The same split every time: the noise threshold needs its size.
            self._validation_sizes[msg.metadata.src_node_id] = float(
                metrics[p.M_NUM_EXAMPLES]  # type: ignore[arg-type]
            )
        missing = sorted(set(models) - set(scores))
        if missing:
            log(WARNING, "%s: nodes %s gave no validation accuracy", type(self).__name__, missing)
        return scores
