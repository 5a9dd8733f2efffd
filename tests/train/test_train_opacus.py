"""The Opacus adapter agrees with our engine, and fixes GPT-2's broadcast position ids."""

from __future__ import annotations

import json

import pytest
import torch
from test_train_engine import assert_close, build, engine, sequences
from recorded import train_recorded

from dpaudit.config import load_config
from dpaudit.errors import InputError
from dpaudit.train.engine import DPSGDEngine

pytest.importorskip("opacus")

BASE = ["data.max_length=32", "train.eval_every=100", "train.dp.noise_multiplier=1.0"]


def flat(eng):
    return torch.cat([p.grad.flatten() for p in eng.params.values()])

@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_opacus_adapter_matches_our_engine(arch):
    from dpaudit.train.opacus import OpacusEngine

    units = [[s] for s in sequences([7, 3, 9, 5, 4], seed=1)]
    updates, norms = {}, {}
    for cls in (DPSGDEngine, OpacusEngine):
        eng = engine(build(arch), cls, C=0.05, B=4, microbatch=2)
        stats = eng.step(units)
        assert stats.clipped_units == 5
        assert sorted(stats.unit_index) == list(range(5))  # whose norm is whose (issue 29)
        norms[cls.__name__] = [dict(zip(stats.unit_index, stats.unit_norms))[u] for u in range(5)]
        updates[cls.__name__] = {n: p.grad.clone() for n, p in eng.params.items()}
        eng.close()
    assert_close(updates["OpacusEngine"], updates["DPSGDEngine"])
    assert norms["OpacusEngine"] == pytest.approx(norms["DPSGDEngine"], rel=1e-3)


def test_opacus_needs_explicit_position_ids(monkeypatch):
    """The trap the adapter fixes: with GPT-2's broadcast (1, L) position ids Opacus fails."""
    import dpaudit.train.opacus as adapter
    from dpaudit.train.engine import _logits

    monkeypatch.setattr(adapter, "forward_logits", lambda model, batch: _logits(
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)))
    eng = engine(build("gpt2"), adapter.OpacusEngine, C=0.05, B=4)
    with pytest.raises(RuntimeError):
        eng.step([[s] for s in sequences([7, 3, 9], seed=1)])
    eng.close()


def test_opacus_noise_and_empty_batch():
    from dpaudit.train.opacus import OpacusEngine

    eng = engine(build("gpt2"), OpacusEngine, sigma=2.0, C=0.5, B=4)
    eng.step([], torch.Generator().manual_seed(0))
    assert float(flat(eng).std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.02)
    eng.close()


def test_opacus_trainer_end_to_end(make_dataset, tokenizer, tmp_path):
    from dpaudit.train.opacus import dpsgd

    train = make_dataset(tokenizer, 16)
    config = load_config("tiny", overrides=[*BASE, "train.steps=2"])
    model = train_recorded(dpsgd, tmp_path, train, tokenizer, seed=0, config=config)
    assert not hasattr(model, "autograd_grad_sample_hooks")  # hooks removed
    record = json.loads((tmp_path / "dp_event.json").read_text())
    assert record["trainer"] == "dpaudit.train.opacus:dpsgd"
    assert json.loads((tmp_path / "train_checks.json").read_text())["ok"]
    with pytest.raises(InputError, match="does not support train.dp.unit=user"):
        dpsgd(make_dataset(tokenizer, 16, users=4), tokenizer, seed=0,
              config=load_config("tiny", overrides=[*BASE, "train.dp.unit=user", "train.batch_size=2"]))
