"""Faulty trainers break exactly what they claim to, and still claim the correct guarantee."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_train_engine import build, engine, sequences
from recorded import train_recorded

from dpaudit.config import load_config
from dpaudit.train import faulty
from dpaudit.train.engine import CLIP_EPS, DPSGDEngine
from dpaudit.train.ghost import GhostClippingEngine, choose_engine

BASE = ["data.max_length=32", "train.eval_every=100", "train.dp.noise_multiplier=1.0"]


def flat(eng):
    return torch.cat([p.grad.flatten() for p in eng.params.values()])


def update(cls, units, *, sigma=0.0, C=0.2, B=4, seed=0, **options):
    eng = engine(build("gpt2"), cls, sigma=sigma, C=C, B=B, **options)
    eng.step(units, torch.Generator().manual_seed(seed))
    eng.close()
    return flat(eng)


UNITS = [[s] for s in sequences([6, 3, 8], seed=11)]


def test_no_noise():
    assert torch.equal(update(faulty.NoNoiseEngine, UNITS, sigma=2.0), update(DPSGDEngine, UNITS, sigma=0.0))


def test_unscaled_noise():
    clean = update(DPSGDEngine, UNITS)
    good = update(DPSGDEngine, UNITS, sigma=2.0) - clean
    bad = update(faulty.UnscaledNoiseEngine, UNITS, sigma=2.0) - clean
    assert float(good.std()) == pytest.approx(2.0 * 0.2 / 4, rel=0.02)
    assert float(bad.std()) == pytest.approx(2.0 / 4, rel=0.02)


def test_batch_clipping():
    good = update(DPSGDEngine, UNITS, C=0.2)
    bad = update(faulty.BatchClippingEngine, UNITS, C=0.2)
    assert float(bad.norm()) == pytest.approx(0.2 / 4, rel=1e-4)  # the whole sum clipped to C
    assert float(good.norm()) > float(bad.norm()) * 1.5  # each example clipped to C
    unclipped = update(DPSGDEngine, UNITS, C=math.inf)
    huge = update(faulty.BatchClippingEngine, UNITS, C=1e9)
    assert torch.allclose(huge, unclipped, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("cls", [faulty.NoNoiseEngine, faulty.UnscaledNoiseEngine, faulty.BatchClippingEngine,
                                 faulty.RealisedBatchSizeEngine, faulty.MeanNoiseOnSumEngine,
                                 faulty.NoisyMicrostepsEngine, faulty.NonfinitePassthroughEngine,
                                 faulty.UnclippedParamsEngine, faulty.ReusedNoiseEngine])
def test_faulty_engines_survive_empty_batches_and_carried_users(cls):
    assert torch.isfinite(update(cls, [], sigma=1.0)).all()
    users = [[s for s in sequences([4, 5, 6, 7, 3], seed=2)], [sequences([5], seed=3)[0]]]
    assert torch.isfinite(update(cls, users, sigma=1.0)).all()
    eng = engine(build("gpt2"), cls, sigma=1.0, C=1.0)
    stats = eng.step(users, torch.Generator().manual_seed(0))
    assert sorted(stats.unit_index) == [0, 1]  # every engine says whose norm is whose (issue 29)
    eng.close()


@pytest.mark.parametrize("name", sorted(faulty.SPECS))
def test_the_loops_engine_makes_the_vmap_engines_update(name):
    """The trainer's engine (:func:`~dpaudit.train.ghost.choose_engine`): ghost clipping under
    the faulty overrides where the fault is not in the gradients, the same update as on vmap."""
    cls = faulty.SPECS[name].engine
    chosen, options = choose_engine(cls, "ghost")
    assert issubclass(chosen, GhostClippingEngine) == (name not in {"batch_clipping", "unclipped_params"})
    users = [sequences([4, 5, 6], seed=2), sequences([5], seed=3), sequences([7, 3], seed=4)]
    torch.testing.assert_close(update(chosen, users, sigma=1.0, C=0.05, **options),
                               update(cls, users, sigma=1.0, C=0.05), rtol=1e-4, atol=1e-6)


def test_realised_batch_size():
    good = update(DPSGDEngine, UNITS, B=4)
    bad = update(faulty.RealisedBatchSizeEngine, UNITS, B=4)
    assert torch.allclose(bad, good * 4 / 3, rtol=1e-5, atol=1e-8)


def test_shuffle_as_poisson_is_caught_by_sampler_check(make_dataset, tokenizer, tmp_path):
    train = make_dataset(tokenizer, 24)
    config = load_config("tiny", overrides=[*BASE, "train.steps=40", "train.batch_size=6", "model.size=tiny"])
    train_recorded(faulty.shuffle_as_poisson, tmp_path / "bad", train, tokenizer, seed=0, config=config)
    checks = json.loads((tmp_path / "bad" / "train_checks.json").read_text())
    assert checks["sampler"] == "poisson"  # it claims Poisson...
    assert checks["batch_size"]["variance"] == 0.0  # ...but every batch has 6 units
    assert checks["batch_size"]["consistent"] is False and not checks["ok"]
    record = json.loads((tmp_path / "bad" / "dp_event.json").read_text())
    assert record["event"]["event"]["type"] == "poisson_sampled"
    assert record["trainer"] == "dpaudit.train.faulty:shuffle_as_poisson"


@pytest.mark.parametrize("name", sorted(faulty.FAULTY_TRAINERS))
def test_faulty_trainers_follow_the_contract(make_dataset, tokenizer, tmp_path, name):
    train = make_dataset(tokenizer, 16)
    config = load_config("tiny", overrides=[*BASE, "train.steps=2"])
    model = train_recorded(faulty.FAULTY_TRAINERS[name], tmp_path, train, tokenizer, seed=0, config=config)
    assert isinstance(model, torch.nn.Module)
    record = json.loads((tmp_path / "dp_event.json").read_text())
    assert record["noise_multiplier"] == 1.0 and record["epsilon"] > 0
    assert record["trainer"] == f"dpaudit.train.faulty:{name}"




# --------------------------------------------------------------------------- the real-library bug classes


def params_and_flat(cls, units, *, sigma=0.0, C=0.2, B=4, seed=0, steps=1):
    """The engine after ``steps`` steps (no optimizer step in between: the parameters stay
    put, so every step sees the same gradients) and the flat update of each step."""
    eng = engine(build("gpt2"), cls, sigma=sigma, C=C, B=B)
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for _ in range(steps):
        eng.step(units, generator)
        updates.append(flat(eng))
    eng.close()
    return eng, updates


def test_mean_noise_on_sum_has_b_times_too_little_noise():
    B = 4
    clean = update(DPSGDEngine, UNITS, B=B)
    good = update(DPSGDEngine, UNITS, sigma=2.0, B=B) - clean
    bad = update(faulty.MeanNoiseOnSumEngine, UNITS, sigma=2.0, B=B) - clean
    # ~1e5 coordinates: each std estimate is within ~0.5%
    assert float(good.std()) == pytest.approx(2.0 * 0.2 / B, rel=0.02)
    assert float(bad.std()) == pytest.approx(2.0 * 0.2 / B**2, rel=0.02)
    assert float(bad.std()) / float(good.std()) == pytest.approx(1 / B, rel=0.03)
    assert torch.equal(update(faulty.MeanNoiseOnSumEngine, UNITS, sigma=0.0, B=B), clean)  # nothing else changed


def test_noisy_microsteps_is_over_noised_by_sqrt_k():
    k = faulty.MICROSTEPS
    clean = update(DPSGDEngine, UNITS)
    good = update(DPSGDEngine, UNITS, sigma=2.0) - clean
    bad = update(faulty.NoisyMicrostepsEngine, UNITS, sigma=2.0) - clean
    assert float(bad.std()) / float(good.std()) == pytest.approx(math.sqrt(k), rel=0.03)
    # without noise, accumulating the micro-steps is exact
    assert torch.allclose(update(faulty.NoisyMicrostepsEngine, UNITS), clean, rtol=1e-5, atol=1e-8)
    assert "noisy_microsteps" in faulty.CONSERVATIVE and len(faulty.CONSERVATIVE) == 1


def test_reused_noise_repeats_the_same_noise_vector():
    units_b = [[s] for s in sequences([5, 7], seed=12)]
    _, (clean_a,) = params_and_flat(DPSGDEngine, UNITS)
    _, (clean_b,) = params_and_flat(DPSGDEngine, units_b)
    bad = engine(build("gpt2"), faulty.ReusedNoiseEngine, sigma=2.0, C=0.2)
    generator = torch.Generator().manual_seed(0)
    noises = []
    for units, clean in [(UNITS, clean_a), (units_b, clean_b), (UNITS, clean_a)]:
        bad.step(units, generator)
        noises.append(flat(bad) - clean)
    bad.close()
    assert torch.allclose(noises[0], noises[1], atol=1e-6) and torch.allclose(noises[0], noises[2], atol=1e-6)
    assert float(noises[0].std()) == pytest.approx(2.0 * 0.2 / 4, rel=0.02)  # the right scale, once
    _, good = params_and_flat(DPSGDEngine, UNITS, sigma=2.0, steps=2)
    assert not torch.allclose(good[0] - clean_a, good[1] - clean_a, atol=1e-3)  # the real engine draws afresh


def test_unclipped_params_leave_biases_unclipped():
    C, B = 0.2, 4
    eng, (bad,) = params_and_flat(faulty.UnclippedParamsEngine, UNITS, C=C, B=B)
    _, (raw,) = params_and_flat(DPSGDEngine, UNITS, C=math.inf, B=B)
    _, (good,) = params_and_flat(DPSGDEngine, UNITS, C=C, B=B)
    names = list(eng.params)
    sizes = [p.numel() for p in eng.params.values()]
    is_bias = torch.cat([torch.full((n,), name.endswith("bias")) for name, n in zip(names, sizes)])
    assert eng.unclipped and all(n.endswith("bias") for n in eng.unclipped) and int(is_bias.sum()) > 0
    # biases: the unclipped sum / B, exactly what no clipping at all gives
    assert torch.allclose(bad[is_bias], raw[is_bias], rtol=1e-5, atol=1e-8)
    assert not torch.allclose(good[is_bias], raw[is_bias], rtol=1e-2)
    # the rest: each unit clipped to C over the non-bias parameters only
    assert float(bad[~is_bias].norm()) <= len(UNITS) * C / B * (1 + 1e-5)
    assert float(bad[is_bias].norm()) > C / B  # the biases alone exceed one unit's whole bound


def test_nonfinite_passthrough_clip_factors():
    eng = engine(build("gpt2"), faulty.NonfinitePassthroughEngine, C=1e-4)
    threshold = math.sqrt(65504) / eng.loss_scale  # ~0.0039: the loss-scaled squared norm overflows float16
    norms = torch.tensor([threshold / 2, threshold * 2, 10.0, float("inf"), float("nan")])
    factors = eng.clip_factors(norms)
    eng.close()
    assert float(factors[0]) == pytest.approx(1e-4 / (threshold / 2 + CLIP_EPS), rel=1e-5)  # small norms: clipped correctly
    assert factors[1:].tolist() == [1.0, 1.0, 1.0, 1.0]  # overflowed / non-finite: "no clipping needed"


def test_nonfinite_passthrough_lets_large_gradients_through_unclipped():
    good = update(DPSGDEngine, UNITS, C=0.2)
    bad = update(faulty.NonfinitePassthroughEngine, UNITS, C=0.2)
    unclipped = update(DPSGDEngine, UNITS, C=math.inf)
    assert torch.allclose(bad, unclipped, rtol=1e-5, atol=1e-8)  # every unit's norm is above ~0.004
    assert float(bad.norm()) > 2 * float(good.norm())


@pytest.mark.parametrize("target", [None, 3.0])
def test_microstep_accounting_records_q_over_k_and_k_steps(make_dataset, tokenizer, tmp_path, target):
    from dpaudit import accounting

    k = faulty.MICROSTEPS
    dp = ["train.dp.noise_multiplier=1.0"] if target is None else [f"train.dp.target_epsilon={target}"]
    overrides = ["data.max_length=32", "train.eval_every=100", *dp, "train.steps=16", "train.batch_size=6",
                 "model.size=tiny", "train.dp.accountant=rdp"]  # rdp: fast calibration
    train = make_dataset(tokenizer, 24)
    train_recorded(faulty.microstep_accounting, tmp_path / "bad", train, tokenizer, seed=0,
                   config=load_config("tiny", overrides=overrides))
    record = json.loads((tmp_path / "bad" / "dp_event.json").read_text())
    checks = json.loads((tmp_path / "bad" / "train_checks.json").read_text())
    q = 6 / 24
    assert record["trainer"] == "dpaudit.train.faulty:microstep_accounting"
    assert record["sample_rate"] == pytest.approx(q / k) and record["steps"] == 16 * k
    event = record["event"]
    assert event["event"]["type"] == "poisson_sampled" and event["count"] == 16 * k
    assert event["event"]["sampling_probability"] == pytest.approx(q / k)
    assert record["epsilon"] == pytest.approx(accounting.epsilon_from_record(record), rel=1e-6)
    sigma = record["noise_multiplier"]
    true_eps = accounting.epsilon(noise_multiplier=sigma, sample_rate=q, steps=16, delta=record["delta"],
                                   method="rdp")
    assert record["epsilon"] < true_eps  # the claim understates the real epsilon
    if target is not None:
        assert record["target_epsilon"] == target and record["epsilon"] <= target * (1 + 1e-6)
        assert true_eps > target * 1.2
    # sampling still at rate q: the batch sizes say 6 on average, consistent with the real q
    assert checks["batch_size"]["consistent"] is True
    assert checks["batch_size"]["mean"] == pytest.approx(6, abs=2)
