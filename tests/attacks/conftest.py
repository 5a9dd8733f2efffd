"""Fixtures shared by the attack, signal and extraction tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread; on a shared 2-core box a 2-thread pool
    stalls on every small op whenever another process holds a core."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
