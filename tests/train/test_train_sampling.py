"""Samplers, seeds and the training checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.train import checks
from dpaudit.train.sampling import PoissonSampler, RunSeeds, ShuffleSampler


def test_poisson_batch_sizes_are_binomial():
    n, q, steps = 200, 0.05, 4000
    sampler = PoissonSampler(num_units=n, sample_rate=q, generator=np.random.default_rng(0))
    batches = [sampler.sample() for _ in range(steps)]
    sizes = np.array([len(b) for b in batches])
    assert sizes.mean() == pytest.approx(n * q, abs=4 * np.sqrt(n * q * (1 - q) / steps))
    assert sizes.var(ddof=1) == pytest.approx(n * q * (1 - q), rel=0.1)
    assert all(np.all(np.diff(b) > 0) for b in batches)  # sorted, no duplicates
    counts = np.bincount(np.concatenate(batches), minlength=n) / steps
    assert counts.mean() == pytest.approx(q, rel=0.02)
    report = checks.batch_size_check(sizes, num_units=n, sample_rate=q)
    assert report["consistent"] is True and report["mean_p_value"] > 1e-3


def test_poisson_has_empty_batches_at_low_rate():
    sampler = PoissonSampler(num_units=10, sample_rate=0.05, generator=np.random.default_rng(1))
    assert any(len(sampler.sample()) == 0 for _ in range(200))


def test_shuffle_sampler_epochs_and_check():
    sampler = ShuffleSampler(num_units=10, batch_size=4, generator=np.random.default_rng(0))
    batches = [sampler.sample() for _ in range(5)]  # 20 draws = exactly two epochs
    assert all(len(b) == 4 for b in batches)
    assert sorted(np.concatenate(batches).tolist()) == sorted(list(range(10)) * 2)
    sizes = [4] * 100
    report = checks.batch_size_check(sizes, num_units=10, sample_rate=0.4)
    assert report["consistent"] is False and report["variance_p_value"] < 1e-6


def test_samplers_are_seeded_and_independent_of_global_state():
    seeds = RunSeeds.from_seed(7)
    np.random.seed(0)
    a = [PoissonSampler(num_units=50, sample_rate=0.2, generator=seeds.numpy_generator()).sample() for _ in range(3)]
    np.random.seed(1)
    torch.manual_seed(5)
    b = [PoissonSampler(num_units=50, sample_rate=0.2, generator=seeds.numpy_generator()).sample() for _ in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    g1, g2 = seeds.noise_generator(), RunSeeds.from_seed(7).noise_generator()
    assert torch.equal(torch.randn(5, generator=g1), torch.randn(5, generator=g2))
    other = RunSeeds.from_seed(8)
    assert other.noise != seeds.noise and other.model != seeds.model
    assert len({seeds.model, seeds.noise, seeds.torch}) == 3


def test_bad_sampler_input():
    with pytest.raises(InputError, match=r"q must be in \(0, 1\]"):
        PoissonSampler(num_units=10, sample_rate=1.5, generator=np.random.default_rng(0))
    with pytest.raises(InputError, match=r"q must be in \(0, 1\]"):
        PoissonSampler(num_units=10, sample_rate=0.0, generator=np.random.default_rng(0))
    with pytest.raises(InputError):
        RunSeeds.from_seed(-1)


def test_full_batch_rate_one():
    report = checks.batch_size_check([10] * 5, num_units=10, sample_rate=1.0)
    assert report["consistent"] is True
    report = checks.batch_size_check([10, 9, 10], num_units=10, sample_rate=1.0)
    assert report["consistent"] is False and report["mean_z"] is None


def test_parameter_and_summary_checks():
    params = {"a": torch.nn.Parameter(torch.zeros(3)), "b": torch.nn.Parameter(torch.ones(2))}
    before = checks.snapshot(params)
    with torch.no_grad():
        params["a"][0] = 1.0
    moved = checks.parameters_moved(before, params)
    assert moved == {"num_trainable": 2, "not_moved": ["b"], "all_moved": False}
    summary = checks.summarize(
        batch_sizes={"consistent": True}, moved=moved, nonfinite={"updates": 0}, sampler="poisson"
    )
    assert summary["ok"] is False
    summary = checks.summarize(
        batch_sizes={"consistent": None}, moved={"all_moved": True}, nonfinite={"updates": 0}, sampler="shuffle"
    )
    assert summary["ok"] is True
