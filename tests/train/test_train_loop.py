"""The training loop end to end: trainers, run directory, determinism, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from recorded import train_recorded

from dpaudit import accounting
from dpaudit.config import TrainConfig, load_config
from dpaudit.errors import InputError
from dpaudit.train import dpsgd, nonprivate
from dpaudit.train import TrainingRecord
from dpaudit.train.engine import DPSGDEngine, StepStats
from dpaudit.train.loop import TrainerSpec, run_training
from dpaudit.train.plan import lr_factor, num_steps

BASE = ["data.max_length=32", "train.eval_every=3", "train.steps=4"]


def cfg(*overrides):
    return load_config("tiny", overrides=[*BASE, *overrides])


@pytest.fixture(scope="module")
def data(make_dataset, tokenizer):
    return make_dataset(tokenizer, 24, pad_to=32), make_dataset(tokenizer, 6, seed=9)


def read_log(run_dir, *, baseline=False):
    """The per-step records (with ``baseline``: also the step-0 evaluation before training)."""
    log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    return log if baseline else [r for r in log if r["step"] > 0]


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_nonprivate_run_directory(tokenizer, data, tmp_path):
    train, held_out = data
    config = cfg("train.checkpoint_every=2", "train.schedule=cosine", "train.warmup_steps=1")
    model = train_recorded(nonprivate, tmp_path, train, tokenizer, seed=0, config=config, eval_dataset=held_out)
    baseline = read_log(tmp_path, baseline=True)[0]
    assert baseline["step"] == 0 and baseline["heldout_loss"] > 0 and "train_loss" not in baseline
    log = read_log(tmp_path)
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert log[-1]["heldout_loss"] < baseline["heldout_loss"]
    assert all(r["batch_size"] == 8 and math.isfinite(r["train_loss"]) for r in log)
    assert {"heldout_loss", "heldout_perplexity", "train_eval_loss", "train_perplexity"} <= set(log[2]) & set(log[3])
    assert "heldout_loss" not in log[0]
    assert log[3]["heldout_perplexity"] == pytest.approx(math.exp(log[3]["heldout_loss"]))
    assert [r["lr"] for r in log] == pytest.approx([0.003 * lr_factor(s, schedule="cosine", warmup_steps=1, total_steps=4)
                                                    for s in range(4)])
    event = json.loads((tmp_path / "dp_event.json").read_text())
    assert event["event"] == {"type": "non_private"} and event["epsilon"] is None
    assert accounting.epsilon_from_record(tmp_path) == math.inf
    checks = json.loads((tmp_path / "train_checks.json").read_text())
    assert checks["ok"] and checks["parameters"]["all_moved"]
    assert checks["batch_size"]["mean"] == 8 and checks["batch_size"]["consistent"] is None
    for step in (2, 4):
        saved = tmp_path / "checkpoints" / f"step-{step}"
        assert (saved / "config.json").exists() and (saved / "model.safetensors").exists()
        assert (saved / "tokenizer.json").exists()
    assert not list(tmp_path.glob("**/*.tmp"))
    assert isinstance(model, torch.nn.Module)


def test_dpsgd_run_directory(tokenizer, data, tmp_path):
    train, held_out = data
    config = cfg("train.dp.noise_multiplier=1.5", "train.dp.max_grad_norm=0.5", "train.dp.delta=0.0001")
    train_recorded(dpsgd, tmp_path, train, tokenizer, seed=0, config=config, eval_dataset=held_out)
    record = json.loads((tmp_path / "dp_event.json").read_text())
    assert record["trainer"] == "dpaudit.train:dpsgd"
    assert record["sample_rate"] == pytest.approx(8 / 24)
    assert record["num_units"] == 24 and record["unit"] == "example" and record["steps"] == 4
    assert record["noise_multiplier"] == 1.5 and record["max_grad_norm"] == 0.5 and record["delta"] == 1e-4
    assert record["expected_batch_size"] == 8 and record["accountant"] == "pld"
    assert record["epsilon"] == pytest.approx(
        accounting.epsilon(noise_multiplier=1.5, sample_rate=8 / 24, steps=4, delta=1e-4)
    )
    assert accounting.epsilon_from_record(tmp_path) == pytest.approx(record["epsilon"])
    checks = json.loads((tmp_path / "train_checks.json").read_text())
    assert checks["ok"], checks
    assert checks["sampler"] == "poisson"
    assert checks["batch_size"]["expected_mean"] == pytest.approx(8)
    assert checks["non_finite"] == {"updates": 0, "unit_gradients": 0, "losses": 0}
    log = read_log(tmp_path)
    assert all("clipped_fraction" in r for r in log)


def test_user_level_counts_users(make_dataset, tokenizer, tmp_path):
    train = make_dataset(tokenizer, 30, users=10)
    config = cfg("train.dp.target_epsilon=6", "train.dp.unit=user", "train.batch_size=4", "train.microbatch_size=4")
    train_recorded(dpsgd, tmp_path, train, tokenizer, seed=0, config=config)
    record = json.loads((tmp_path / "dp_event.json").read_text())
    users = len(set(train["unit_id"]))
    assert record["unit"] == "user" and record["num_units"] == users
    assert record["sample_rate"] == pytest.approx(4 / users)
    assert record["delta"] == accounting.default_delta(users)
    assert record["target_epsilon"] == 6 and record["epsilon"] <= 6 and record["epsilon"] > 5.99
    log = read_log(tmp_path)
    assert any(r["examples"] > r["batch_size"] for r in log)  # users have several rows


def test_deterministic_given_seed(tokenizer, data):
    train, _ = data
    config = cfg("train.dp.noise_multiplier=1.0")
    a = params(dpsgd(train, tokenizer, seed=3, config=config))
    b = params(dpsgd(train, tokenizer, seed=3, config=config))
    c = params(dpsgd(train, tokenizer, seed=4, config=config))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], c[n]) for n in a)
    d = params(nonprivate(train, tokenizer, seed=3, config=cfg()))
    e = params(nonprivate(train, tokenizer, seed=3, config=cfg()))
    assert all(torch.equal(d[n], e[n]) for n in d)


def test_the_loop_reads_what_a_step_saw_after_its_optimizer_step(tokenizer, data, monkeypatch):
    """The losses and norms are read once the step's update is queued (tests/train/test_step_waits.py)."""
    events = []
    read = StepStats._read

    def spy(self, kind):
        events.append(self)  # the object, not its id: a freed step's id can come back for the next
        return read(self, kind)

    monkeypatch.setattr(StepStats, "_read", spy)
    handle = register_optimizer_step_post_hook(lambda *args: events.append("step"))
    try:
        dpsgd(data[0], tokenizer, seed=0, config=cfg("train.dp.noise_multiplier=1.0", "train.steps=3"))
    finally:
        handle.remove()
    first_reads = {}
    for position, event in enumerate(events):
        if not isinstance(event, str):
            first_reads.setdefault(id(event), position)
    assert events.count("step") == 3 and len(first_reads) == 3
    for k, position in enumerate(sorted(first_reads.values())):  # step k's statistics after k + 1 optimizer steps
        assert events[:position].count("step") == k + 1


