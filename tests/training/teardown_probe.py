"""``python -m training`` with a probe: when the process group is destroyed, how many DDP
wrappers are still alive in this process (written to ``$TEARDOWN_PROBE.rank<N>``).

A DDP wrapper alive at that moment holds the group through its C++ reducer, and the group's
destructor then runs when the wrapper is freed, under the GIL: a hang at exit when a gloo
worker thread needs the GIL to finish (see ``Trainer.close``).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

from torch.nn.parallel import DistributedDataParallel

import training.trainer as trainer_module
from training.__main__ import main

_destroy = trainer_module.close_distributed


def _probed_close_distributed() -> None:
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    Path(f"{os.environ['TEARDOWN_PROBE']}.rank{os.environ['RANK']}").write_text(str(alive))
    _destroy()


trainer_module.close_distributed = _probed_close_distributed
sys.exit(main(sys.argv[1:]))
