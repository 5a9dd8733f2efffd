"""Who was clipped (issue 29): the loop's per-unit record of a DP run, and a synthetic run whose
groups are clipped at known, different rates, recovered by the group statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.audit.groups import UnitClipping, clipping
from dpaudit.config import load_config
from dpaudit.train import TrainingRecord
from dpaudit.train.engine import DPSGDEngine
from dpaudit.train.loop import DPSGD, TrainerSpec, run_training

BASE = ["data.max_length=32", "train.eval_every=1000", "train.dp.noise_multiplier=1.0", "model.size=tiny",
        "train.dp.max_grad_norm=1.0", "train.dp.reproducible=true"]
MINORITY_TOKEN, MAJORITY_TOKEN = 5, 6
#: P(norm > C): a norm uniform on [0, a * C] exceeds C with probability 1 - 1 / a
RATES = {"rare": 0.6, "common": 0.1}


class SyntheticNormEngine(DPSGDEngine):
    """The real clipped sum, with each unit's recorded pre-clipping norm replaced by a draw
    whose clipping probability depends only on the unit's group (its first token)."""

    rng = np.random.default_rng(0)

    def step(self, units, generator=None):
        self._units = units
        return super().step(units, generator)

    def record_norms(self, norms, stats, units=None):
        groups = ["rare" if int(self._units[u][0][0]) == MINORITY_TOKEN else "common" for u in units]
        fake = [self.rng.uniform(0, self.max_grad_norm / (1 - RATES[g])) for g in groups]
        super().record_norms(torch.tensor(fake, dtype=torch.float64), stats, units)


def _dataset(make_dataset, tokenizer, n: int, minority: int):
    ds = make_dataset(tokenizer, n, seed=4)
    ids = ds["input_ids"]
    ids = [[MINORITY_TOKEN if i < minority else MAJORITY_TOKEN] + row[1:] for i, row in enumerate(ids)]
    return ds.remove_columns("input_ids").add_column("input_ids", ids)


def test_a_known_disparate_clipping_rate_is_recovered(make_dataset, tokenizer):
    n, minority = 40, 10
    train = _dataset(make_dataset, tokenizer, n, minority)
    config = load_config("tiny", overrides=[*BASE, "train.steps=150", "train.batch_size=8"])
    record = TrainingRecord()
    spec = TrainerSpec("tests:synthetic_norms", private=True, engine=SyntheticNormEngine)
    run_training(train, tokenizer, seed=0, spec=spec, config=config, record=record)
    uc = record.unit_clipping
    assert isinstance(uc, UnitClipping) and uc.max_grad_norm == 1.0
    assert list(uc.unit_ids) == [f"r{i}" for i in range(n)]
    assert uc.sampled.sum() == sum(r["batch_size"] for r in record.log if r["step"] > 0)
    rare = {f"r{i}" for i in range(minority)}
    for group, keep in (("rare", lambda u: u in rare), ("common", lambda u: u not in rare)):
        c = clipping(uc, keep)
        est = c["clipped_share"]
        assert est.low <= RATES[group] <= est.high, (group, est)
        assert abs(est.value - RATES[group]) < 0.08
        # the mean pre-clipping norm of a uniform on [0, a C]: a C / 2
        assert c["mean_norm"].value == pytest.approx(0.5 / (1 - RATES[group]), rel=0.15)
    assert clipping(uc, lambda u: u in rare)["units"] == minority


def test_the_real_engine_records_each_unit(make_dataset, tokenizer):
    """Every sampled unit-step counted once, norms finite and the clipped count the log's."""
    train = make_dataset(tokenizer, 16, users=5)
    config = load_config("tiny", overrides=[*BASE, "train.steps=6", "train.batch_size=4", "train.dp.unit=user",
                                            "train.dp.max_grad_norm=0.5"])
    record = TrainingRecord()
    run_training(train, tokenizer, seed=0, spec=DPSGD, config=config, record=record)
    uc = record.unit_clipping
    assert sorted(uc.unit_ids) == sorted(set(train["unit_id"]))
    assert uc.sampled.sum() == sum(r["batch_size"] for r in record.log if r["step"] > 0)
    clipped = sum(r["clipped_fraction"] * r["batch_size"] for r in record.log if r["step"] > 0)
    assert uc.clipped.sum() == pytest.approx(clipped)
    assert np.all(uc.norm_sum[uc.sampled > 0] > 0) and np.all(uc.norm_sum[uc.sampled == 0] == 0)


def test_a_unit_twice_in_one_batch_is_counted_twice(make_dataset, tokenizer):
    """A shuffling sampler whose batch crosses an epoch can hold a unit twice (the faulty
    ``shuffle_as_poisson``): each appearance is a sampled unit-step, as each is clipped."""
    from dpaudit.train.faulty import SPECS

    train = make_dataset(tokenizer, 6)
    config = load_config("tiny", overrides=[*BASE, "train.steps=7", "train.batch_size=4"])
    record = TrainingRecord()
    run_training(train, tokenizer, seed=0, spec=SPECS["shuffle_as_poisson"], config=config, record=record)
    uc = record.unit_clipping
    assert uc.sampled.sum() == sum(r["batch_size"] for r in record.log if r["step"] > 0) == 28
    assert np.all(uc.clipped <= uc.sampled)


def test_a_nonprivate_run_records_no_clipping(make_dataset, tokenizer):
    from dpaudit.train.loop import NONPRIVATE

    record = TrainingRecord()
    run_training(make_dataset(tokenizer, 8), tokenizer, seed=0, spec=NONPRIVATE,
                 config=load_config("tiny", overrides=[*BASE[:2], "model.size=tiny", "train.steps=2"]),
                 record=record)
    assert record.unit_clipping is None
