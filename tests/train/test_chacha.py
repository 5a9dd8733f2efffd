"""Secure mode's noise source: ChaCha20 (RFC 8439) on every path, the Gaussians made from it, the
nonce layout, and the snapping of the noisy sum (docs/security.md). Statistical checks use
thresholds (6 standard errors, p > 1e-6) that a correct generator fails about never."""

from __future__ import annotations

import copy
import importlib
import math
import os
import pickle
import struct

import numpy as np
import pytest
import torch
from scipy import stats

from dpaudit.train import chacha
from dpaudit.train.engine import DPSGDEngine
from dpaudit.train.sampling import SecureGenerator

RFC_KEY = bytes(range(32))

# RFC 8439 2.3.2: the block function, counter 1
BLOCK_NONCE = bytes.fromhex("000000090000004a00000000")
BLOCK_OUT = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)
# RFC 8439 2.4.2: encryption from counter 1; the keystream is the ciphertext xor the plaintext
CIPHER_NONCE = bytes.fromhex("000000000000004a00000000")
PLAINTEXT = (b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, "
             b"sunscreen would be it.")
CIPHERTEXT = bytes.fromhex(
    "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
    "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
    "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
    "5af90bbf74a35be6b40b8eedf2785e42874d"
)


def nonce_words(nonce: bytes) -> tuple[int, int, int]:
    return struct.unpack("<3I", nonce)


def as_bytes(words: torch.Tensor) -> bytes:
    return words.cpu().numpy().astype("<i4").tobytes()


def torch_words(key: bytes, nonce, first: int, count: int, *, device="cpu", compiled=False) -> torch.Tensor:
    return chacha.TorchStream(chacha.key_tensor(key, device), nonce, first, compiled=compiled).read(count)


def openssl_words(key: bytes, nonce, first: int, count: int) -> torch.Tensor:
    return chacha.OpenSSLStream(key, nonce, first).read(count).clone()


PATHS = {"torch": torch_words, "openssl": openssl_words}


# --------------------------------------------------------------------------- ChaCha20


@pytest.mark.parametrize("path", PATHS)
def test_rfc8439_block_function(path):
    assert as_bytes(PATHS[path](RFC_KEY, nonce_words(BLOCK_NONCE), 1, 1)) == BLOCK_OUT


@pytest.mark.parametrize("path", PATHS)
def test_rfc8439_keystream_encrypts_the_sunscreen_text(path):
    keystream = as_bytes(PATHS[path](RFC_KEY, nonce_words(CIPHER_NONCE), 1, 2))
    assert bytes(p ^ k for p, k in zip(PLAINTEXT, keystream)) == CIPHERTEXT


def test_the_paths_give_the_same_words_for_the_same_key_nonce_and_counter():
    key, nonce = os.urandom(32), struct.unpack("<3I", os.urandom(12))
    for first, count in [(0, 300), (2**31 - 150, 300), (2**32 - 7, 7)]:  # the counter's sign bit, its end
        assert torch.equal(torch_words(key, nonce, first, count), openssl_words(key, nonce, first, count))
    for make in (lambda: chacha.TorchStream(chacha.key_tensor(key), nonce, 5), lambda: chacha.OpenSSLStream(key, nonce, 5)):
        stream = make()  # reads continue where the last one ended
        parts = [stream.read(3).clone(), stream.read(10).clone()]
        assert torch.equal(torch.cat(parts), openssl_words(key, nonce, 5, 13))
    with pytest.raises(ValueError, match="32-bit counter"):
        chacha.OpenSSLStream(key, nonce, 2**32 - 2).read(3)
    with pytest.raises(ValueError, match="32-bit counter"):
        chacha.TorchStream(chacha.key_tensor(key), nonce, 2**32 - 2).read(3)


@pytest.mark.slow  # torch.compile of the 20 rounds on the CPU takes a minute or more
def test_the_compiled_torch_path_gives_the_same_words():
    key, nonce = os.urandom(32), (1, 2, 3)
    assert torch.equal(torch_words(key, nonce, 2**31 - 64, 4096, compiled=True), openssl_words(key, nonce, 2**31 - 64, 4096))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("compiled", [False, True])
