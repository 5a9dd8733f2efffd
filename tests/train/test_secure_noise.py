"""Noise nobody can replay: secure mode (the default of DP training) against reproducible
mode (``train.dp.reproducible: true``). Both must give the same distributions, the Poisson
batch sizes of Binomial(N, q) and Gaussian noise of standard deviation sigma C / B; only the
source of the randomness differs. Statistical checks use thresholds (6 standard errors,
p > 1e-6) at which a correct secure-mode run, which cannot be seeded, fails about never."""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
import struct

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import GPT2Config, GPT2LMHeadModel
from recorded import train_recorded

from dpaudit.config import load_config
from dpaudit.errors import InputError
from dpaudit.train import chacha, dpsgd, nonprivate, sampling
from dpaudit.train.engine import DPSGDEngine
from dpaudit.train.plan import RELEASE_WARNING
from dpaudit.train.sampling import PoissonSampler, RunSeeds, SecureGenerator, SecureRandom, os_seed

MODES = ["secure", "reproducible"]


def sampler_source(mode: str):
    return SecureRandom() if mode == "secure" else RunSeeds.from_seed(3).numpy_generator()


@pytest.mark.parametrize("openssl", [True, False])
def test_secure_random_is_uniform_and_unseeded(openssl, monkeypatch):
    monkeypatch.setattr(sampling, "_OPENSSL", openssl and sampling._OPENSSL)  # False: os.urandom itself
    draws = SecureRandom().random(200_000)
    assert draws.min() >= 0.0 and draws.max() < 1.0
    assert stats.kstest(draws, "uniform").pvalue > 1e-6
    assert not np.array_equal(SecureRandom().random(8), SecureRandom().random(8))  # 2^-424 to collide
    perm = SecureRandom().permutation(50)
    assert sorted(perm.tolist()) == list(range(50))
    n, q = 400_000, 0.05
    hits = SecureRandom().bernoulli(q, n)
    assert hits.shape == (n,) and abs(hits.mean() - q) < 6 * math.sqrt(q * (1 - q) / n)
    assert SecureRandom().bernoulli(1.0, 3).all() and not SecureRandom().bernoulli(2.0**-40, 1000).any()
    assert os_seed() != os_seed() and 0 <= os_seed() < 2**63


def test_secure_random_is_the_chacha20_keystream_of_a_key_from_the_os(monkeypatch):
    """Its bytes are ChaCha20's keystream (RFC 8439, counted from block 0 of nonce 0) under
    32 bytes of ``os.urandom``; a new key is drawn before the 32-bit block counter would
    wrap; the key cannot be pickled out of it."""
    if not sampling._OPENSSL:
        pytest.skip("no ChaCha20 in this cryptography package")
    keys = iter([bytes(range(32)), bytes(range(1, 33))])
    monkeypatch.setattr(sampling.os, "urandom", lambda n: next(keys) if n == 32 else pytest.fail("not a key"))
    monkeypatch.setattr(chacha, "MAX_BLOCKS", 3)  # the counter's end, three blocks on
    source = SecureRandom()
    first = source._bytes(128).copy()  # blocks 0 and 1 of the first key
    expect = chacha.TorchStream(chacha.key_tensor(bytes(range(32))), (0, 0, 0)).read(3).numpy().view(np.uint8)
    assert np.array_equal(first, expect[:128])
    words = source.bernoulli(0.5, 32)  # two more blocks would pass the counter's end: a new key
    fresh = chacha.TorchStream(chacha.key_tensor(bytes(range(1, 33))), (0, 0, 0)).read(2).numpy().view(np.uint32)
    assert np.array_equal(words, fresh < np.uint32(2**31))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(source)


def in_forked_child(draw) -> bytes:
    """What ``draw()`` returns (bytes) in a child forked now."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, draw())
        finally:
            os._exit(0)
    os.close(write)
    out = os.read(read, 1 << 16)
    os.waitpid(pid, 0)
    os.close(read)
    return out


def test_secure_sources_draw_anew_in_a_forked_child():
    """A child forked after a draw holds its parent's key and counters, and would repeat its
    parent's next draws (the same batches, the same noise); each source draws a key of its own
    there instead."""
    source = SecureRandom()
    source.random(4)
    child = in_forked_child(lambda: source._bytes(16).tobytes())
    assert len(child) == 16 and child != source._bytes(16).tobytes()
    noise = SecureGenerator()
    noise.standard_normal((4,))
    child = in_forked_child(lambda: noise.standard_normal((8,)).numpy().tobytes())
    assert len(child) == 32 and child != noise.standard_normal((8,)).numpy().tobytes()


def test_bernoulli_draws_a_seeded_uniform_below_p_or_a_secure_word():
    """Reproducible mode's draws are those of the seeded generator's uniforms, to the bit (runs
    repeat); secure mode's come from SecureRandom.bernoulli, never above p."""
    assert np.array_equal(sampling.bernoulli(np.random.default_rng(7), 0.3, 1000),
                          np.random.default_rng(7).random(1000) < 0.3)
    assert not sampling.bernoulli(SecureRandom(), 2.0**-40, 10_000).any()


