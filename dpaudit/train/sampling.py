"""Batch samplers over protected units, and the seeds that drive a training run.

:class:`PoissonSampler` is the sampler that DP-SGD's accounting assumes (Abadi et al. 2016):
at every step each of the N units is in the batch independently with probability q, so
the realised batch size is Binomial(N, q) and may be zero. :class:`ShuffleSampler` is the
usual non-private scheme: epochs of random permutations cut into batches of exactly B
units (the permutations run on across epoch boundaries, so no batch is short).

Both draw from a seeded ``numpy.random.Generator`` (reproducible mode) or from
:class:`SecureRandom`, a ChaCha20 keystream keyed from the operating system's CSPRNG (secure
mode, the default of DP-SGD), and never touch global RNG state.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from dpaudit.devices import to_device
from dpaudit.errors import InputError
from dpaudit.seeds import seed_sequence
from dpaudit.train import chacha


@dataclass(frozen=True)
class RunSeeds:
    """The independent random streams of one training run, split from the run seed with
    ``numpy.random.SeedSequence(seed).spawn``: model initialisation, batch sampling,
    DP noise, everything else torch draws during training (dropout), and the gradient
    canaries' draws and noise (:mod:`dpaudit.train.gradient_canaries`: two children of the
    fifth child, so that the first four streams are those of a run without canaries)."""

    seed: int
    model: int
    sampler: np.random.SeedSequence
    noise: int
    torch: int
    canaries: np.random.SeedSequence
    canary_noise: int

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
            canaries=seed_sequence(int(seed), 4, 0),
            canary_noise=int(seed_sequence(int(seed), 4, 1).generate_state(1, np.uint64)[0] >> 1),
        )

    def numpy_generator(self) -> np.random.Generator:
        return np.random.default_rng(self.sampler)

    def canary_generator(self) -> np.random.Generator:
        """The gradient canaries' draws (membership, then each step's inclusions)."""
        return np.random.default_rng(self.canaries)

    def canary_noise_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """The noise of the gradient canaries' coordinates."""
        generator = torch.Generator(device=device)
        generator.manual_seed(self.canary_noise)
        return generator

    def noise_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        generator = torch.Generator(device=device)
        generator.manual_seed(self.noise)
        return generator

    def to_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "model": self.model, "noise": self.noise, "torch": self.torch}


