"""``torchrun`` (``python -m torch.distributed.run``), except when the workers refused the run.

A worker that stops on a :class:`training.errors.TrainingError` prints its sentence
(``training: error: ...``) and exits with :data:`training.errors.REFUSED_EXIT`. torchrun then
raises ``ChildFailedError`` out of its ``main``, and Python prints the launcher's traceback and
its failure report: 40 lines that read as a crash, after the one line that says what to change.
Here, when every failed worker exited that way, the launcher says so in one line and exits
with the same status; any other failure (a crash, a kill) keeps torchrun's report and exit.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main

from training.errors import REFUSED_EXIT


def main(argv: list[str] | None = None) -> int:
    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        if {failure.exitcode for failure in exc.failures.values()} != {REFUSED_EXIT}:
            raise
        ranks = ", ".join(str(rank) for rank in sorted(exc.failures))
        print(f"torchrun: {exc.name} refused the run (rank {ranks}: see its 'training: error:' line)",
              file=sys.stderr, flush=True)  # fmt: skip
        return REFUSED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