@pytest.mark.parametrize("mode", MODES)
def test_poisson_batch_sizes_are_binomial_in_both_modes(mode):
    n, q, steps = 200, 0.05, 4000
    sampler = PoissonSampler(num_units=n, sample_rate=q, generator=sampler_source(mode))
    batches = [sampler.sample() for _ in range(steps)]
    sizes = np.array([len(b) for b in batches])
    var = n * q * (1 - q)
    assert abs(sizes.mean() - n * q) < 6 * math.sqrt(var / steps)
    m4 = var * (1 + 3 * (n - 2) * q * (1 - q))
    assert abs(sizes.var(ddof=1) - var) < 6 * math.sqrt((m4 - var**2 * (steps - 3) / (steps - 1)) / steps)
    counts = np.bincount(np.concatenate(batches), minlength=n)  # each unit in Binomial(steps, q) batches
    assert stats.chisquare(counts).pvalue > 1e-6
    assert all(np.all(np.diff(b) > 0) for b in batches)


def small_model():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model.train()
    return model


def noise_draws(mode: str, *, sigma: float, C: float, B: int, steps: int) -> torch.Tensor:
    """The noise of ``steps`` DP-SGD steps on fixed data: the update minus the noiseless one,
    with the generator handled as the loop handles it in ``mode``."""
    model = small_model()
    g = torch.Generator()
    units = [[torch.randint(2, 50, (n,), generator=g.manual_seed(n))] for n in (6, 4, 8)]
    kw = {"expected_batch_size": B, "microbatch_size": 4, "pad_id": 0, "max_grad_norm": C}
    engine = DPSGDEngine(model, noise_multiplier=0.0, **kw)
    engine.step(units)
    clean = torch.cat([p.grad.flatten() for p in engine.params.values()])
    engine.close()
    engine = DPSGDEngine(model, noise_multiplier=sigma, **kw)
    generator = SecureGenerator() if mode == "secure" else RunSeeds.from_seed(5).noise_generator()
    draws = []
    for _ in range(steps):
        if mode == "secure":
            generator.next_step()
        engine.step(units, generator)
        draws.append(torch.cat([p.grad.flatten() for p in engine.params.values()]) - clean)
    engine.close()
    return torch.stack(draws).double()


def test_secure_generator_draws_standard_normals_that_no_seed_replays():
    g = SecureGenerator()
    z = g.standard_normal((300, 101), dtype=torch.float64)
    assert z.shape == (300, 101) and z.dtype == torch.float64
    assert stats.kstest(z.flatten().numpy(), "norm").pvalue > 1e-6
    g.manual_seed(1)
    first = g.standard_normal((50,))
    g.manual_seed(1)
    assert not torch.equal(first, g.standard_normal((50,)))  # no seed replays it
    assert g.standard_normal((3,), dtype=torch.bfloat16).dtype == torch.bfloat16
    assert g.standard_normal((7,)).shape == (7,)  # part of a group of 32: the rest of it unused


@pytest.mark.parametrize("mode", MODES)
def test_noise_is_gaussian_with_std_sigma_c_over_b_in_both_modes(mode):
    sigma, C, B = 1.3, 0.7, 5
    noise = noise_draws(mode, sigma=sigma, C=C, B=B, steps=6)
    expected = sigma * C / B
    n = noise.numel()
    assert abs(float(noise.std()) / expected - 1) < 6 / math.sqrt(2 * n)
    assert abs(float(noise.mean())) < 6 * expected / math.sqrt(n)
    assert stats.kstest(noise.flatten().numpy() / expected, "norm").pvalue > 1e-6
    # steps are independent: no two steps share their noise (the reused-key bug)
    corr = torch.corrcoef(noise)
    assert float((corr - torch.eye(len(noise), dtype=corr.dtype)).abs().max()) < 6 / math.sqrt(noise.shape[1])


def test_the_two_modes_draw_the_same_distribution_but_only_one_replays():
    secure = noise_draws("secure", sigma=1.0, C=1.0, B=4, steps=3).flatten().numpy()
    again = noise_draws("secure", sigma=1.0, C=1.0, B=4, steps=3).flatten().numpy()
    reproducible = noise_draws("reproducible", sigma=1.0, C=1.0, B=4, steps=3).flatten().numpy()
    assert stats.ks_2samp(secure, reproducible).pvalue > 1e-6
    assert not np.array_equal(secure, again)  # nothing recorded replays secure noise
    assert np.array_equal(reproducible, noise_draws("reproducible", sigma=1.0, C=1.0, B=4, steps=3).flatten().numpy())


# --------------------------------------------------------------------------- the loop


