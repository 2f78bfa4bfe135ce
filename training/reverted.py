"""The trainer's refusal of data that a rollback of ``main`` reverted (the verdict is the rule of
``formats/rollbacks.py``), applied at every start: a direct ``python -m training``, a retry and a
torchrun restart are checked against the rollbacks recorded by then, not only the train flow."""

from __future__ import annotations

from formats.rollbacks import RecordedRollbacks, Reverted
from training.errors import TrainingError
from versioning import DataRepo

ALLOW_FLAG = "--allow-reverted"


class RevertedDataRefused(TrainingError, ValueError):
    """Training on data a rollback reverted, without ``allow_reverted``.

    The message names the rollback and the version main holds now. The class is a
    ``TrainingError`` for the trainer and a ``ValueError`` for the ``tokenlake`` CLI: both print
    it as one sentence."""


def check_training_data(repo: DataRepo, commit_id: str, allow_reverted: bool) -> Reverted | None:
    """The verdict on the data commit a run is about to train on; refuses a reverted one unless allowed."""
    rollbacks = RecordedRollbacks.read(repo)
    verdict = rollbacks.verdict(commit_id)
    if verdict is not None and not allow_reverted:
        raise RevertedDataRefused(
            f"data commit {rollbacks.dataset_name(verdict.data_commit)} was reverted by {verdict.rollback}, "
            f"and main holds {rollbacks.main_holds()} now: train on main, or pass {ALLOW_FLAG} to train on "
            "the reverted data on purpose (the choice is recorded in the run's lineage)"
        )
    return verdict
