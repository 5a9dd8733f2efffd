"""Secure mode's noise on a CUDA device in one Triton kernel: the ChaCha20 blocks (RFC 8439),
Box-Muller and the snapping of :mod:`dpaudit.train.chacha`, fused.

The torch path (:class:`~dpaudit.train.chacha.TorchStream`, then
:func:`~dpaudit.train.chacha.noisy_snapped`) writes the keystream to memory and reads it back,
two compiled calls per 8 Mi normals, and :func:`torch.compile` stores the round function's words
between passes (on the CPU its code for the 20 rounds is ten loops); on one H100 one compiled draw
of GPT-2 124M's 124.4 million normals took 7.0-7.5 ms (2026-12-05). Here each lane makes one
group's two blocks in registers (the ten double rounds a loop), the program gathers its groups'
words into two (groups, 16) tiles, turns them into 32 normals a group and adds them to the sums
where they lie: one launch a draw, 8 bytes of memory traffic a normal (the sum read and
written). Built for an H100 (sm_90) it compiles in 1-2 s and uses 128 registers a thread.

The words, the nonce and counter layout, the normals and the grid are those of
:mod:`dpaudit.train.chacha`; ``tests/train/test_chacha.py`` checks this kernel against them through
Triton's interpreter on the CPU (``TRITON_INTERPRET=1``), and the GPU check on the device.
``log``, ``cos`` and ``sin`` come from libdevice on a GPU (``tl.log`` is a fast approximation,
whose error near ``u = 1`` would move small radii), from numpy in the interpreter.

Importing this module needs ``triton``; :func:`available` says whether a device can use it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from dpaudit.train import chacha

_BLOCK = 128  # groups (two ChaCha20 blocks, 32 normals) a program
_TWO_PI_2_16 = tl.constexpr(chacha.TWO_PI_2_16)


@triton.jit
def _rotl(x, n: tl.constexpr):
    return (x << n) | (x >> (32 - n))  # uint32: >> is logical


@triton.jit
def _quarter(a, b, c, d):
    a = a + b
    d = _rotl(d ^ a, 16)
    c = c + d
    b = _rotl(b ^ c, 12)
    a = a + b
    d = _rotl(d ^ a, 8)
    c = c + d
    b = _rotl(b ^ c, 7)
    return a, b, c, d


@triton.jit
def _block(key_ptr, counter, nonce0, nonce1, nonce2):
    """One ChaCha20 block a lane (RFC 8439 2.3): its 16 uint32 words, ``counter`` a vector."""
    zero = counter * 0
    s0 = zero + 0x61707865
    s1 = zero + 0x3320646E
    s2 = zero + 0x79622D32
    s3 = zero + 0x6B206574
    s4 = zero + tl.load(key_ptr + 0).to(tl.uint32, bitcast=True)
    s5 = zero + tl.load(key_ptr + 1).to(tl.uint32, bitcast=True)
    s6 = zero + tl.load(key_ptr + 2).to(tl.uint32, bitcast=True)
    s7 = zero + tl.load(key_ptr + 3).to(tl.uint32, bitcast=True)
    s8 = zero + tl.load(key_ptr + 4).to(tl.uint32, bitcast=True)
    s9 = zero + tl.load(key_ptr + 5).to(tl.uint32, bitcast=True)
    s10 = zero + tl.load(key_ptr + 6).to(tl.uint32, bitcast=True)
    s11 = zero + tl.load(key_ptr + 7).to(tl.uint32, bitcast=True)
    s12 = counter
    s13 = zero + nonce0.to(tl.uint32, bitcast=True)
    s14 = zero + nonce1.to(tl.uint32, bitcast=True)
    s15 = zero + nonce2.to(tl.uint32, bitcast=True)
    x0, x1, x2, x3, x4, x5, x6, x7 = s0, s1, s2, s3, s4, s5, s6, s7
    x8, x9, x10, x11, x12, x13, x14, x15 = s8, s9, s10, s11, s12, s13, s14, s15
    for _ in range(10):  # 20 rounds: a column round and a diagonal round, ten times
        x0, x4, x8, x12 = _quarter(x0, x4, x8, x12)
        x1, x5, x9, x13 = _quarter(x1, x5, x9, x13)
        x2, x6, x10, x14 = _quarter(x2, x6, x10, x14)
        x3, x7, x11, x15 = _quarter(x3, x7, x11, x15)
        x0, x5, x10, x15 = _quarter(x0, x5, x10, x15)
        x1, x6, x11, x12 = _quarter(x1, x6, x11, x12)
        x2, x7, x8, x13 = _quarter(x2, x7, x8, x13)
        x3, x4, x9, x14 = _quarter(x3, x4, x9, x14)
    return (x0 + s0, x1 + s1, x2 + s2, x3 + s3, x4 + s4, x5 + s5, x6 + s6, x7 + s7,
            x8 + s8, x9 + s9, x10 + s10, x11 + s11, x12 + s12, x13 + s13, x14 + s14, x15 + s15)


@triton.jit
def _round_half_even(x):
    """``torch.round`` in float32: the nearest integer, ties to even (every float32 at or above
    2^23 in magnitude is one already)."""
    r = tl.floor(x + 0.5)  # exact below 2^23
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    r = tl.where(((r - x) == 0.5) & odd, r - 1.0, r)
    return tl.where(tl.abs(x) >= 8388608.0, x, r)


@triton.jit
def _tile(w):
    """The 16-tuple of (BLOCK,) words ``w`` as one (BLOCK, 16) tensor, column k = ``w[k]``."""
    p0 = tl.join(w[0], w[1])
    p1 = tl.join(w[2], w[3])
    p2 = tl.join(w[4], w[5])
    p3 = tl.join(w[6], w[7])
    p4 = tl.join(w[8], w[9])
    p5 = tl.join(w[10], w[11])
    p6 = tl.join(w[12], w[13])
    p7 = tl.join(w[14], w[15])
    t = tl.join(tl.join(tl.join(p0, p1), tl.join(p2, p3)), tl.join(tl.join(p4, p5), tl.join(p6, p7)))
    # t[:, l1, l2, l3, l4] = w[l1 + 2 l2 + 4 l3 + 8 l4]
    return tl.reshape(tl.permute(t, (0, 4, 3, 2, 1)), (t.shape[0], 16))


@triton.jit(do_not_specialize=["n", "first_group", "nonce0", "nonce1", "nonce2", "std", "spacing", "scale"])
def _normals_kernel(out_ptr, n, first_group, key_ptr, nonce0, nonce1, nonce2, std, spacing, scale,
                    MODE: tl.constexpr, PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    """MODE 0: the keystream's words (int32) from group ``first_group`` on; 1: the normals;
    2: the sums noised and snapped (both from group 0)."""
    group = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    i0 = (group * 32)[:, None] + tl.arange(0, 16)[None, :]  # pair k of a group: normals k and 16 + k
    i1 = i0 + 16
    group += first_group
    counter = (group * 2).to(tl.uint32)  # the block counter: wraps as the RFC's 32-bit word
    a = _tile(_block(key_ptr, counter, nonce0, nonce1, nonce2))  # pair k takes word k of each block
    b = _tile(_block(key_ptr, counter + 1, nonce0, nonce1, nonce2))
    if MODE == 0:
        tl.store(out_ptr + i0, a.to(tl.int32, bitcast=True), mask=i0 < n)
        tl.store(out_ptr + i1, b.to(tl.int32, bitcast=True), mask=i1 < n)
    else:
        angle = (a >> 16).to(tl.float32) * _TWO_PI_2_16
        high = (b >> 8).to(tl.float32)
        low = (((b & 0xFF) << 16) | (a & 0xFFFF)).to(tl.float32)
        u = (high + low * 5.9604644775390625e-08 + 2.9802322387695312e-08) * 5.9604644775390625e-08
        if PRECISE:
            radius = tl.sqrt_rn(-2.0 * libdevice.log(u))
            cos = libdevice.cos(angle)
            sin = libdevice.sin(angle)
        else:
            radius = tl.sqrt_rn(-2.0 * tl.log(u))
            cos = tl.cos(angle)
            sin = tl.sin(angle)
        z0 = radius * cos  # the group's first 16 normals are the cosines, the next 16 the sines
        z1 = radius * sin
        if MODE == 2:
            s0 = tl.load(out_ptr + i0, mask=i0 < n, other=0.0)
            s1 = tl.load(out_ptr + i1, mask=i1 < n, other=0.0)
            z0 = _round_half_even((s0 + std * z0) * scale) * spacing
            z1 = _round_half_even((s1 + std * z1) * scale) * spacing
        tl.store(out_ptr + i0, z0, mask=i0 < n)
        tl.store(out_ptr + i1, z1, mask=i1 < n)


def available(device: torch.device) -> bool:
    """Whether draws on ``device`` run this kernel: a CUDA (or ROCm) device, and it has not failed
    to compile in this process."""
    return device.type == "cuda" and not FAILED


def fill_(out: torch.Tensor, *, key: torch.Tensor, nonce: tuple[int, int, int],
          std: float | None = None, spacing: float | None = None) -> torch.Tensor:
    """Fill the flat contiguous float32 ``out`` in place with the normals of ``nonce``'s keystream
    under ``key`` (8 int32 words on ``out``'s device), or, given ``std`` and ``spacing``, with
    ``out + std * z`` rounded to the nearest multiple of ``spacing``: the values of
    :func:`~dpaudit.train.chacha.normals` and :func:`~dpaudit.train.chacha.noisy_snapped` (up to
    the last bits of ``log``, ``cos`` and ``sin``). Returns ``out``."""
    if out.dtype != torch.float32:
        raise ValueError("the kernel fills float32 tensors")
    return _launch(out, key, nonce, 1 if std is None else 2, std or 0.0, spacing or 1.0)


def words(key: torch.Tensor, nonce: tuple[int, int, int], *, first: int = 0, blocks: int) -> torch.Tensor:
    """Blocks ``first`` to ``first + blocks - 1`` (both even) of ``nonce``'s keystream under
    ``key``, flat int32 words on the key's device: the words that :func:`fill_` turns into
    normals, from block 0."""
    if first % chacha.GROUP_BLOCKS or blocks % chacha.GROUP_BLOCKS:
        raise ValueError("the kernel makes blocks in pairs")
    out = torch.empty(blocks * chacha.WORDS_PER_BLOCK, dtype=torch.int32, device=key.device)
    return _launch(out, key, nonce, 0, 0.0, 1.0, first_group=first // chacha.GROUP_BLOCKS)


def _launch(out, key, nonce, mode, std, spacing, first_group=0):
    if out.dim() != 1 or not out.is_contiguous():
        raise ValueError("the kernel fills a flat contiguous tensor")
    n = out.numel()
    groups = -(-n // chacha.GROUP_NORMALS)
    chacha._check_range(first_group * chacha.GROUP_BLOCKS, groups * chacha.GROUP_BLOCKS)
    if n:
        _normals_kernel[(triton.cdiv(groups, _BLOCK),)](
            out, n, first_group, key, *(chacha._int32(w) for w in nonce), float(std), float(spacing), 1.0 / spacing,
            MODE=mode, PRECISE=out.device.type != "cpu", BLOCK=_BLOCK, enable_fp_fusion=False)
    return out


FAILED: list[str] = []  # the errors of failed launches: later draws take the torch path
