"""ChaCha20 keystreams where the tensors are, and secure mode's Gaussian noise made from them.

ChaCha20 is the stream cipher of RFC 8439 ("ChaCha20 and Poly1305 for IETF Protocols"): a
256-bit key, a 32-bit block counter and a 96-bit nonce give one 64-byte block of keystream,
16 little-endian 32-bit words. Two paths compute it, and they give the same words for the same
key, nonce and counter (``tests/train/test_chacha.py`` checks both against the RFC's vectors and
against each other):

- :class:`OpenSSLStream`, on the CPU: the ``cryptography`` package's ChaCha20 cipher applied to
  zero bytes, which is OpenSSL's vectorised code (4-6 GB/s on one core with AVX-512);
- :class:`TorchStream`, on any device: the block function in torch int32 operations (wrapping
  additions, xors, rotations; one row per block), fused into one kernel by :func:`torch.compile`
  where it can compile, eager torch otherwise. The path on accelerators for draws of 2^18
  normals and more: the words are made where the noise is added and never cross the bus.

On a CUDA GPU, :mod:`dpaudit.train.chacha_triton` makes the same words, normals and snapped sums
in one Triton kernel; this module's functions are its reference.

Normals. A draw of ``n`` normals reads ``2 * ceil(n / 32)`` blocks from block counter 0 of its
nonce. Each group of two blocks makes 32 normals by Box-Muller on 16 pairs of uniforms: pair
``k`` takes word ``k`` of the first block (``a``) and word ``k`` of the second (``b``); its angle
is ``2 pi`` times the top 16 bits of ``a`` over 2^16, and its radius ``sqrt(-2 ln u)`` with
``u`` on ``(0, 1]`` made of 48 bits (the 32 of ``b`` and the low 16 of ``a``, in float32 with
relative precision 2^-24 all the way down to 2^-49), so the radius reaches 8.24 and only the
normal's tail beyond 8.24 standard deviations (2e-16 of its mass) is cut off. The 16 cosines are
the group's first 16 normals, the 16 sines the next 16. All of it is float32 arithmetic, one
fused pass under :func:`torch.compile`: the same words give the same normals up to the last
bits of ``log``, ``cos`` and ``sin``, which may differ between devices and between compiled and
eager code.

Snapping, the floating-point mitigation (:func:`noisy_snapped`, docs/security.md): the noisy sum
``s + std * z`` is rounded to the nearest multiple of :func:`snap_spacing` ``(std)``, a power of
two that depends on ``std`` alone (Mironov 2012's snapping, without his clamp).
"""

from __future__ import annotations

import math
import struct
import sys
import warnings
from typing import Callable

import torch
from torch import Tensor

from dpaudit.devices import to_device

CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k", RFC 8439 2.3
WORDS_PER_BLOCK = 16
MAX_BLOCKS = 2**32  # the 32-bit block counter: one nonce never gives more
GROUP_BLOCKS = 2  # two blocks (32 words) ...
GROUP_NORMALS = 32  # ... make 32 normals
TWO_PI_2_16 = 2 * math.pi * 2.0**-16  # a turn in 2^16 steps
GRID_BITS = 6  # the snapping grid: 2^-GRID_BITS of the largest power of two <= std
COMPILE_MIN = 2**18  # draws of fewer normals run eager: compiling would not pay


def _int32(word: int) -> int:
    """The int32 with the bits of the unsigned 32-bit ``word``."""
    return word - (1 << 32) if word >= 1 << 31 else word


def key_tensor(key: bytes, device: torch.device | str = "cpu") -> Tensor:
    """The 256-bit ``key`` as 8 little-endian int32 words on ``device``."""
    return to_device(torch.tensor([_int32(w) for w in struct.unpack("<8I", key)], dtype=torch.int32), device)


def _check_range(first_block: int, count: int) -> None:
    if not (0 <= first_block and first_block + count <= MAX_BLOCKS):
        raise ValueError(f"blocks {first_block} .. {first_block + count - 1} are outside ChaCha20's 32-bit counter")


# --------------------------------------------------------------------------- the block function


def _rotl(x: Tensor, n: int) -> Tensor:
    # int32 >> is arithmetic: mask the copies of the sign bit away to rotate the 32 bits
    return (x << n) | ((x >> (32 - n)) & ((1 << n) - 1))