def config(*overrides):
    return load_config("tiny", overrides=["data.max_length=32", "train.steps=4", "train.eval_every=4",
                                          "train.trainer=dpaudit.train:dpsgd", "train.dp.noise_multiplier=1.0",
                                          *overrides])


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.fixture(scope="module")
def rows(make_dataset, tokenizer):
    return make_dataset(tokenizer, 24)


def test_presets_are_reproducible_and_the_default_is_secure():
    for preset in ("tiny", "demo", "gpu"):
        cfg = load_config(preset)
        assert all(cfg.for_model(name).train.dp.reproducible for name in cfg.model_names())
    assert load_config("tiny", overrides=["train.dp.reproducible=false"]).train.dp.reproducible is False
    from dpaudit.config import DPConfig

    assert DPConfig().reproducible is False  # a config a user writes gets secure noise


def test_reproducible_mode_replays_and_carries_a_warning(rows, tokenizer, tmp_path):
    cfg = config("train.dp.reproducible=true")
    a = train_recorded(dpsgd, tmp_path / "a", rows, tokenizer, seed=1, config=cfg)
    b = dpsgd(rows, tokenizer, seed=1, config=cfg)
    assert torch.equal(weights(a), weights(b))
    record = json.loads((tmp_path / "a" / "dp_event.json").read_text())
    assert record["noise"] == "reproducible" and record["warning"] == RELEASE_WARNING
    checks = json.loads((tmp_path / "a" / "train_checks.json").read_text())
    assert checks["noise"] == "reproducible" and checks["seeds"]["noise"] == RunSeeds.from_seed(1).noise
    a.save_pretrained(tmp_path / "model")
    assert json.loads((tmp_path / "model" / "config.json").read_text())["dpaudit_warning"] == RELEASE_WARNING


def test_secure_mode_cannot_be_replayed_from_the_run_files(rows, tokenizer, tmp_path):
    cfg = config("train.dp.reproducible=false")
    a = train_recorded(dpsgd, tmp_path / "a", rows, tokenizer, seed=1, config=cfg)
    b = dpsgd(rows, tokenizer, seed=1, config=cfg)
    assert not torch.equal(weights(a), weights(b))  # same seed, different noise and batches
    record = json.loads((tmp_path / "a" / "dp_event.json").read_text())
    assert record["noise"] == "secure" and "warning" not in record
    checks = json.loads((tmp_path / "a" / "train_checks.json").read_text())
    assert checks["noise"] == "secure" and checks["seeds"]["noise"] is None
    # 4 batch sizes are too few for a sure sampler check: the Binomial law is tested above
    assert checks["parameters"]["all_moved"] and checks["batch_size"]["consistent"] is not None
    assert not hasattr(a.config, "dpaudit_warning")


def test_secure_mode_writes_its_key_nowhere(rows, tokenizer, tmp_path, monkeypatch, capsys, caplog):
    made = []
    real_init = SecureGenerator.__init__

    def recording_init(self, device="cpu"):
        real_init(self, device)
        made.append(self)

    monkeypatch.setattr(SecureGenerator, "__init__", recording_init)
    model = train_recorded(dpsgd, tmp_path / "run", rows, tokenizer, seed=1,
                           config=config("train.dp.reproducible=false", "train.checkpoint_every=2"))
    model.save_pretrained(tmp_path / "model")
    assert len(made) == 1 and made[0].step == 4  # the run's one generator, moved on at each of the 4 steps
    key = made[0]._SecureGenerator__key
    words = struct.unpack("<8I", key)
    needles = [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key),
               *(str(w).encode() for w in words), *(str(w - 2**32).encode() for w in words if w >= 2**31)]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"dp_event.json", "train_checks.json", "train_log.jsonl", "config.json", "model.safetensors"} <= names
    assert any("checkpoints" in p.parts for p in files)
    for path in files:
        data = path.read_bytes()
        assert not any(needle in data for needle in needles), path
    printed = capsys.readouterr()
    for text in (printed.out, printed.err, caplog.text):
        assert not any(needle.decode("latin-1") in text for needle in needles)


def test_nonprivate_training_stays_seeded_and_records_no_noise(rows, tokenizer, tmp_path):
    cfg = load_config("tiny", overrides=["data.max_length=32", "train.steps=3"])
    a = train_recorded(nonprivate, tmp_path, rows, tokenizer, seed=2, config=cfg)
    assert torch.equal(weights(a), weights(nonprivate(rows, tokenizer, seed=2, config=cfg)))
    assert json.loads((tmp_path / "dp_event.json").read_text())["noise"] is None


def test_nan_loss_stops_training_naming_the_step(rows, tokenizer, tmp_path):
    cfg = load_config("tiny", overrides=["data.max_length=32", "train.steps=6", "train.lr=1e30"])
    with pytest.raises(InputError, match=r"loss is NaN or infinite at step \d+ of 6"):
        train_recorded(nonprivate, tmp_path, rows, tokenizer, seed=0, config=cfg)
