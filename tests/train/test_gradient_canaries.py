"""White-box gradient canaries inside the toolkit's DP-SGD runs (dpaudit.train.gradient_canaries):
the block, scores and counts against a naive loop; the model unchanged by them; every engine
through the hook, its noise visible on the canaries; soundness of the one-run bounds on them,
simulated with known epsilon (correct sigma, sigma / 2); the sampler check that refuses them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dpaudit.audit import claimed_curve_bound
from dpaudit.audit.gradient_canaries import GradientCanaryRecord, inclusion_check
from dpaudit.config import load_config
from dpaudit.errors import InputError
from dpaudit.stages.artifacts import read_gradient_canaries
from dpaudit.train import TrainingRecord, dpsgd, faulty, nonprivate
from dpaudit.train.engine import DPSGDEngine
from dpaudit.train.gradient_canaries import GradientCanaries
from dpaudit.train.loop import DPSGD, TrainerSpec, run_training
from dpaudit.train.plan import GRADIENT_CANARY_WARNING, RELEASE_WARNING
from recorded import train_recorded

BASE = ["data.max_length=32", "train.eval_every=100", "model.size=tiny", "train.dp.reproducible=true"]
C = 0.5  # a power of two: C * k is exact in float32


def config(*overrides: str, canaries: int = 2000, sigma: float = 1.0, steps: int = 4, batch: int = 8):
    return load_config("tiny", overrides=[*BASE, f"train.dp.noise_multiplier={sigma}", f"train.steps={steps}",
                                          f"train.batch_size={batch}", f"train.dp.max_grad_norm={C}",
                                          f"train.dp.gradient_canaries={canaries}", *overrides])


def train(trainer, dataset, tokenizer, cfg, *, seed: int = 0):
    record = TrainingRecord()
    model = trainer(dataset, tokenizer, seed=seed, config=cfg, record=record)
    return model, record


@pytest.fixture(scope="module")
def data(tokenizer, make_dataset):
    return make_dataset(tokenizer, 16)


# --------------------------------------------------------------------------- the canaries themselves


def test_block_scores_and_inclusions_against_a_naive_loop():
    M, q, T = 40, 0.3, 6
    canaries = GradientCanaries(num_canaries=M, sample_rate=q, max_grad_norm=C, rng=np.random.default_rng(3))
    noise = np.random.default_rng(9)
    blocks, released = [], []
    for _ in range(T):
        block = canaries.block()
        blocks.append(block.numpy().copy())
        out = block + torch.from_numpy(noise.normal(size=M).astype(np.float32))
        released.append(out.numpy().astype(np.float64))
        canaries.observe(out)
    record = canaries.result()

    naive = np.random.default_rng(3)  # the same draws, one at a time
    included = [naive.random() < 0.5 for _ in range(M)]
    counts, scores = [0] * M, [0.0] * M
    for t in range(T):
        expected = [0.0] * M
        for i in range(M):
            if included[i] and naive.random() < q:
                expected[i] = C
                counts[i] += 1
        assert blocks[t].tolist() == expected and blocks[t].dtype == np.float32
        for i in range(M):
            scores[i] += released[t][i]
    assert record.included.tolist() == included
    assert record.inclusions.tolist() == counts
    np.testing.assert_allclose(record.scores, scores, rtol=1e-12)
    assert (record.steps, record.sample_rate, record.max_grad_norm) == (T, q, C)
    assert not record.scores.flags.writeable


def test_block_and_observe_come_in_pairs():
    canaries = GradientCanaries(num_canaries=5, sample_rate=0.5, max_grad_norm=1.0, rng=np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="without a block"):
        canaries.observe(torch.zeros(5))
    canaries.block()
    with pytest.raises(RuntimeError, match="not observed"):
        canaries.block()
    with pytest.raises(RuntimeError, match="not observed"):
        canaries.result()
    with pytest.raises(RuntimeError, match="coordinates"):
        canaries.observe(torch.zeros(4))
    with pytest.raises(InputError):
        GradientCanaries(num_canaries=0, sample_rate=0.5, max_grad_norm=1.0, rng=np.random.default_rng(0))
    with pytest.raises(InputError):
        GradientCanaries(num_canaries=3, sample_rate=0.5, max_grad_norm=math.inf, rng=np.random.default_rng(0))


def test_config_key_is_checked():
    with pytest.raises(InputError, match="train.dp.gradient_canaries must be >= 0"):
        load_config("tiny", overrides=["train.dp.gradient_canaries=-1"])


# --------------------------------------------------------------------------- in a training run


def test_model_unchanged_by_canaries_and_their_scores_reproducible(data, tokenizer, tmp_path):
    without, record0 = train(dpsgd, data, tokenizer, config(canaries=0))
    assert record0.gradient_canaries is None
    assert without.config.dpaudit_warning == RELEASE_WARNING
    model = train_recorded(dpsgd, tmp_path, data, tokenizer, seed=0, config=config())
    again, record2 = train(dpsgd, data, tokenizer, config())
    reference = without.state_dict()
    for name, value in model.state_dict().items():  # bit for bit: the canaries have streams of their own
        assert torch.equal(value, reference[name]), name
    record = read_gradient_canaries(tmp_path)  # the file the train stage writes
    assert record.num_canaries == 2000 and record.steps == 4 and record.sample_rate == 0.5
    for key in ("included", "scores", "inclusions"):
        assert np.array_equal(getattr(record, key), getattr(record2.gradient_canaries, key)), key
    assert read_gradient_canaries(tmp_path / "elsewhere") is None
    # an audit model: both warnings, in config.json and in the DP record
    warning = model.config.dpaudit_warning
    assert RELEASE_WARNING in warning and GRADIENT_CANARY_WARNING in warning
    assert json.loads((tmp_path / "dp_event.json").read_text())["warning"] == warning
    assert inclusion_check(record)[0]


def test_record_codec():
    record = GradientCanaryRecord(included=[True, False, True], scores=[1.5, -0.25, 3.0], inclusions=[1, 0, 2],
                                  steps=2, sample_rate=0.5, max_grad_norm=1.0)
    back = GradientCanaryRecord.from_arrays(record.to_arrays())
    for key in ("included", "scores", "inclusions", "steps", "sample_rate", "max_grad_norm"):
        assert np.array_equal(getattr(back, key), getattr(record, key)), key
    assert back.scores.dtype == np.float64 and back.inclusions.dtype == np.int64 and back.included.dtype == bool
    with pytest.raises(InputError, match="schema version"):
        GradientCanaryRecord.from_arrays({**record.to_arrays(), "schema_version": np.asarray(99)})
    with pytest.raises(InputError, match="one length"):
        GradientCanaryRecord(included=[True], scores=[1.0, 2.0], inclusions=[1], steps=1, sample_rate=0.5,
                             max_grad_norm=1.0)
    cs = record.canary_scores()
    assert cs.in_scores.tolist() == [1.5, 3.0] and cs.out_scores.tolist() == [-0.25]


def test_secure_mode(data, tokenizer):
    cfg = config("train.dp.reproducible=false", canaries=4000)
    model, first = train(dpsgd, data, tokenizer, cfg)
    _, second = train(dpsgd, data, tokenizer, cfg)
    a, b = first.gradient_canaries, second.gradient_canaries
    assert first.checks["seeds"]["noise"] is None  # nothing recorded replays the run
    assert not np.array_equal(a.included, b.included) and not np.array_equal(a.scores, b.scores)
    assert model.config.dpaudit_warning == GRADIENT_CANARY_WARNING == first.dp.warning
    residual = (a.scores - C * a.inclusions) / (math.sqrt(a.steps) * C)  # secure noise, snapped, sigma = 1
    assert residual.std() == pytest.approx(1.0, rel=0.05) and abs(residual.mean()) < 0.05
    assert inclusion_check(a)[0]


def test_nonprivate_training_ignores_canaries(data, tokenizer):
    cfg = config("train.trainer=dpaudit.train:nonprivate")
    with pytest.warns(UserWarning, match="not private"):
        model, record = train(nonprivate, data, tokenizer, cfg)
    assert record.gradient_canaries is None and not hasattr(model.config, "dpaudit_warning")


# --------------------------------------------------------------------------- every engine through the hook

SIGMA, STEPS, BATCH = 1.0, 4, 8
CORRECT = math.sqrt(STEPS) * SIGMA * C  # the std of a canary's summed noise

# the std of (score - C * inclusions) a faulty trainer's noise shows; the others' bugs are elsewhere
# (clipping, sampling of the data, the divisor, the accounting) and their canaries' noise is right
FAULTY_STD = {
    "no_noise": 0.0,
    "unscaled_noise": CORRECT / C,
    "mean_noise_on_sum": CORRECT / BATCH,
    "reused_noise": STEPS * SIGMA * C,  # one draw, T times
    "noisy_microsteps": CORRECT * math.sqrt(faulty.MICROSTEPS),
}
# trainer, extra overrides, the std it must show
ENGINES = {
    "auto (ghost clipping)": (dpsgd, [], CORRECT),
    "vmap": (dpsgd, ["train.dp.engine=vmap"], CORRECT),
    "ghost": (dpsgd, ["train.dp.engine=ghost"], CORRECT),
    **{f"faulty.{key}": (trainer, [], FAULTY_STD.get(key, CORRECT)) for key, trainer in faulty.FAULTY_TRAINERS.items()},
}


@pytest.mark.parametrize("name", ENGINES)
def test_every_engine_goes_through_the_hook(name, data, tokenizer):
    trainer, extra, std = ENGINES[name]
    _, record = train(trainer, data, tokenizer, config(*extra, canaries=4000, sigma=SIGMA, steps=STEPS, batch=BATCH))
    canaries = record.gradient_canaries
    assert canaries.steps == STEPS and inclusion_check(canaries)[0]
    residual = canaries.scores - C * canaries.inclusions
    if std == 0:
        assert np.array_equal(canaries.scores, C * canaries.inclusions)  # exactly: no noise at all
    else:
        assert residual.std() == pytest.approx(std, rel=0.05)


def test_opacus_goes_through_the_hook(data, tokenizer):
    pytest.importorskip("opacus")
    from dpaudit.train.opacus import dpsgd as opacus_dpsgd

    cfg = config(canaries=4000, sigma=SIGMA, steps=STEPS, batch=BATCH)
    model, record = train(opacus_dpsgd, data, tokenizer, cfg)
    canaries = record.gradient_canaries
    assert canaries.steps == STEPS and inclusion_check(canaries)[0]
    residual = canaries.scores - C * canaries.inclusions
    assert residual.std() == pytest.approx(CORRECT, rel=0.05)
    reference, _ = train(opacus_dpsgd, data, tokenizer, config(canaries=0, sigma=SIGMA, steps=STEPS, batch=BATCH))
    for key, value in reference.state_dict().items():  # the model as without canaries
        assert torch.equal(value, model.state_dict()[key]), key


# --------------------------------------------------------------------------- soundness with known epsilon


class HalfNoiseEngine(DPSGDEngine):
    """Noise of std sigma C / 2 while the record claims sigma (the test's broken mechanism)."""

    def noise_std(self) -> float:
        return super().noise_std() / 2


HALF_NOISE = TrainerSpec("tests:half_noise", private=True, engine=HalfNoiseEngine)
DELTA, SIGNIFICANCE, M = 1e-5, 0.05, 50_000


def bounds(record: TrainingRecord) -> tuple[float, float, float, bool]:
    """(accountant's epsilon of the claim, one-run bound, claimed-curve bound, claim rejected)."""
    canaries, dp = record.gradient_canaries, record.dp
    assert inclusion_check(canaries)[0]
    sigma, q, steps = dp.noise_multiplier, dp.sample_rate, dp.steps
    claimed = dp.epsilon(DELTA)  # the accountant's, from the recorded event
    cs = canaries.canary_scores()
    one_run = cs.bound("one_run", delta=DELTA, significance=SIGNIFICANCE)
    curve = claimed_curve_bound(cs, noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA,
                                significance=SIGNIFICANCE)
    return claimed, one_run.epsilon, curve.epsilon, curve.details["rejects_claim"]


def run(tokenizer, dataset, *, sigma, steps, batch, spec=DPSGD):
    """A tiny run with M canaries; its record."""
    cfg = config(f"train.dp.delta={DELTA}", canaries=M, sigma=sigma, steps=steps, batch=batch)
    record = TrainingRecord()
    run_training(dataset, tokenizer, seed=0, spec=spec, config=cfg, record=record)
    return record


def test_sound_and_powerful_at_q_one(tokenizer, make_dataset):
    dataset = make_dataset(tokenizer, 8)  # batch 8 of 8 units: q = 1
    record = run(tokenizer, dataset, sigma=2.0, steps=4, batch=8)
    assert record.dp.sample_rate == 1.0
    claimed, one_run, curve, rejected = bounds(record)
    assert 4 < claimed < 4.5  # mu = sqrt(T) / sigma = 1
    assert one_run <= claimed and curve <= claimed and not rejected
    assert one_run > 0.3 * claimed and curve > 0.3 * claimed  # the rung has power


def test_sound_at_the_runs_q(tokenizer, make_dataset):
    dataset = make_dataset(tokenizer, 16)
    record = run(tokenizer, dataset, sigma=1.0, steps=8, batch=4)
    assert record.dp.sample_rate == 0.25
    claimed, one_run, curve, rejected = bounds(record)
    assert one_run <= claimed and curve <= claimed and not rejected
    assert curve > 0  # canaries in a quarter of the steps still tell


@pytest.mark.parametrize("units, batch, sigma", [(8, 8, 2.0), (16, 8, 3.0)], ids=["q=1", "q=0.5"])
def test_half_the_noise_is_a_violation(units, batch, sigma, tokenizer, make_dataset):
    record = run(tokenizer, make_dataset(tokenizer, units), sigma=sigma, steps=4, batch=batch, spec=HALF_NOISE)
    assert record.dp.noise_multiplier == sigma and record.dp.sample_rate == batch / units  # the claim
    claimed, _, curve, rejected = bounds(record)
    assert rejected and curve > claimed


# --------------------------------------------------------------------------- the sampler check


class DoubleRateCanaries(GradientCanaries):
    """Members included at 2q: more often than a protected unit would be."""

    def draw_sampled(self):
        return self.rng.random(self._members.size) < 2 * self.sample_rate


def test_canaries_included_too_often_are_refused(data, tokenizer, monkeypatch):
    import dpaudit.train.loop as loop

    monkeypatch.setattr(loop, "GradientCanaries", DoubleRateCanaries)
    _, record = train(dpsgd, data, tokenizer, config(canaries=2000, steps=8, batch=4))  # q = 1/4, 2q = 1/2
    consistent, detail = inclusion_check(record.gradient_canaries)
    assert not consistent and "refused" in detail and "mean" in detail


def test_sampler_check_refusals():
    rng = np.random.default_rng(0)
    M, T, q = 4000, 10, 0.2
    included = rng.random(M) < 0.5
    good = np.where(included, rng.binomial(T, q, M), 0)

    def check(inclusions, *, rate=q, members=included):
        return inclusion_check(GradientCanaryRecord(included=members, scores=np.zeros(M), inclusions=inclusions,
                                                    steps=T, sample_rate=rate, max_grad_norm=1.0))

    assert check(good)[0]
    leaked = good.copy()
    leaked[np.flatnonzero(~included)[0]] = 1
    consistent, detail = check(leaked)
    assert not consistent and "non-member" in detail
    shared = np.where(included, rng.binomial(T, q), 0)  # all members in or out together: no variance
    consistent, detail = check(shared)
    assert not consistent and "variance" in detail
    assert not check(good + included)[0]  # one inclusion too many each
    assert not check(np.where(included, T + 1, 0))[0]  # more inclusions than steps
    assert check(np.where(included, T, 0), rate=1.0)[0]  # q = 1: every member in every step
    short = np.where(included, T, 0)
    short[np.flatnonzero(included)[0]] = T - 1
    assert not check(short, rate=1.0)[0]