def _quarter_round(x: list, a: int, b: int, c: int, d: int) -> None:
    x[a] = x[a] + x[b]
    x[d] = _rotl(x[d] ^ x[a], 16)
    x[c] = x[c] + x[d]
    x[b] = _rotl(x[b] ^ x[c], 12)
    x[a] = x[a] + x[b]
    x[d] = _rotl(x[d] ^ x[a], 8)
    x[c] = x[c] + x[d]
    x[b] = _rotl(x[b] ^ x[c], 7)


def _blocks(key: Tensor, nonce: Tensor, first_block: Tensor, count: int) -> Tensor:
    """``count`` ChaCha20 blocks as rows of 16 int32 words (RFC 8439 2.3): ``key`` (8 words),
    block counters ``first_block + i``, ``nonce`` (3 words), int32 tensors on one device."""
    counters = torch.arange(count, dtype=torch.int64, device=key.device) + first_block
    counters = torch.where(counters >= 2**31, counters - 2**32, counters).to(torch.int32)
    # the constants as Python ints (int32 arithmetic with the tensors, no copy to the device)
    state = [_int32(c) for c in CONSTANTS] + [key[i] for i in range(8)] + [counters] + [nonce[i] for i in range(3)]
    x = list(state)
    for _ in range(10):  # 20 rounds: a column round and a diagonal round, ten times
        _quarter_round(x, 0, 4, 8, 12)
        _quarter_round(x, 1, 5, 9, 13)
        _quarter_round(x, 2, 6, 10, 14)
        _quarter_round(x, 3, 7, 11, 15)
        _quarter_round(x, 0, 5, 10, 15)
        _quarter_round(x, 1, 6, 11, 12)
        _quarter_round(x, 2, 7, 8, 13)
        _quarter_round(x, 3, 4, 9, 14)
    return torch.stack([(x[i] + state[i]).expand(count) for i in range(16)], dim=1)


class TorchStream:
    """The blocks of one (key, nonce) in order from ``first_block``, by the block function in
    torch operations on the key's device (``compiled``: through :func:`torch.compile`)."""

    def __init__(self, key: Tensor, nonce: tuple[int, int, int], first_block: int = 0, *, compiled: bool = False):
        _check_range(first_block, 0)
        self.key, self.block, self.compiled = key, first_block, compiled
        # host-made, copied without waiting for the device's queued work (as the counters below)
        self.nonce = to_device(torch.tensor([_int32(w) for w in nonce], dtype=torch.int32), key.device)

    def read(self, count: int) -> Tensor:
        """The next ``count`` blocks, flat int32 words on the key's device."""
        _check_range(self.block, count)
        first = to_device(torch.tensor(self.block, dtype=torch.int64), self.key.device)
        self.block += count
        return _kernel("blocks", self.compiled)(self.key, self.nonce, first, count).reshape(-1)


_ZEROS = bytes(1 << 22)  # the plaintext whose ciphertext is the keystream, 4 MiB at a time


class OpenSSLStream:
    """The same words as :class:`TorchStream`, on the CPU, from OpenSSL's ChaCha20 through the
    ``cryptography`` package (whose 16-byte nonce is the RFC's counter word, then its nonce)."""

    def __init__(self, key: bytes, nonce: tuple[int, int, int], first_block: int = 0):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        if sys.byteorder != "little":  # the words are read in place: little-endian, as the RFC's
            raise RuntimeError("the OpenSSL keystream path assumes a little-endian machine")
        _check_range(first_block, 0)
        self.block = first_block
        self._buffer: Tensor | None = None
        self._encryptor = Cipher(algorithms.ChaCha20(key, struct.pack("<4I", first_block, *nonce)), mode=None).encryptor()

    def read(self, count: int) -> Tensor:
        """The next ``count`` blocks, flat int32 words on the CPU, in a buffer that the next read
        overwrites."""
        _check_range(self.block, count)
        self.block += count
        words = count * WORDS_PER_BLOCK
        if self._buffer is None or self._buffer.numel() < words:
            self._buffer = torch.empty(words, dtype=torch.int32)
        out = self._buffer[:words]
        raw = memoryview(out.numpy()).cast("B")
        for start in range(0, len(raw), len(_ZEROS)):
            stop = min(len(raw), start + len(_ZEROS))
            self._encryptor.update_into(_ZEROS[: stop - start], raw[start:stop])
        return out


# --------------------------------------------------------------------------- Gaussians