class _NanAtLastStep(DPSGDEngine):
    """A NaN in one entry of the update of the fourth step (the model is NaN after it)."""

    steps = 0

    def normalize(self, noisy, realised_batch_size):
        update = super().normalize(noisy, realised_batch_size)
        self.steps += 1
        if self.steps == 4:
            next(iter(update.values())).view(-1)[3] = math.nan
        return update


def test_the_loop_counts_non_finite_updates(tokenizer, data):
    record = TrainingRecord()
    spec = TrainerSpec("tests:nan_at_last_step", private=True, engine=_NanAtLastStep)
    run_training(data[0], tokenizer, seed=0, spec=spec, record=record,
                 config=cfg("train.dp.noise_multiplier=1.0", "train.dp.engine=vmap", "train.steps=4"))
    assert record.checks["non_finite"] == {"updates": 1, "unit_gradients": 0, "losses": 0}


def test_training_does_not_touch_global_rng(tokenizer, data):
    train, _ = data
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    dpsgd(train, tokenizer, seed=0, config=cfg("train.dp.noise_multiplier=1.0", "train.steps=1"))
    assert torch.equal(torch.rand(3), expected)


def test_plugin_contract_without_config(tokenizer, data):
    train, _ = data
    model = dpsgd(train.select(range(16)), tokenizer, seed=0)
    assert model.config.vocab_size >= len(tokenizer)
    model = nonprivate(train.select(range(16)), tokenizer, seed=0)
    assert model.config.model_type == "gpt2"


def test_nonprivate_learns(tokenizer, data):
    train, held_out = data
    config = cfg("train.steps=30", "train.eval_every=30", "train.lr=0.01")
    model = nonprivate(train, tokenizer, seed=0, config=config)
    from dpaudit.train.evaluate import evaluate
    from dpaudit.train.units import prepare_sequences

    loss, _ = evaluate(model, prepare_sequences(train, max_length=32, pad_id=tokenizer.pad_token_id),
                       batch_size=8, pad_id=tokenizer.pad_token_id, device=torch.device("cpu"))
    assert loss < math.log(len(tokenizer)) - 1.0