def test_the_cuda_path_gives_the_same_words(compiled):
    key, nonce = os.urandom(32), (7, 8, 9)
    words = torch_words(key, nonce, 2**31 - 64, 4096, device="cuda", compiled=compiled)
    assert words.device.type == "cuda" and torch.equal(words.cpu(), openssl_words(key, nonce, 2**31 - 64, 4096))
    z = chacha.normals(words, compiled=compiled).cpu()
    assert torch.allclose(z, chacha.normals(words.cpu()), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the Triton kernel


@pytest.fixture
def triton_kernel(monkeypatch):
    """dpaudit.train.chacha_triton run by Triton's interpreter on the CPU: the kernel's code, with
    numpy's log, cos and sin where a GPU calls libdevice's."""
    tl = pytest.importorskip("triton.language")
    from dpaudit.train import chacha_triton

    # Triton 3.5 leaves the interpreter's patches of triton.language in place, after which
    # nothing in the process compiles for a GPU (3.7 and 3.9 undo them): put back what changed
    patched = [tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, chacha_triton.libdevice]
    saved = [dict(vars(obj)) for obj in patched]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield importlib.reload(chacha_triton)
    monkeypatch.delenv("TRITON_INTERPRET")
    for obj, before in zip(patched, saved):
        for name in set(vars(obj)) - set(before):
            delattr(obj, name)
        for name, value in before.items():
            if vars(obj).get(name) is not value:
                setattr(obj, name, value)
    importlib.reload(chacha_triton)


def test_the_triton_kernel_makes_the_rfc_blocks_and_openssl_s_words(triton_kernel):
    rfc = chacha.key_tensor(RFC_KEY)
    assert as_bytes(triton_kernel.words(rfc, nonce_words(BLOCK_NONCE), blocks=2)[16:]) == BLOCK_OUT  # counter 1
    keystream = as_bytes(triton_kernel.words(rfc, nonce_words(CIPHER_NONCE), blocks=4)[16:])  # counters 1, 2, 3
    assert bytes(p ^ k for p, k in zip(PLAINTEXT, keystream)) == CIPHERTEXT
    key = os.urandom(32)
    nonce = (2**31 + 5, 2**32 - 1, 7)  # words with the sign bit set
    for first, blocks in [(0, 300), (2**31 - 128, 256), (2**32 - 8, 8)]:  # the counter's sign bit, its end
        words = triton_kernel.words(chacha.key_tensor(key), nonce, first=first, blocks=blocks)
        assert torch.equal(words, openssl_words(key, nonce, first, blocks))
    with pytest.raises(ValueError, match="pairs"):
        triton_kernel.words(rfc, (0, 0, 0), first=1, blocks=2)
    with pytest.raises(ValueError, match="32-bit counter"):
        triton_kernel.words(rfc, (0, 0, 0), first=2**32 - 2, blocks=4)


def test_the_triton_kernel_makes_the_torch_path_s_normals_and_snapped_sums(triton_kernel):
    key, nonce, n = os.urandom(32), (3, 1, 0), 1000  # a last group of 8 of its 32 normals
    words = openssl_words(key, nonce, 0, 2 * 32)
    buffer = torch.full((n + 100,), 7.0)
    out = triton_kernel.fill_(buffer[:n], key=chacha.key_tensor(key), nonce=nonce)
    assert torch.allclose(out, chacha.normals(words)[:n], atol=1e-6, rtol=1e-6)
    assert (buffer[n:] == 7.0).all()  # nothing written past the tensor
    std = 1.5
    spacing = chacha.snap_spacing(std)
    s = torch.randn(n, generator=torch.Generator().manual_seed(3)) * 10
    buffer[:n] = s
    triton_kernel.fill_(buffer[:n], key=chacha.key_tensor(key), nonce=nonce, std=std, spacing=spacing)
    expected = chacha.noisy_snapped(words, torch.cat([s, torch.zeros(24)]), std=std, spacing=spacing)[:n]
    assert float((buffer[:n] != expected).float().mean()) < 1e-2  # but a sum within an ulp of a grid boundary
    assert torch.equal(buffer[:n] / spacing, torch.round(buffer[:n] / spacing)) and (buffer[n:] == 7.0).all()
    # rounding ties go to even, as torch.round: sums of exactly k + 1/2 grid steps, and no noise
    ties = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 2.0**23 + 1, 3.25, -7.75]) * spacing
    tiny = 1e-30  # the noise, std * z, is below every grid step here
    triton_kernel.fill_(ties, key=chacha.key_tensor(key), nonce=nonce, std=tiny, spacing=spacing)
    assert ties.div(spacing).tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, 2.0**23 + 1, 3.0, -8.0]
    for bad in (torch.zeros(10, dtype=torch.float64), torch.zeros(10, 2).t(), torch.zeros(2, 5)):
        with pytest.raises(ValueError, match="flat contiguous|float32"):
            triton_kernel.fill_(bad, key=chacha.key_tensor(key), nonce=nonce)


