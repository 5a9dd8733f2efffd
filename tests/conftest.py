"""Shared fixtures: tests run offline, on the CPU, with few threads."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module (restored after): tiny models run fastest on one thread,
    and on a shared 2-core box a 2-thread pool stalls on every small op whenever another
    process holds a core."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def own_tmp():
    """A temporary directory of the test's own, for tests that take minutes: pytest prunes
    old base temp directories, which other pytest sessions on a shared machine may do while
    such a test runs."""
    path = Path(tempfile.mkdtemp(prefix="dpaudit-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