def test_lora_trains_only_adapters(tokenizer, data, tmp_path):
    train, _ = data
    config = cfg("model.lora.enabled=true", "model.lora.r=2", "train.dp.noise_multiplier=1.0", "train.steps=2")
    model = train_recorded(dpsgd, tmp_path, train, tokenizer, seed=0, config=config)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    checks = json.loads((tmp_path / "train_checks.json").read_text())
    assert checks["parameters"]["num_trainable"] == len(trainable) and checks["parameters"]["all_moved"]
    from dpaudit.models import make_model
    from dpaudit.train.sampling import RunSeeds

    fresh = dict(make_model(config.model, tokenizer, seed=RunSeeds.from_seed(0).model).named_parameters())
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, fresh[name]), name


def test_other_architecture_as_base_model(tokenizer, data, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=64, bos_token_id=tokenizer.eos_token_id,
                                        eos_token_id=tokenizer.eos_token_id))
    base.save_pretrained(tmp_path / "base")
    train, held_out = data
    config = cfg(f"model.base_model={tmp_path / 'base'}", "train.dp.noise_multiplier=1.0", "train.steps=2")
    model = train_recorded(dpsgd, tmp_path / "run", train, tokenizer, seed=0, config=config, eval_dataset=held_out)
    assert model.config.model_type == "llama"
    assert model.config._attn_implementation != "eager" or base.config._attn_implementation == "eager"
    assert json.loads((tmp_path / "run" / "train_checks.json").read_text())["ok"]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([], "exactly one of noise_multiplier and target_epsilon, got neither"),
        (["train.dp.noise_multiplier=1.0", "train.dp.target_epsilon=2.0"], "got both"),
        (["train.dp.noise_multiplier=1.0", "train.batch_size=30"], r"q = batch_size / N .* must be in \(0, 1\]"),
        (["train.dp.target_epsilon=0.001", "train.steps=5000", "train.dp.delta=0.00000001"], "cannot be reached"),
    ],
)
def test_bad_dp_config(tokenizer, data, overrides, message):
    train, _ = data
    with pytest.raises(InputError, match=message):
        dpsgd(train, tokenizer, seed=0, config=cfg(*overrides))


def test_config_level_bad_input():
    with pytest.raises(InputError, match="noise_multiplier must be > 0"):
        cfg("train.dp.noise_multiplier=0")
    with pytest.raises(InputError, match="delta must be in"):
        cfg("train.dp.noise_multiplier=1.0", "train.dp.delta=1.5")


def test_plan_rejects_bad_values_that_bypass_config():
    from dpaudit.config import DPConfig
    from dpaudit.train.plan import plan_privacy

    with pytest.raises(InputError, match="must be > 0"):
        plan_privacy(DPConfig(noise_multiplier=-1.0), batch_size=4, num_units=10, steps=5)
    with pytest.raises(InputError, match=r"delta must be in \(0, 1\)"):
        plan_privacy(DPConfig(noise_multiplier=1.0, delta=0.0), batch_size=4, num_units=10, steps=5)


def test_user_unit_needs_unit_column(tokenizer, data):
    train, _ = data
    with pytest.raises(InputError, match="no unit_id column"):
        dpsgd(train.remove_columns("unit_id"), tokenizer, seed=0,
              config=cfg("train.dp.noise_multiplier=1.0", "train.dp.unit=user"))


def test_large_delta_warns(tokenizer, data):
    train, _ = data
    with pytest.warns(UserWarning, match="delta"):
        dpsgd(train, tokenizer, seed=0, config=cfg("train.dp.noise_multiplier=1.0", "train.dp.delta=0.1", "train.steps=1"))


def test_num_steps_and_schedule():
    config = load_config("tiny", overrides=["train.epochs=2.5", "train.batch_size=8"])
    assert num_steps(config.train, 40) == 13  # ceil(2.5 * 40 / 8)
    config = load_config("tiny", overrides=["train.steps=7"])
    assert num_steps(config.train, 40) == 7
    assert [lr_factor(s, schedule="linear", warmup_steps=2, total_steps=6) for s in range(6)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    )
    assert lr_factor(5, schedule="cosine", warmup_steps=0, total_steps=10) == pytest.approx(0.5)
    assert lr_factor(9, schedule="constant", warmup_steps=0, total_steps=10) == 1.0


def test_nonprivate_warns_when_dp_is_configured(tokenizer, data):
    train, _ = data
    with pytest.warns(UserWarning, match="not private"):
        nonprivate(train, tokenizer, seed=0, config=cfg("train.dp.noise_multiplier=1.0", "train.steps=1"))


