"""Process-group setup and the few collectives the trainer uses.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) a process group is started: NCCL on CUDA,
one device per local rank, gloo on CPU. A machine with fewer CUDA devices than local ranks
is refused with a sentence saying what to do, rather than failing on ``cuda:1`` somewhere
inside NCCL; ``device="cpu"`` runs on the CPU with gloo wherever CUDA is. Without it (a plain ``python -m training`` or an in-process call) the
trainer is one process and every collective here is the identity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a tensor over ranks (every rank gets it)."""
        if self.active:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.active:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def elastic_restart_count() -> int:
    """How many times torchrun's agents have restarted this job's workers (0 on the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def use_cuda(preference: str = "auto") -> bool:
    """Whether a process with this device preference ("auto", "cuda" or "cpu") trains on CUDA."""
    if preference == "cpu":
        return False
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device 'cuda' was asked for, but PyTorch sees no CUDA device here; use device 'auto' or 'cpu'"
        )
    return torch.cuda.is_available()


def init_distributed(preference: str = "auto") -> DistContext:
    cuda = use_cuda(preference)
    if "RANK" not in os.environ:
        return DistContext(0, 1, 0, torch.device("cuda" if cuda else "cpu"))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        available = torch.cuda.device_count()
        if local_rank >= available:
            local_world = os.environ.get("LOCAL_WORLD_SIZE", "?")
            raise RuntimeError(
                f"local rank {local_rank} of {local_world} needs cuda:{local_rank}, but this machine has "
                f"{available} CUDA device(s): start at most {available} process(es) per node, or train on "
                "the CPU (device 'cpu')"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return DistContext(rank, world_size, local_rank, device)


def close_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
