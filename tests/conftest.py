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


@pytest.fixture
def canaries_of_another_q():
    """A function that writes into a model directory a DP record of q = 0.05 (sigma 1, 100
    steps) whose 2,000 gradient canaries ran q = 0.1: a trainer whose accounting is not of its
    run. Returns the record."""
    import numpy as np

    from dpaudit.accounting import DpRecord
    from dpaudit.audit.gradient_canaries import GradientCanaryRecord
    from dpaudit.stages.artifacts import write_training
    from dpaudit.train.record import TrainingRecord

    def write(model_dir):
        rng = np.random.default_rng(1)
        m, steps = 2000, 100
        included = rng.random(m) < 0.5
        inclusions = rng.binomial(steps, 0.1, size=m) * included
        canaries = GradientCanaryRecord(included=included, scores=inclusions + rng.normal(0, 10, size=m),
                                        inclusions=inclusions, steps=steps, sample_rate=0.1, max_grad_norm=1.0)
        record = DpRecord.dpsgd(trainer="plugin", noise_multiplier=1.0, sample_rate=0.05, steps=steps, delta=1e-5,
                                max_grad_norm=1.0, unit="user", num_units=2000, expected_batch_size=100)
        model_dir.mkdir(parents=True, exist_ok=True)
        write_training(model_dir, TrainingRecord(dp=record, gradient_canaries=canaries))
        return record

    return write
