"""Batch samplers over protected units, and the seeds that drive a training run.

:class:`PoissonSampler` is the sampler that DP-SGD's accounting assumes (Abadi et al. 2016):
at every step each of the N units is in the batch independently with probability q, so
the realised batch size is Binomial(N, q) and may be zero. :class:`ShuffleSampler` is the
usual non-private scheme: epochs of random permutations cut into batches of exactly B
units (the permutations run on across epoch boundaries, so no batch is short).

Both draw from a seeded ``numpy.random.Generator`` (reproducible mode) or from
:class:`OSRandom`, the operating system's CSPRNG (secure mode, the default of DP-SGD), and
never touch global RNG state.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from dpaudit.errors import InputError
from dpaudit.seeds import seed_sequence


@dataclass(frozen=True)
class RunSeeds:
    """The independent random streams of one training run, split from the run seed with
    ``numpy.random.SeedSequence(seed).spawn``: model initialisation, batch sampling,
    DP noise, and everything else torch draws during training (dropout)."""

    seed: int
    model: int
    sampler: np.random.SeedSequence
    noise: int
    torch: int

    @classmethod
    def from_seed(cls, seed: int) -> "RunSeeds":
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InputError(f"seed must be a non-negative integer, got {seed!r}")
        model, sampler, noise, other = (seed_sequence(int(seed), i) for i in range(4))
        return cls(
            seed=int(seed),
            model=int(model.generate_state(1, np.uint32)[0]),
            sampler=sampler,
            noise=int(noise.generate_state(1, np.uint64)[0] >> 1),
            torch=int(other.generate_state(1, np.uint64)[0] >> 1),
        )

    def numpy_generator(self) -> np.random.Generator:
        return np.random.default_rng(self.sampler)

    def noise_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        generator = torch.Generator(device=device)
        generator.manual_seed(self.noise)
        return generator

    def to_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "model": self.model, "noise": self.noise, "torch": self.torch}


class OSRandom:
    """Uniform draws straight from the operating system's cryptographically secure generator
    (``os.urandom``): nothing is seeded, so nothing recorded can replay the draws. It offers
    the two ``numpy.random.Generator`` methods the samplers use. Secure mode of DP-SGD
    samples its Poisson batches from it (as Opacus' ``secure_mode`` does with torchcsprng)."""

    def random(self, size: int) -> np.ndarray:
        """``size`` floats uniform on [0, 1), each from 53 random bits."""
        raw = np.frombuffer(os.urandom(8 * int(size)), dtype=np.uint64)
        return (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of ``range(n)`` (the order of 53-bit random keys)."""
        return np.argsort(self.random(n), kind="stable")


class SecureGenerator(torch.Generator):
    """A ``torch.Generator`` for secure mode whose :meth:`standard_normal` draws come from the
    operating system's CSPRNG (``os.urandom``, Box-Muller on 53-bit uniforms), so the DP noise
    can be neither replayed nor predicted from earlier draws. Code that passes it to
    ``torch.randn`` instead gets torch's generator, which the loop re-seeds from the OS at
    every step (:func:`os_seed`)."""

    def standard_normal(self, shape, *, device=None, dtype=torch.float32) -> torch.Tensor:
        """``N(0, 1)`` draws of ``shape``, made on the CPU in float64 and moved to ``device``."""
        n = math.prod(shape)
        pairs = (n + 1) // 2
        u = OSRandom().random(2 * pairs).reshape(2, pairs)  # uniform on [0, 1)
        radius = np.sqrt(-2.0 * np.log1p(-u[0]))  # 1 - u is in (0, 1]: never log(0)
        angle = 2.0 * np.pi * u[1]
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]
        return torch.from_numpy(z).reshape(shape).to(device=device, dtype=dtype)


def os_seed() -> int:
    """A fresh 63-bit seed from the operating system's CSPRNG; secure mode re-seeds the
    noise generator with one at every step and records none of them."""
    return int.from_bytes(os.urandom(8), "little") >> 1


class PoissonSampler:
    """Each of ``num_units`` units joins each batch independently with probability
    ``sample_rate``. Yields sorted arrays of unit indices; empty arrays do occur."""

    kind = "poisson"

    def __init__(self, *, num_units: int, sample_rate: float, generator: np.random.Generator | OSRandom):
        if num_units < 1:
            raise InputError("cannot sample from an empty set of units")
        if not 0 < sample_rate <= 1:
            raise InputError(f"sampling rate q must be in (0, 1], got {sample_rate!r}")
        self.num_units = num_units
        self.sample_rate = float(sample_rate)
        self.generator = generator

    def sample(self) -> np.ndarray:
        return np.flatnonzero(self.generator.random(self.num_units) < self.sample_rate)


class ShuffleSampler:
    """Batches of exactly ``batch_size`` units taken in order from a stream of random
    permutations of the units (a new permutation starts where the last one ended)."""

    kind = "shuffle"

    def __init__(self, *, num_units: int, batch_size: int, generator: np.random.Generator | OSRandom):
        if num_units < 1:
            raise InputError("cannot sample from an empty set of units")
        if batch_size < 1:
            raise InputError(f"batch size must be positive, got {batch_size}")
        self.num_units = num_units
        self.batch_size = batch_size
        self.generator = generator
        self._buffer = np.empty(0, dtype=np.int64)

    def sample(self) -> np.ndarray:
        while len(self._buffer) < self.batch_size:
            self._buffer = np.concatenate([self._buffer, self.generator.permutation(self.num_units)])
        batch, self._buffer = self._buffer[: self.batch_size], self._buffer[self.batch_size :]
        return np.sort(batch)