def test_a_secure_generator_on_cuda_draws_through_the_kernel_and_falls_back_when_it_fails(triton_kernel, monkeypatch):
    import dpaudit.train.sampling as sampling

    monkeypatch.setattr(sampling, "fused_kernel", lambda device: triton_kernel if triton_kernel.available(device) else None)
    monkeypatch.setattr(triton_kernel, "available", lambda device: not triton_kernel.FAILED)  # the CPU plays the GPU
    calls, fill = [], triton_kernel.fill_
    monkeypatch.setattr(triton_kernel, "fill_", lambda *args, **kwargs: calls.append(kwargs["nonce"]) or fill(*args, **kwargs))
    key = os.urandom(32)
    g = generator_with_key(key)
    g.next_step()
    z = g.standard_normal((1000,))
    assert torch.allclose(z, chacha.normals(openssl_words(key, (0, 1, 0), 0, 64))[:1000], atol=1e-6, rtol=1e-6)
    std = 0.7
    sums = g.add_noise_(torch.zeros(40, 25), std=std)  # draw 1 of step 1
    assert g.draws == 2
    expected = chacha.noisy_snapped(openssl_words(key, (1, 1, 0), 0, 64), torch.zeros(1024), std=std,
                                    spacing=chacha.snap_spacing(std))[:1000]
    assert float((sums.flatten() != expected).float().mean()) < 1e-2
    assert calls == [(0, 1, 0), (1, 1, 0)]
    plain = generator_with_key(key, fused=False)  # torch operations: the same normals
    plain.next_step()
    assert torch.allclose(plain.standard_normal((1000,)), z, atol=1e-6, rtol=1e-6) and len(calls) == 2

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler for this GPU")

    monkeypatch.setattr(triton_kernel, "fill_", broken)
    with pytest.warns(UserWarning, match="Triton secure-noise kernel failed"):
        z = g.standard_normal((1000,))  # draw 2: the torch path makes the same normals
    assert torch.allclose(z, chacha.normals(openssl_words(key, (2, 1, 0), 0, 64))[:1000], atol=1e-6, rtol=1e-6)
    assert triton_kernel.FAILED and sampling.fused_kernel(torch.device("cpu")) is None