def _polar(words: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Radius, cosine and sine of each group's 16 pairs, (groups, 16) float32 each."""
    w = words.reshape(-1, GROUP_BLOCKS, WORDS_PER_BLOCK)
    a, b = w[:, 0], w[:, 1]
    angle = ((a >> 16) & 0xFFFF).float() * TWO_PI_2_16  # int32 >> is arithmetic: mask
    high = ((b >> 8) & 0xFFFFFF).float()
    low = (((b & 0xFF) << 16) | (a & 0xFFFF)).float()
    u = (high + low * 2.0**-24 + 2.0**-25) * 2.0**-24  # 48 bits in (0, 1]: never log(0)
    return torch.sqrt(-2.0 * torch.log(u)), torch.cos(angle), torch.sin(angle)


def _normals(words: Tensor) -> Tensor:
    radius, cos, sin = _polar(words)
    return torch.stack([radius * cos, radius * sin], dim=1).reshape(-1)


def _noisy_snapped(words: Tensor, summed: Tensor, std: Tensor, spacing: Tensor) -> Tensor:
    radius, cos, sin = _polar(words)
    s = summed.reshape(-1, 2, WORDS_PER_BLOCK)
    scale = 1.0 / spacing  # a power of two: multiplying by it is exact, as dividing by spacing is
    first = torch.round((s[:, 0] + std * (radius * cos)) * scale) * spacing
    second = torch.round((s[:, 1] + std * (radius * sin)) * scale) * spacing
    return torch.stack([first, second], dim=1).reshape(-1)


def normals(words: Tensor, *, compiled: bool = False) -> Tensor:
    """``N(0, 1)`` float32 draws from keystream ``words``, 32 per 32 words."""
    return _kernel("normals", compiled)(words)


def snap_spacing(std: float) -> float:
    """The snapping grid for noise of standard deviation ``std``: the power of two
    ``2^(floor(log2 std) - GRID_BITS)``, so ``std / 128 < spacing <= std / 64``."""
    if not (math.isfinite(std) and std > 0):
        raise ValueError(f"the noise's standard deviation must be positive and finite, got {std!r}")
    exponent = math.frexp(std)[1] - 1  # 2^exponent <= std < 2^(exponent + 1)
    spacing = math.ldexp(1.0, exponent - GRID_BITS)
    if spacing < torch.finfo(torch.float32).tiny or std > 2.0**100:
        raise ValueError(f"noise of standard deviation {std!r} is outside what float32 snapping handles")
    return spacing


def noisy_snapped(words: Tensor, summed: Tensor, *, std: float, spacing: float, compiled: bool = False) -> Tensor:
    """``summed + std * z`` in float32 (``z``: the normals of ``words``), rounded to the nearest
    multiple of ``spacing`` (ties to even); ``summed`` is flat, one value per word."""
    scalars = to_device(torch.tensor([std, spacing], dtype=torch.float32), summed.device)
    return _kernel("snapped", compiled)(words, summed, scalars[0], scalars[1])


# --------------------------------------------------------------------------- compiled or eager

_EAGER: dict[str, Callable] = {"blocks": _blocks, "normals": _normals, "snapped": _noisy_snapped}
_COMPILED: dict[str, Callable] = {}
_COMPILE_FAILED: list[str] = []


def _kernel(name: str, compiled: bool) -> Callable:
    """The function ``name``, eager or through :func:`torch.compile` (dynamic shapes, built on
    first use). A compiler that fails makes every later draw in the process eager, with a
    warning: the keystream is the same, only slower."""
    if not compiled or _COMPILE_FAILED:
        return _EAGER[name]
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(_EAGER[name], dynamic=True, fullgraph=True)
    return lambda *args: _compiled_call(name, *args)


def _compiled_call(name: str, *args):
    try:
        return _COMPILED[name](*args)
    except Exception as err:  # noqa: BLE001 - no C++ compiler, an unsupported backend: eager is correct too
        _COMPILE_FAILED.append(f"{type(err).__name__}: {err}")
        warnings.warn(f"torch.compile failed for the secure-noise kernels; they run eager (slower) from now on: "
                      f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", stacklevel=4)
        return _EAGER[name](*args)


def can_compile(device: torch.device) -> bool:
    """Whether draws on ``device`` try :func:`torch.compile` (it has not failed in this process)."""
    return not _COMPILE_FAILED and device.type in ("cpu", "cuda")