@pytest.mark.slow
def test_demo_sized_dpsgd_user_level(make_dataset, tokenizer, tmp_path):
    train = make_dataset(tokenizer, 200, users=50, max_length=128)
    config = load_config("demo", overrides=["train.trainer=dpaudit.train:dpsgd", "train.dp.target_epsilon=8",
                                            "train.dp.unit=user", "train.epochs=2", "train.eval_every=10"])
    train_recorded(dpsgd, tmp_path, train, tokenizer, seed=0, config=config, eval_dataset=make_dataset(tokenizer, 20, seed=3))
    checks = json.loads((tmp_path / "train_checks.json").read_text())
    assert checks["ok"], checks
    record = json.loads((tmp_path / "dp_event.json").read_text())
    assert record["num_units"] == 50 and record["epsilon"] <= 8


def _impulse_responses(make, steps, *, adam, copies=4000):
    """The final parameter's response to a unit gradient at each step, from torch's own
    optimizer: one coordinate per step. For AdamW every coordinate also gets noise of size 1
    at every step (random signs: noise of constant power), the response is the difference that
    an impulse of 1e-4 makes, averaged over ``copies`` independent coordinates."""
    rng = np.random.default_rng(0)
    n = copies if adam else 1
    g = torch.from_numpy(rng.choice([-1.0, 1.0], size=(steps, n, steps))) if adam \
        else torch.zeros(steps, n, steps, dtype=torch.float64)
    finals = []
    for impulse in (0.0, 1e-4):
        p = torch.zeros(n, steps, dtype=torch.float64, requires_grad=True)
        opt, sched = make([p])
        for t in range(steps):
            p.grad = g[t].clone()
            p.grad[:, t] += impulse
            opt.step()
            sched.step()
        finals.append(p.detach().clone())
    return -(finals[1] - finals[0]).mean(0).numpy() / 1e-4


@pytest.mark.parametrize("optimizer, extra", [("sgd", {}), ("sgd", {"momentum": 0.9, "weight_decay": 0.1}),
                                              ("adamw", {}), ("adamw", {"weight_decay": 0.5})])
def test_step_weights_are_torchs_own_final_model(optimizer, extra):
    """plan.step_weights against the optimizers of make_optimizer, run step by step."""
    from dpaudit.train.plan import make_optimizer, step_weights

    steps = 12
    train = TrainConfig(trainer="dpaudit.train:dpsgd", optimizer=optimizer, lr=0.1, schedule="cosine", warmup_steps=3,
                        **extra)

    def make(params):
        opt = make_optimizer(params, train)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(
            s, schedule=train.schedule, warmup_steps=train.warmup_steps, total_steps=steps))

    expected = _impulse_responses(make, steps, adam=optimizer == "adamw")
    assert step_weights(train, steps) == pytest.approx(expected / expected.max(), abs=0.02)
    assert step_weights(TrainConfig(trainer="dpaudit.train:dpsgd", optimizer="sgd"), 5) == [1.0] * 5
    assert step_weights(TrainConfig(trainer="my_pkg.train:loop"), 5) is None  # a plug-in's rule is unknown


def test_optimizer_response_is_the_loops_update():
    """plan.optimizer_response: SGD (momentum, coupled weight decay, cosine schedule with
    warm-up) is linear, its response to each step's gradient the step weights; AdamW's first
    update is the learning rate times the gradient's sign; a plug-in's rule is unknown."""
    from dpaudit.train.plan import optimizer_response, step_weights

    steps, rng = 12, np.random.default_rng(0)
    sgd = TrainConfig(trainer="dpaudit.train:dpsgd", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.1,
                      schedule="cosine", warmup_steps=3)
    grads = rng.normal(size=(steps, 5, 3))
    weights = np.asarray(step_weights(sgd, steps))
    moved = optimizer_response(sgd, steps)(iter(grads))
    expected = -np.tensordot(weights, grads, 1)  # relative to the largest weight: a common scale
    scale = (moved.ravel() @ expected.ravel()) / (expected.ravel() @ expected.ravel())
    assert scale > 0 and moved == pytest.approx(scale * expected, rel=1e-4, abs=1e-6)
    adamw = TrainConfig(trainer="dpaudit.train:dpsgd", optimizer="adamw", lr=0.01)
    assert optimizer_response(adamw, 1)(iter(grads[:1])) == pytest.approx(-0.01 * np.sign(grads[0]), rel=1e-5)
    assert optimizer_response(TrainConfig(trainer="my_pkg.train:loop"), steps) is None