def test_the_gpu_check_records_the_kernel_and_its_words(triton_kernel, monkeypatch):
    import dpaudit.train.sampling as sampling
    from dpaudit.bench.gpu import secure_noise_path

    cpu = torch.device("cpu")
    assert secure_noise_path(cpu) == {"path": "torch", "triton_error": None}
    monkeypatch.setattr(sampling, "fused_kernel", lambda device: triton_kernel)  # the CPU plays the GPU
    assert secure_noise_path(cpu) == {"path": "triton", "words_equal_reference": True}
    monkeypatch.setattr(triton_kernel, "_launch", lambda out, *a, **k: out.zero_())  # a kernel that writes nothing
    assert secure_noise_path(cpu)["words_equal_reference"] is False


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_the_triton_kernel_compiles_for_a_gpu_without_one(mode):
    """The compiled kernel, libdevice's log, cos and sin included, built for an H100 (sm_90) by
    Triton and ptxas on this machine: the part of the GPU path that the interpreter does not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dpaudit.train import chacha_triton

    signature = {"out_ptr": "*i32" if mode == 0 else "*fp32", "n": "i64", "first_group": "i32", "key_ptr": "*i32",
                 "nonce0": "i32", "nonce1": "i32", "nonce2": "i32", "std": "fp32", "spacing": "fp32", "scale": "fp32",
                 "MODE": "constexpr", "PRECISE": "constexpr", "BLOCK": "constexpr"}
    source = ASTSource(fn=chacha_triton._normals_kernel, signature=signature,
                       constexprs={"MODE": mode, "PRECISE": True, "BLOCK": chacha_triton._BLOCK})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
    ptx = kernel.asm["ptx"]
    # one double round of each block, looped ten times: its rotations by 12 and 7 are funnel shifts
    assert kernel.asm["cubin"] and ptx.count("shf.l.wrap.b32") >= 2 * 8 * 2
    assert "lg2.approx" not in ptx and "sin.approx" not in ptx and "cos.approx" not in ptx


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_triton_kernel_on_cuda_gives_openssl_s_words_and_the_torch_path_s_normals():
    from dpaudit.train import chacha_triton

    key, nonce = os.urandom(32), (7, 8, 9)
    cuda_key = chacha.key_tensor(key, "cuda")
    words = chacha_triton.words(cuda_key, nonce, first=2**31 - 64, blocks=4096)
    assert torch.equal(words.cpu(), openssl_words(key, nonce, 2**31 - 64, 4096))
    z = chacha_triton.fill_(torch.empty(2**16, device="cuda"), key=cuda_key, nonce=nonce).cpu()
    assert torch.allclose(z, chacha.normals(openssl_words(key, nonce, 0, 2**12)), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the generator


def generator_with_key(key: bytes, device="cpu", **kwargs) -> SecureGenerator:
    """A SecureGenerator under a known key: tests only (a real one never shows its key)."""
    g = SecureGenerator(device, **kwargs)
    g._SecureGenerator__key = key
    return g


def reference_normals(words: torch.Tensor) -> torch.Tensor:
    """The documented layout in float64, written apart from the package's code."""
    w = words.to(torch.int64).reshape(-1, 2, 16) & 0xFFFFFFFF
    a, b = w[:, 0], w[:, 1]
    angle = (a >> 16).double() * (2 * math.pi / 65536)
    u = ((b << 16) + (a & 0xFFFF)).double().add(0.5).mul(2.0**-48)
    radius = torch.sqrt(-2 * torch.log(u))
    return torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], 1).reshape(-1)


def test_nonces_follow_the_documented_layout_and_never_repeat(monkeypatch):
    seen = []
    real = chacha.OpenSSLStream.__init__

    def spy(self, key, nonce, first_block=0):
        seen.append((nonce, first_block))
        real(self, key, nonce, first_block)

    monkeypatch.setattr(chacha.OpenSSLStream, "__init__", spy)
    g = SecureGenerator()
    draws = []
    for step in range(3):
        g.next_step()
        draws += [g.standard_normal((100,)), g.add_noise_(torch.zeros(7, 5), std=1.0)]
    assert seen == [((d, s, 0), 0) for s in (1, 2, 3) for d in (0, 1)]  # (draw, step low, step high)
    assert len({tuple(d.flatten().tolist()) for d in draws}) == len(draws)
    g.step = 2**32 + 5  # the step's high word
    g.next_step()
    g.standard_normal((3,))
    assert seen[-1] == ((0, 6, 1), 0)
    g.draws = 2**32
    with pytest.raises(RuntimeError, match="2\\^32 draws"):
        g.standard_normal((3,))
    g.step = 2**64 - 1
    with pytest.raises(RuntimeError, match="2\\^64 steps"):
        g.next_step()
    monkeypatch.setattr(chacha, "MAX_BLOCKS", 4)  # 4 blocks make 64 normals
    g.step = 0
    g.next_step()
    with pytest.raises(ValueError, match="2\\^32 blocks"):
        g.standard_normal((65,))


def test_the_draws_are_the_documented_function_of_the_keystream():
    key = os.urandom(32)
    g = generator_with_key(key)
    g.next_step()
    z = g.standard_normal((1000,), dtype=torch.float64)
    words = openssl_words(key, (0, 1, 0), 0, 2 * 32)  # draw 0 of step 1: 32 groups for 1000 normals
    ref = reference_normals(words)
    # float32 holds u near 1 to 2^-24, which moves a radius r by up to 2^-24 / r: a pair with a
    # small radius (one in ~30 draws of 1,000 has r < 0.01) is exact only to that
    radius = ref.reshape(-1, 2, 16).norm(dim=1, keepdim=True).expand(-1, 2, 16).reshape(-1)
    assert ((z - ref[:1000]).abs() <= 2e-6 * (1 + ref[:1000].abs()) + 2.0**-24 / radius[:1000]).all()
    fresh = SecureGenerator()  # another key: other draws for the same step and draw
    fresh.next_step()
    assert not torch.allclose(fresh.standard_normal((1000,), dtype=torch.float64), z)


