"""Faulty trainers break exactly what they claim to, and still claim the correct guarantee."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_train_engine import build, engine, sequences

from dpaudit.config import load_config
from dpaudit.train import faulty
from dpaudit.train.engine import DPSGDEngine

BASE = ["data.max_length=32", "train.eval_every=100", "train.dp.noise_multiplier=1.0"]


def flat(eng):
    return torch.cat([p.grad.flatten() for p in eng.params.values()])


def update(cls, units, *, sigma=0.0, C=0.2, B=4, seed=0):
    eng = engine(build("gpt2"), cls, sigma=sigma, C=C, B=B)
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
                                 faulty.RealisedBatchSizeEngine])
def test_faulty_engines_survive_empty_batches_and_carried_users(cls):
    assert torch.isfinite(update(cls, [], sigma=1.0)).all()
    users = [[s for s in sequences([4, 5, 6, 7, 3], seed=2)], [sequences([5], seed=3)[0]]]
    assert torch.isfinite(update(cls, users, sigma=1.0)).all()


def test_realised_batch_size():
    good = update(DPSGDEngine, UNITS, B=4)
    bad = update(faulty.RealisedBatchSizeEngine, UNITS, B=4)
    assert torch.allclose(bad, good * 4 / 3, rtol=1e-5, atol=1e-8)


def test_shuffle_as_poisson_is_caught_by_sampler_check(make_dataset, tokenizer, tmp_path):
    train = make_dataset(tokenizer, 24)
    config = load_config("tiny", overrides=[*BASE, "train.steps=40", "train.batch_size=6", "model.size=tiny"])
    faulty.shuffle_as_poisson(train, tokenizer, seed=0, config=config, run_dir=tmp_path / "bad")
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
    model = faulty.FAULTY_TRAINERS[name](train, tokenizer, seed=0, config=config, run_dir=tmp_path)
    assert isinstance(model, torch.nn.Module)
    record = json.loads((tmp_path / "dp_event.json").read_text())
    assert record["noise_multiplier"] == 1.0 and record["epsilon"] > 0
    assert record["trainer"] == f"dpaudit.train.faulty:{name}"