class SecureRandom:
    """Uniform draws from a cryptographically secure generator: the ChaCha20 keystream (RFC
    8439) under a 256-bit key drawn from ``os.urandom`` at the first draw, and afresh every 2^32
    blocks (256 GiB) and in a forked child (which would otherwise repeat its parent's draws),
    computed by OpenSSL (:class:`~dpaudit.train.chacha.OpenSSLStream`; ``os.urandom`` itself
    where the ``cryptography`` package has no ChaCha20). Nothing is seeded, so nothing recorded
    can replay the draws; the key stays in the object, which cannot be pickled. It offers
    ``random`` and ``permutation`` as a ``numpy.random.Generator`` does, and :meth:`bernoulli`.
    Secure mode of DP-SGD draws its Poisson batches from it (as Opacus' ``secure_mode`` does from
    torchcsprng's ChaCha20), and the gradient canaries their membership and inclusions: a
    keystream in user space gives half a million 32-bit words in a tenth of the time of a system
    call for every draw (docs/security.md)."""

    def __init__(self):
        self.__stream: chacha.OpenSSLStream | None = None
        self.__pid = 0  # the process that drew the stream's key

    def __reduce__(self):
        raise TypeError("a SecureRandom holds its key and cannot be pickled or copied")

    def __repr__(self) -> str:
        return "SecureRandom()"

    def _bytes(self, size: int) -> np.ndarray:
        """``size`` random bytes, uint8, valid until the next draw."""
        if not _OPENSSL:
            return np.frombuffer(os.urandom(size), dtype=np.uint8)
        blocks = -(-size // (4 * chacha.WORDS_PER_BLOCK))
        if self.__stream is None or self.__stream.block + blocks > chacha.MAX_BLOCKS or self.__pid != os.getpid():
            self.__stream, self.__pid = chacha.OpenSSLStream(os.urandom(32), (0, 0, 0)), os.getpid()
        return self.__stream.read(blocks).numpy().view(np.uint8)[:size]

    def random(self, size: int) -> np.ndarray:
        """``size`` floats uniform on [0, 1), each from 53 random bits."""
        raw = self._bytes(8 * int(size)).view(np.uint64)
        return (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of ``range(n)`` (the order of 53-bit random keys)."""
        return np.argsort(self.random(n), kind="stable")

    def bernoulli(self, p: float, size: int) -> np.ndarray:
        """``size`` independent booleans, each True with probability floor(p 2^32) / 2^32 (at
        most p, and less by under 2^-32): a random 32-bit word below floor(p 2^32). Half the
        bytes of ``random(size) < p``: the draws of secure mode's Poisson sampling and gradient
        canaries (:func:`bernoulli`)."""
        if p >= 1:
            return np.ones(int(size), dtype=bool)
        words = self._bytes(4 * int(size)).view(np.uint32)
        return words < np.uint32(math.floor(p * 2.0**32))


class SecureGenerator(torch.Generator):
    """The noise source of secure mode: Gaussians from ChaCha20 (RFC 8439) under a 256-bit key
    drawn once from ``os.urandom`` when the generator is made (once per training run), computed
    where the tensors are (:mod:`dpaudit.train.chacha`; on a CUDA GPU one Triton kernel a draw,
    :mod:`dpaudit.train.chacha_triton`). The key stays in this object: it is not
    printed, pickled or written anywhere, so nothing a run leaves behind replays its noise.

    Nonce and counter (RFC 8439 2.3: state word 12 is the block counter, words 13-15 the
    nonce): word 13 = the draw's index within its step, words 14-15 = the step (64 bits,
    little-endian), word 12 = the block within the draw, from 0. :meth:`next_step` moves to the
    next step and every draw (:meth:`standard_normal`, :meth:`add_noise_`; :meth:`add_noise_all_`
    draws once per parameter tensor on the CPU, once per device elsewhere) takes the next index,
    both only ever counting up, so no (key, nonce, counter) is used twice in a run; a draw of
    more than 2^32 blocks (68 billion normals), a step of more than 2^32 draws, or 2^64 steps is
    refused rather than wrapped. A forked child draws a key of its own
    at its first draw (with its parent's key it would repeat its parent's noise).

    It is still a ``torch.Generator``: code that passes it to ``torch.randn`` (engines that draw
    their own noise, Opacus) gets torch's generator, which :meth:`next_step` re-seeds with
    63 fresh bits of the OS CSPRNG (:func:`os_seed`) at every step."""

    def __new__(cls, device: torch.device | str = "cpu", *, fused: bool = True):
        return super().__new__(cls, device)

    def __init__(self, device: torch.device | str = "cpu", *, fused: bool = True):
        self.fused = fused  # False: no Triton kernel, torch operations on a GPU too (to compare)
        self.__key = os.urandom(32)
        self.__key_on: dict[torch.device, torch.Tensor] = {}
        self.__pid = os.getpid()  # the process that drew the key
        self.step = 0
        self.draws = 0  # draws so far in this step
        self.manual_seed(os_seed())

    def __reduce__(self):
        raise TypeError("a SecureGenerator holds its run's noise key and cannot be pickled or copied")

    def __repr__(self) -> str:
        return f"SecureGenerator(device={str(self.device)!r}, step={self.step}, draws={self.draws})"

    def next_step(self) -> None:
        """Start the next step's nonces; re-seed torch's own generator from the OS."""
        if self.step + 1 >= 2**64:
            raise RuntimeError("2^64 steps under one key: make a new SecureGenerator")
        self.step += 1
        self.draws = 0
        self.manual_seed(os_seed())

    def standard_normal(self, shape, *, device=None, dtype=torch.float32) -> torch.Tensor:
        """``N(0, 1)`` draws of ``shape``, made on ``device`` (default: the generator's) in
        float32, then cast to ``dtype``."""
        device = torch.device(device) if device is not None else self.device
        out = torch.empty(math.prod(shape), dtype=torch.float32, device=device)
        self._draw(out)
        return out.reshape(shape).to(dtype)

    def add_noise_(self, tensor: torch.Tensor, *, std: float) -> torch.Tensor:
        """Add ``std * N(0, 1)`` to ``tensor`` in place and snap every sum to the grid
        :func:`~dpaudit.train.chacha.snap_spacing` ``(std)`` (in float32; docs/security.md);
        return ``tensor``."""
        spacing = chacha.snap_spacing(std)
        if tensor.dtype == torch.float32 and tensor.is_contiguous():
            self._draw(tensor.detach().view(-1), std=std, spacing=spacing)
        else:
            work = tensor.detach().float().reshape(-1).clone()
            self._draw(work, std=std, spacing=spacing)
            tensor.detach().copy_(work.view(tensor.shape))
        return tensor

    def add_noise_all_(self, tensors, *, std: float) -> None:
        """:meth:`add_noise_` on each of ``tensors`` (one step's summed gradients). On an
        accelerator they are noised as one draw per device, in place when they lie end to end
        in one buffer (:func:`one_buffer`, as the engines' sums do), else concatenated and split
        back: each draw costs a few kernel calls and host-to-device copies whatever its size,
        and on one H100 GPT-2 124M's 148 tensors took 1.6 s a step drawn one by one, the same
        124 million normals 7 ms in one draw (2026-12-05). On the CPU, where a call costs
        little, one draw per tensor, with no copies."""
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for t in tensors:
            by_device.setdefault(t.device, []).append(t)
        for device, group in by_device.items():
            if not one_draw(device):
                for t in group:
                    self.add_noise_(t, std=std)
                continue
            flat = one_buffer(group)  # the engines' sums (zero_sums) are noised where they lie
            separate = flat is None
            if separate:
                flat = torch.cat([t.detach().reshape(-1).float() for t in group])
            self._draw(flat, std=std, spacing=chacha.snap_spacing(std))
            if separate:
                for t, part in zip(group, flat.split([t.numel() for t in group])):
                    t.detach().copy_(part.view(t.shape))

    # -- the draws -------------------------------------------------------------

    def _draw(self, out: torch.Tensor, *, std: float | None = None, spacing: float | None = None) -> None:
        """Fill the flat float32 ``out`` with normals (``std`` None) or with ``out + std * z``
        snapped to ``spacing``, from the next draw's keystream, a chunk of groups at a time."""
        if self.draws >= 2**32:
            raise RuntimeError("2^32 draws in one step: call next_step()")
        nonce = (self.draws, self.step & 0xFFFFFFFF, self.step >> 32)
        self.draws += 1
        n, device = out.numel(), out.device
        groups = -(-n // chacha.GROUP_NORMALS)
        if groups * chacha.GROUP_BLOCKS > chacha.MAX_BLOCKS:
            raise ValueError(f"{n} normals in one draw exceed ChaCha20's 2^32 blocks per nonce")
        fused = fused_kernel(device) if self.fused else None
        if fused is not None:  # a CUDA device: one Triton kernel makes the words, normals and snapped sums
            try:
                fused.fill_(out, key=self._key_tensor(device), nonce=nonce, std=std, spacing=spacing)
                return
            except Exception as err:  # noqa: BLE001 - no compiler for this GPU: the torch path is correct too
                fused.FAILED.append(f"{type(err).__name__}: {err}")
                warnings.warn(f"the Triton secure-noise kernel failed; draws use torch operations (slower) from now on: "
                              f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", stacklevel=3)
        # eager, a draw on an accelerator is the block function's ~2,000 operations, a kernel each
        compiled = chacha.can_compile(device) and (n >= chacha.COMPILE_MIN or device.type != "cpu")
        stream = self._stream(nonce, device, compiled)
        chunk = _CHUNK_GROUPS if device.type == "cpu" else _DEVICE_CHUNK_GROUPS
        for start in range(0, groups, chunk):
            stop = min(groups, start + chunk)
            words = stream.read((stop - start) * chacha.GROUP_BLOCKS)
            if words.device != device:  # a small draw for an accelerator: made on the CPU
                words = to_device(words, device)
            part = out[start * chacha.GROUP_NORMALS : min(n, stop * chacha.GROUP_NORMALS)]
            if std is None:
                part.copy_(chacha.normals(words, compiled=compiled)[: part.numel()])
                continue
            padded = part  # the last group of a draw may be partly used: pad the sums to whole groups
            if part.numel() % chacha.GROUP_NORMALS:
                padded = torch.zeros((stop - start) * chacha.GROUP_NORMALS, dtype=part.dtype, device=device)
                padded[: part.numel()] = part
            part.copy_(chacha.noisy_snapped(words, padded, std=std, spacing=spacing, compiled=compiled)[: part.numel()])

    def _stream(self, nonce: tuple[int, int, int], device: torch.device, compiled: bool):
        """The draw's keystream: from OpenSSL on the CPU (and for small draws elsewhere, copied
        over), from torch operations where the tensors are otherwise."""
        if _OPENSSL and (device.type == "cpu" or not compiled):
            return chacha.OpenSSLStream(self._key(), nonce)
        return chacha.TorchStream(self._key_tensor(device), nonce, compiled=compiled)

    def _key(self) -> bytes:
        if self.__pid != os.getpid():  # a forked child
            self.__key, self.__key_on, self.__pid = os.urandom(32), {}, os.getpid()
        return self.__key

    def _key_tensor(self, device: torch.device) -> torch.Tensor:
        key = self._key()
        if device not in self.__key_on:
            self.__key_on[device] = chacha.key_tensor(key, device)
        return self.__key_on[device]


def fused_kernel(device: torch.device):
    """:mod:`~dpaudit.train.chacha_triton` where it runs (a CUDA device, ``triton`` importable,
    no failure yet in this process), else None."""
    if device.type != "cuda":
        return None
    try:
        from dpaudit.train import chacha_triton
    except ImportError:
        return None
    return chacha_triton if chacha_triton.available(device) else None


def _has_openssl() -> bool:
    try:
        from cryptography.hazmat.primitives.ciphers import algorithms  # noqa: F401
    except ImportError:
        return False
    return sys.byteorder == "little"


_OPENSSL = _has_openssl()
_CHUNK_GROUPS = 2**15  # 1 Mi normals a kernel call on the CPU (a call costs ~50 us: fewer, larger ones)
_DEVICE_CHUNK_GROUPS = 2**18  # 8 Mi normals a kernel on an accelerator


def one_buffer(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensors as one flat float32 view when they lie end to end, in order, in one
    buffer (the engines' sums: :func:`~dpaudit.train.engine.zero_sums`); else None."""
    first = tensors[0]
    end = first.storage_offset()
    for t in tensors:
        if (t.dtype != torch.float32 or not t.is_contiguous() or t.storage_offset() != end
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return None
        end += t.numel()
    return first.detach().as_strided((end - first.storage_offset(),), (1,))


def one_draw(device: torch.device) -> bool:
    """Whether a step's noise on ``device`` is one draw for all its tensors (an accelerator,
    where each draw costs kernel launches whatever its size): secure mode's
    :meth:`SecureGenerator.add_noise_all_`, and seeded noise on the engines' sums."""
    return device.type != "cpu"


def os_seed() -> int:
    """A fresh 63-bit seed from the operating system's CSPRNG; secure mode re-seeds the
    noise generator with one at every step and records none of them."""
    return int.from_bytes(os.urandom(8), "little") >> 1


class PoissonSampler:
    """Each of ``num_units`` units joins each batch independently with probability
    ``sample_rate``. Yields sorted arrays of unit indices; empty arrays do occur."""

    kind = "poisson"

    def __init__(self, *, num_units: int, sample_rate: float, generator: np.random.Generator | SecureRandom):
        if num_units < 1:
            raise InputError("cannot sample from an empty set of units")
        if not 0 < sample_rate <= 1:
            raise InputError(f"sampling rate q must be in (0, 1], got {sample_rate!r}")
        self.num_units = num_units
        self.sample_rate = float(sample_rate)
        self.generator = generator

    def sample(self) -> np.ndarray:
        return np.flatnonzero(bernoulli(self.generator, self.sample_rate, self.num_units))


def bernoulli(generator: np.random.Generator | SecureRandom, p: float, size: int) -> np.ndarray:
    """``size`` independent draws, each True with probability ``p``: a seeded uniform below p
    (reproducible mode), or :meth:`SecureRandom.bernoulli` (secure mode: half the random bytes,
    p rounded down to a multiple of 2^-32, never above it). The draws of Poisson sampling, of
    protected units and of gradient canaries alike."""
    if isinstance(generator, SecureRandom):
        return generator.bernoulli(p, size)
    return generator.random(size) < p


class ShuffleSampler:
    """Batches of exactly ``batch_size`` units taken in order from a stream of random
    permutations of the units (a new permutation starts where the last one ended)."""

    kind = "shuffle"

    def __init__(self, *, num_units: int, batch_size: int, generator: np.random.Generator | SecureRandom):
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