def test_the_key_stays_in_the_object():
    g = SecureGenerator()
    key = g._SecureGenerator__key
    assert len(key) == 32 and key != SecureGenerator()._SecureGenerator__key
    assert key.hex() not in repr(g) and key.hex() not in str(vars(g))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(g)
    with pytest.raises(TypeError):
        copy.deepcopy(g)


def test_gaussians_pass_kolmogorov_smirnov_on_four_million_draws():
    g = SecureGenerator()
    z = g.standard_normal((2**22,), dtype=torch.float64)  # large: the compiled kernel
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-6
    n = z.numel()
    assert abs(float(z.mean())) < 6 / math.sqrt(n) and abs(float(z.var()) - 1) < 6 * math.sqrt(2 / n)
    assert abs(float((z**4).mean()) - 3) < 6 * math.sqrt(96 / n)  # the tails' weight: E z^4 = 3, Var z^4 = 96
    assert float(z.abs().max()) < 8.25  # the radius' support ends at sqrt(2 ln 2^49) = 8.24


def test_compiled_and_eager_kernels_agree():
    words = openssl_words(os.urandom(32), (3, 0, 0), 0, 2 * 2**13)  # 2^18 normals
    eager, compiled = chacha.normals(words), chacha.normals(words, compiled=True)
    assert torch.allclose(eager, compiled, atol=1e-5, rtol=1e-5)
    # float32 rounds u = 1 - t near 1 by up to 2^-25, so the radius sqrt(2 t) is off by up to
    # sqrt(2 * 2^-25) = 2^-12 where t is that small (a few pairs in 10^3 runs; 2e-5 failed 1 in 10)
    assert torch.allclose(eager.double(), reference_normals(words), atol=2.0**-12 + 2e-5, rtol=1e-5)
    s = torch.randn(words.numel(), generator=torch.Generator().manual_seed(0)) * 10
    a = chacha.noisy_snapped(words, s, std=1.5, spacing=chacha.snap_spacing(1.5))
    b = chacha.noisy_snapped(words, s, std=1.5, spacing=chacha.snap_spacing(1.5), compiled=True)
    assert float((a != b).float().mean()) < 1e-3  # only sums within an ulp of a grid boundary may differ


def test_steps_and_parameter_blocks_are_uncorrelated():
    g = SecureGenerator()
    rows = []
    for _ in range(4):  # 4 steps of 4 parameter blocks
        g.next_step()
        rows += [g.standard_normal((40_000,), dtype=torch.float64) for _ in range(4)]
    corr = torch.corrcoef(torch.stack(rows))
    off = corr - torch.eye(len(rows), dtype=corr.dtype)
    assert float(off.abs().max()) < 6 / math.sqrt(40_000)
    z = rows[0].reshape(-1, 2, 16)  # within a group: the cosine and sine halves, and neighbours
    for x, y in [(z[:, 0], z[:, 1]), (z[:, 0] ** 2, z[:, 1] ** 2), (rows[0][:-1], rows[0][1:])]:
        r = float(torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1])
        assert abs(r) < 6 / math.sqrt(x.numel())


def test_keystream_bits_and_uniforms_are_uniform():
    words = openssl_words(os.urandom(32), (0, 0, 0), 0, 2**14).numpy().view(np.uint32)  # 2^18 words
    ones = np.array([((words >> bit) & 1).sum() for bit in range(32)])
    n = len(words)
    assert stats.chisquare(np.concatenate([ones, n - ones])).pvalue > 1e-6  # every bit position fair
    pairs = words.astype(np.uint64).reshape(-1, 2, 16)
    angles = (pairs[:, 0] >> np.uint64(16)).ravel()
    u = ((pairs[:, 1] << np.uint64(16)) + (pairs[:, 0] & np.uint64(0xFFFF))).ravel().astype(np.float64) * 2.0**-48
    assert stats.chisquare(np.bincount((angles >> np.uint64(6)).astype(np.int64), minlength=1024)).pvalue > 1e-6
    assert stats.kstest(u, "uniform").pvalue > 1e-6


# --------------------------------------------------------------------------- snapping


def test_snap_spacing_is_a_power_of_two_between_std_over_128_and_std_over_64():
    for std in [1e-6, 0.013, 0.5, 1.0, 1.3, 2.0, 3.999, 7.5e4]:
        spacing = chacha.snap_spacing(std)
        assert math.frexp(spacing)[0] == 0.5  # a power of two
        assert std / 128 < spacing <= std / 64
    for bad in [0.0, -1.0, math.inf, math.nan]:
        with pytest.raises(ValueError):
            chacha.snap_spacing(bad)


