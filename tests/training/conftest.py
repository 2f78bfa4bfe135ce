"""Training tests run CPU kernels on one thread, as torchrun's workers do: on a shared machine
extra intra-op threads only contend, and exactness needs the same thread count in every run."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
