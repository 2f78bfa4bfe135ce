"""TensorBoard event files of a run, beside its ``metrics.jsonl`` (``TrainConfig.tensorboard``).

Rank 0 writes them, from the same records as ``metrics.jsonl``: what TensorBoard shows is
what the JSONL says. ``torch.utils.tensorboard`` (and the ``tensorboard`` package under it)
is imported by :class:`TensorBoardLog` only, which the trainer creates only when the
option is on; off, the trainer does not even import this module.

Replayed steps: a resumed process and a rollback replay steps already written. Each
process opens its writer with ``purge_step`` at its first step, and a rollback writes the
same marker (a session start) at the first step trained again, so TensorBoard drops the
earlier events from that step on: a plot shows each step once, with the values of the last
record of that step, as :func:`training.metrics.last_per_step` does. The writer flushes at
every checkpoint step: a process killed later loses only events of steps it will train again.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from training.errors import TrainingError

TRAIN_SCALARS = {  # metrics.jsonl key of a train record -> TensorBoard tag
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "mfu": "perf/mfu",
    "data_wait_ms": "perf/data_wait_ms",
    "ckpt_stall_ms": "perf/ckpt_stall_ms",
    "eval_ms": "perf/eval_ms",
}
EVAL_LOSS = "eval/loss"
EVAL_LOSS_OF_SOURCE = "eval/loss/{}"
_MISSING = (
    "tensorboard is on (--tensorboard, or tensorboard: true in the train config) but the tensorboard "
    "package is not installed: pip install tensorboard (or pip install 'tokenlake[tensorboard]'), or turn it off"
)


def require_tensorboard() -> None:
    """Fail fast, in one sentence, where the option is on and the package is missing (found
    without importing it: the CLI and the flow check before anything starts)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise TrainingError(_MISSING)


class TensorBoardLog:
    """Metrics records as TensorBoard scalars, each at its step."""

    def __init__(self, log_dir: Path, first_step: int):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        # purge_step: events of earlier processes from this step on are dropped (steps replayed
        # after a resume, or after a start from no checkpoint at all)
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=first_step + 1)

    def _purge_from(self, step: int) -> None:
        """What the writer's ``purge_step`` writes at its start, in the same file: a session start
        at ``step``, after which readers drop the events written before it from that step on."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))

    def write(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "train":
            for key, tag in TRAIN_SCALARS.items():
                if record.get(key) is not None:
                    self._writer.add_scalar(tag, record[key], record["step"])
            if "ckpt_stall_ms" in record:  # a checkpoint step: a crash from now on replays only later steps
                self._writer.flush()
        elif kind == "eval":
            self._writer.add_scalar(EVAL_LOSS, record["eval_loss"], record["step"])
            for name, loss in record.get("eval_loss_by_source", {}).items():
                self._writer.add_scalar(EVAL_LOSS_OF_SOURCE.format(name), loss, record["step"])
        elif kind == "rollback":  # the steps after the checkpoint gone back to are trained again
            self._purge_from(record["to_step"] + 1)

    def close(self) -> None:
        self._writer.close()