def snapped_sums(words, s, std, *, compiled=False):
    return chacha.noisy_snapped(words, s, std=std, spacing=chacha.snap_spacing(std), compiled=compiled)


@pytest.mark.parametrize("compiled", [False, True])
def test_every_noisy_sum_lies_on_the_grid(compiled):
    words = openssl_words(os.urandom(32), (0, 0, 0), 0, 2 * 2**13)
    n = words.numel()
    g = torch.Generator().manual_seed(1)
    # sums with low-order bits everywhere: tiny, ordinary, huge (coarser than the grid), negative
    s = torch.randn(n, generator=g) * torch.logspace(-9, 9, n).float()[torch.randperm(n, generator=g)]
    for std in (1.0, 0.37, 3e-4):
        y = snapped_sums(words, s, std, compiled=compiled)
        spacing = chacha.snap_spacing(std)
        assert torch.isfinite(y).all()
        assert torch.equal(y / spacing, torch.round(y / spacing))  # an integer multiple of the grid, exactly
        assert float((y - s).abs().max()) <= 8.25 * std + spacing  # and the noise is no larger than it was


def test_snapped_sums_match_exact_arithmetic_but_for_a_boundary_fraction():
    words = openssl_words(os.urandom(32), (0, 0, 0), 0, 2 * 2**13)
    s = torch.randn(words.numel(), generator=torch.Generator().manual_seed(2)) * 3
    std = 1.0
    spacing = chacha.snap_spacing(std)
    y = snapped_sums(words, s, std).double()
    exact = torch.round((s.double() + std * reference_normals(words)) / spacing) * spacing
    wrong = y != exact
    assert float(wrong.float().mean()) < 1e-3  # float32 error moved the sum across a grid boundary
    assert torch.equal((y - exact)[wrong].abs(), torch.full((int(wrong.sum()),), spacing, dtype=torch.float64))


def test_snapping_erases_the_sums_bits_below_the_grid():
    """The floating-point attacks (Mironov 2012; Jin et al. 2021) read the unnoised value in the
    output's low-order bits. With the same noise, two sums that differ below the grid give
    outputs that differ in nearly every coordinate without snapping, and after snapping only
    where the difference carries the sum across a grid boundary, the ideal mechanism's rate."""
    words = openssl_words(os.urandom(32), (0, 0, 0), 0, 2 * 2**13)
    n, std = words.numel(), 1.0
    spacing = chacha.snap_spacing(std)
    s = torch.randn(n, generator=torch.Generator().manual_seed(3))
    delta = spacing / 8
    z = chacha.normals(words)
    raw_differs = float(((s + std * z) != (s + delta + std * z)).float().mean())
    snapped_differs = (snapped_sums(words, s, std) != snapped_sums(words, s + delta, std)).float().mean()
    assert raw_differs > 0.99
    rate = delta / spacing  # the chance that a uniform position in a cell lies within delta of its upper end
    assert abs(float(snapped_differs) - rate) < 6 * math.sqrt(rate / n) + 1e-3


@pytest.mark.parametrize("offset", [0.0, 0.37])
def test_the_snapped_outputs_have_the_rounded_gaussians_law_wherever_the_sum_lies(offset):
    """Every grid cell within 3 standard deviations is reached, with the probability of the
    exact Gaussian's mass in it: the set of outputs does not depend on where in a cell the sum
    lies, and neither does anything but the ideal mechanism's probabilities."""
    g = SecureGenerator()
    std = 1.0
    spacing = chacha.snap_spacing(std)
    n = 2**20
    s = torch.full((n,), offset * spacing)
    k = (g.add_noise_(s, std=std) / spacing).round().long()
    centre = int(3 * std / spacing)  # cells -centre .. centre, then one for the rest
    edges = (torch.arange(-centre, centre + 2, dtype=torch.float64) - 0.5 - offset) * spacing
    mass = np.diff(stats.norm.cdf(edges.numpy() / std))
    inside = k.abs() <= centre
    counts = torch.bincount(k[inside] + centre, minlength=2 * centre + 1).numpy()
    assert (counts > 0).all()  # no holes
    observed = np.concatenate([counts, [n - counts.sum()]])
    expected = np.concatenate([mass, [1 - mass.sum()]]) * n
    assert stats.chisquare(observed, expected).pvalue > 1e-6


