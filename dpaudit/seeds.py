"""The one seed derivation: every random stream of a run is a child of its run seed.

A child is ``numpy.random.SeedSequence(entropy, spawn_key=key)``, which is what
``SeedSequence(entropy).spawn(n)[i]`` gives for ``key = (i,)``: the children never overlap
one another or their parent. ``entropy`` is the run seed (or a list of integers), ``key`` a
path of non-negative integers; :func:`name_key` turns a name into one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def seed_sequence(entropy: int | Sequence[int], *key: int) -> np.random.SeedSequence:
    """``SeedSequence(entropy, spawn_key=key)``."""
    return np.random.SeedSequence(entropy, spawn_key=tuple(int(k) for k in key))


def derive_seed(entropy: int | Sequence[int], *key: int) -> int:
    """A 32-bit integer seed (which every seeding API accepts) of the child ``key`` of ``entropy``."""
    return int(seed_sequence(entropy, *key).generate_state(1, np.uint32)[0])


def generator(entropy: int | Sequence[int], *key: int) -> np.random.Generator:
    """A NumPy ``Generator`` on the child ``key`` of ``entropy``."""
    return np.random.default_rng(seed_sequence(entropy, *key))


def name_key(name: str) -> int:
    """A 32-bit key for a name (the first four bytes of its SHA-256, little-endian)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