def test_the_engine_snaps_the_noisy_sum_in_secure_mode_only():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    units = [[torch.arange(2, 10)], [torch.arange(5, 12)]]
    sigma, C, B = 1.3, 0.7, 4  # B a power of two: dividing by it keeps the grid exact
    engine = DPSGDEngine(model, expected_batch_size=B, microbatch_size=4, pad_id=0, noise_multiplier=sigma,
                         max_grad_norm=C)
    spacing = chacha.snap_spacing(sigma * C)
    generator = SecureGenerator()
    generator.next_step()
    engine.step(units, generator)
    assert generator.draws == len(engine.params)  # on the CPU, one draw per parameter tensor
    for p in engine.params.values():
        k = p.grad * B / spacing
        assert torch.equal(k, torch.round(k))
    engine.step(units, torch.Generator().manual_seed(0))  # reproducible mode: torch.randn, no grid
    off_grid = [bool((p.grad * B / spacing != torch.round(p.grad * B / spacing)).any()) for p in engine.params.values()]
    assert all(off_grid)
    engine.close()


def test_one_draw_for_all_the_step_s_tensors(monkeypatch):
    """On an accelerator a step's tensors are noised as one draw (a draw costs a few kernel
    calls whatever its size): the path run here on the CPU. Each tensor keeps its shape and
    dtype, gets its own stretch of the keystream, and lands on the snapping grid."""
    import dpaudit.train.sampling as sampling

    monkeypatch.setattr(sampling, "one_draw", lambda device: True)
    g = SecureGenerator()
    g.next_step()
    std = 1.5
    spacing = chacha.snap_spacing(std)
    tensors = [torch.zeros(300, 40), torch.zeros(40), torch.zeros(7, 5).t(), torch.zeros(300, 40, dtype=torch.float64)]
    g.add_noise_all_(tensors, std=std)
    assert g.draws == 1
    assert [t.shape for t in tensors] == [(300, 40), (40,), (5, 7), (300, 40)]
    assert tensors[3].dtype == torch.float64 and not tensors[2].is_contiguous()
    for t in tensors:
        assert torch.equal(t / spacing, torch.round(t / spacing))
    assert not torch.equal(tensors[0], tensors[3].float())  # two tensors of one shape: two stretches
    z = torch.cat([t.reshape(-1).float() for t in tensors]) / std
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-4


def test_one_draw_noises_the_engine_s_sums_where_they_lie(monkeypatch):
    """The engines' sums are views of one buffer (zero_sums): the one draw noises
    that buffer in place, with no copy, each tensor on the grid and the draw normal."""
    import dpaudit.train.sampling as sampling
    from dpaudit.models import build_tiny
    from dpaudit.train.engine import trainable_parameters, zero_sums

    monkeypatch.setattr(sampling, "one_draw", lambda device: True)
    params = trainable_parameters(build_tiny("gpt2", vocab_size=50, bos_token_id=0, eos_token_id=0, seed=0))
    sums = list(zero_sums(params).values())
    assert [s.shape for s in sums] == [p.shape for p in params.values()]
    flat = sampling.one_buffer(sums)
    assert flat is not None and flat.numel() == sum(p.numel() for p in params.values())
    assert sampling.one_buffer(sums[::-1]) is None and sampling.one_buffer([torch.zeros(3), torch.zeros(4)]) is None
    g = SecureGenerator()
    g.next_step()
    std = 2.0
    spacing = chacha.snap_spacing(std)
    with monkeypatch.context() as patch:
        patch.setattr(torch, "cat", None)  # the in-place path concatenates nothing
        g.add_noise_all_(sums, std=std)
    assert g.draws == 1
    assert flat.ne(0).float().mean() > 0.99 and torch.equal(flat / spacing, torch.round(flat / spacing))
    assert all(s.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for s in sums)
    # on the grid the values are discrete, which a KS test of 10^5 of them sees (p about 1e-3):
    # a uniform jitter within a grid cell makes them N(0, std^2) plus U(-spacing/2, spacing/2)
    jitter = np.random.default_rng(0).uniform(-spacing / 2, spacing / 2, flat.numel())
    assert stats.kstest((flat.double().numpy() + jitter) / std, "norm").pvalue > 1e-4
