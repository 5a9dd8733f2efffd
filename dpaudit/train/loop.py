"""The one training loop, shared by non-private training, DP-SGD and the faulty trainers.

A trainer is ``train(dataset, tokenizer, *, seed) -> PreTrainedModel`` (the plug-in
contract); the toolkit's own trainers also take the keyword-only ``config``, ``run_dir``
and ``eval_dataset`` that the pipeline passes. Each step:

1. the sampler picks protected units (Poisson with rate q = B / N for DP-SGD; shuffled
   fixed-size batches of B for non-private training);
2. the gradient engine (:mod:`dpaudit.train.engine`) leaves the update in ``p.grad``:
   per-unit clipping + Gaussian noise + division by the expected batch size B for DP-SGD,
   plain back-propagation divided by B otherwise;
3. the optimizer (AdamW or SGD) steps; the learning rate follows warmup + constant,
   linear or cosine decay.

Steps: ``train.steps`` when set, else ``ceil(epochs * N / B)``, with N the number of
protected units (rows for non-private training, which ignores ``train.dp``).

Run directory (when ``run_dir`` is given):

- ``train_log.jsonl``: a ``step`` 0 record with the evaluation below before any update
  (the baseline of "did the model learn?"), then one JSON object per step: ``step``, ``train_loss`` (mean per-example
  loss of the batch; null for an empty batch), ``lr``, ``batch_size`` (units), ``examples``
  (rows), ``elapsed_s``, for DP engines ``clipped_fraction``; every ``eval_every`` steps
  and at the last step also ``train_eval_loss``/``train_perplexity`` (on the first
  ``max_eval_examples`` training rows) and ``heldout_loss``/``heldout_perplexity`` (on
  ``eval_dataset``), token-weighted. The log is NOT privatised: it is for the operator.
- ``dp_event.json``: ``{"schema_version", "trainer", "event" (a plain dict, see
  :func:`dpaudit.accounting.event_to_dict`), "accountant", "delta", "epsilon", "unit",
  "num_units", "sample_rate", "steps", "noise_multiplier", "max_grad_norm",
  "expected_batch_size", "target_epsilon", "sampler", "noise"}`` (``noise``: ``secure``,
  ``reproducible`` or null; a reproducible record also has a ``warning``). Non-private training writes the
  same keys with ``event = {"type": "non_private"}`` and ``epsilon = null`` (infinity),
  so later stages always find one. Recompute epsilon with
  :func:`dpaudit.accounting.epsilon_from_record`, do not trust the logged one.
- ``train_checks.json``: see :mod:`dpaudit.train.checks`.
- ``checkpoints/step-N/`` every ``checkpoint_every`` steps (``save_pretrained`` of the
  model, adapters only with LoRA, and of the tokenizer).

Noise nobody can replay. DP training is in secure mode by default (``train.dp.reproducible:
false``, Opacus calls it ``secure_mode``): the Poisson batches are drawn from the operating
system's CSPRNG (:class:`~dpaudit.train.sampling.OSRandom`), and so is the Gaussian noise of
the DP-SGD engine (:class:`~dpaudit.train.sampling.SecureGenerator`); nothing is recorded, so
the files of a run do not let anyone regenerate its noise. Engines that call ``torch.randn``
with the generator themselves get torch's generator re-seeded from the OS at every step
(docs/security.md). ``reproducible: true`` seeds both from the run
seed, for audits and tests; such a model carries :data:`RELEASE_WARNING` in its config.json.

Determinism: given the seed, training on CPU is bit-for-bit repeatable in reproducible mode
(and always for non-private training). Every random stream comes from
``numpy.random.SeedSequence(seed).spawn``; torch's global RNG (used by dropout, if the model
has any) is forked, seeded and restored around training.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from dpaudit import accounting
from dpaudit.config import Config, DPConfig, TrainConfig, load_config, validate
from dpaudit.errors import InputError
from dpaudit.progress import Progress
from dpaudit.rundir import DP_EVENT, TRAIN_CHECKS, TRAIN_LOG, atomic_file, staged_directory, write_json_atomic
from dpaudit.train import checks
from dpaudit.train.engine import (
    DPSGDEngine,
    GradientEngine,
    NonPrivateEngine,
    autocast_context,
    collate,
    forward_logits,
    token_nll,
)
from dpaudit.train.ghost import choose_engine
from dpaudit.train.sampling import OSRandom, PoissonSampler, RunSeeds, SecureGenerator, ShuffleSampler

SCHEMA_VERSION = 1
RELEASE_WARNING = ("trained in reproducible mode (train.dp.reproducible: true): its DP noise and Poisson batches "
                   "follow from the run seed, so anyone with the seed can replay them; not fit for release")


def noise_mode(private: bool, dp: DPConfig) -> str | None:
    """``"secure"`` (noise and sampling from OS entropy, the default of DP training),
    ``"reproducible"`` (both from the run seed) or None (non-private training: no noise)."""
    if not private:
        return None
    return "reproducible" if dp.reproducible else "secure"


# --------------------------------------------------------------------------- trainer spec


@dataclass(frozen=True)
class TrainerSpec:
    """How a trainer differs from another: its name (recorded in ``dp_event.json``),
    whether it claims DP, the gradient engine, the sampler it really uses, and the unit
    kinds it supports."""

    name: str
    private: bool
    engine: type[GradientEngine]
    sampler: str = "poisson"  # "poisson" | "shuffle": what the loop really does
    units: tuple[str, ...] = ("example", "user")


NONPRIVATE = TrainerSpec("dpaudit.train:nonprivate", private=False, engine=NonPrivateEngine, sampler="shuffle")
DPSGD = TrainerSpec("dpaudit.train:dpsgd", private=True, engine=DPSGDEngine)


# --------------------------------------------------------------------------- data


@dataclass
class TrainingData:
    """Token sequences (padding stripped) and the rows of each protected unit."""

    sequences: list[torch.Tensor]
    units: list[list[int]]
    unit: str  # "example" | "user"

    @property
    def num_units(self) -> int:
        return len(self.units)


def prepare_sequences(dataset, *, max_length: int, pad_id: int, what: str = "dataset") -> list[torch.Tensor]:
    """1-D token tensors from ``input_ids`` (and ``attention_mask`` when present: tokens
    whose mask is 0 are padding and dropped), truncated to ``max_length``. An empty row
    becomes one padding token, which predicts nothing (zero loss, zero gradient)."""
    columns = set(dataset.column_names)
    if "input_ids" not in columns:
        raise InputError(f"the {what} has no input_ids column (columns: {', '.join(sorted(columns))})")
    plain = dataset.with_format(None)  # python lists whatever format the caller set
    ids_column = plain["input_ids"][:]
    masks = plain["attention_mask"][:] if "attention_mask" in columns else [None] * len(ids_column)
    sequences = []
    for ids, mask in zip(ids_column, masks):
        if mask is not None:
            ids = [t for t, m in zip(ids, mask) if m]
        ids = list(ids)[:max_length] or [pad_id]
        sequences.append(torch.tensor(ids, dtype=torch.long))
    return sequences


def group_units(dataset, unit: str) -> list[list[int]]:
    """Rows of each protected unit, in order of first appearance: one row per unit for
    ``"example"``, all rows sharing a ``unit_id`` for ``"user"``."""
    if unit == "example":
        return [[i] for i in range(len(dataset))]
    if unit != "user":
        raise InputError(f"train.dp.unit must be example or user, got {unit!r}")
    if "unit_id" not in dataset.column_names:
        raise InputError("train.dp.unit is user but the dataset has no unit_id column")
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(dataset.with_format(None)["unit_id"][:]):
        if uid is None:
            raise InputError(f"row {row} has no unit_id (train.dp.unit is user)")
        groups.setdefault(uid, []).append(row)
    return list(groups.values())


def load_data(dataset, *, unit: str, max_length: int, pad_id: int) -> TrainingData:
    if len(dataset) == 0:
        raise InputError("the training dataset is empty")
    sequences = prepare_sequences(dataset, max_length=max_length, pad_id=pad_id)
    return TrainingData(sequences=sequences, units=group_units(dataset, unit), unit=unit)


# --------------------------------------------------------------------------- plan


def num_steps(train: TrainConfig, num_units: int) -> int:
    """``train.steps`` when set, else ``ceil(epochs * N / B)``."""
    if train.steps is not None:
        return int(train.steps)
    return max(1, math.ceil(train.epochs * num_units / train.batch_size - 1e-9))


@dataclass
class PrivacyPlan:
    """Everything the accountant needs, resolved from ``train.dp`` and the data."""

    noise_multiplier: float
    max_grad_norm: float
    delta: float
    sample_rate: float
    steps: int
    num_units: int
    unit: str
    accountant: str
    expected_batch_size: int
    target_epsilon: float | None

    def event(self):
        return accounting.make_event(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, steps=self.steps)

    def epsilon(self) -> float:
        return accounting.epsilon_from_event(self.event(), delta=self.delta, method=self.accountant)


def sample_rate(batch_size: int, num_units: int) -> float:
    q = batch_size / num_units
    if not 0 < q <= 1:
        raise InputError(
            f"Poisson sampling rate q = batch_size / N = {batch_size}/{num_units} = {q:.4g} must be in (0, 1]: "
            f"lower train.batch_size to at most the number of protected units ({num_units})"
        )
    return q


def plan_privacy(dp: DPConfig, *, batch_size: int, num_units: int, steps: int) -> PrivacyPlan:
    """Check ``train.dp`` (exactly one of noise_multiplier and target_epsilon, sigma > 0,
    q in (0, 1], delta in (0, 1) and warned about at 1/N or more) and calibrate sigma from
    a target epsilon when that is what was given."""
    if (dp.noise_multiplier is None) == (dp.target_epsilon is None):
        which = "both" if dp.noise_multiplier is not None else "neither"
        raise InputError(
            f"train.dp needs exactly one of noise_multiplier and target_epsilon, got {which}"
        )
    if dp.noise_multiplier is not None and not dp.noise_multiplier > 0:
        raise InputError(f"train.dp.noise_multiplier must be > 0 with DP on, got {dp.noise_multiplier}")
    if not dp.max_grad_norm > 0:
        raise InputError(f"train.dp.max_grad_norm must be > 0, got {dp.max_grad_norm}")
    q = sample_rate(batch_size, num_units)
    delta = accounting.default_delta(num_units) if dp.delta is None else accounting.check_delta(dp.delta, num_units)
    sigma = dp.noise_multiplier
    if sigma is None:
        sigma = accounting.noise_multiplier(
            target_epsilon=dp.target_epsilon, sample_rate=q, steps=steps, delta=delta, method=dp.accountant
        )
    return PrivacyPlan(
        noise_multiplier=float(sigma),
        max_grad_norm=float(dp.max_grad_norm),
        delta=float(delta),
        sample_rate=q,
        steps=steps,
        num_units=num_units,
        unit=dp.unit,
        accountant=dp.accountant,
        expected_batch_size=batch_size,
        target_epsilon=dp.target_epsilon,
    )


# --------------------------------------------------------------------------- device, lr


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"train.device must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"train.device is {name} but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"train.device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return device


def resolve_autocast(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA with ``auto``; fp32 (no autocast) on CPU unless ``bf16``."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the base learning rate at (0-based) ``step``: linear warmup over
    ``warmup_steps`` steps, then constant, linear decay to 0, or cosine decay to 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise InputError(f"train.schedule must be constant, linear or cosine, got {schedule!r}")


def make_optimizer(params: Sequence[torch.nn.Parameter], train: TrainConfig) -> torch.optim.Optimizer:
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    raise InputError(f"train.optimizer must be adamw or sgd, got {train.optimizer!r}")


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    sequences: Sequence[torch.Tensor],
    *,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[float, float]:
    """Token-weighted mean NLL and perplexity of ``sequences``."""
    if not sequences:
        return math.nan, math.nan
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    ordered = sorted(sequences, key=len, reverse=True)
    try:
        for start in range(0, len(ordered), batch_size):
            batch = collate(ordered[start : start + batch_size], pad_id=pad_id, device=device)
            with autocast_context(device, autocast_dtype):
                nll, n = token_nll(forward_logits(model, batch), batch.labels)
            total += float(nll.sum())
            count += int(n.sum())
    finally:
        model.train(was_training)
    loss = total / max(count, 1)
    return loss, math.exp(min(loss, 700.0))


# --------------------------------------------------------------------------- files


def save_checkpoint(model, tokenizer, directory: Path) -> None:
    with staged_directory(directory) as stage:
        model.save_pretrained(stage, safe_serialization=True)
        tokenizer.save_pretrained(stage)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# --------------------------------------------------------------------------- the loop


def default_config(spec: TrainerSpec) -> Config:
    """The config used when a trainer is called as a bare plug-in (no ``config``): the
    ``tiny`` preset, with ``train.dp.noise_multiplier=1.0`` for DP trainers."""
    overrides = [f"train.trainer={spec.name}"]
    if spec.private:
        overrides.append("train.dp.noise_multiplier=1.0")
    return load_config("tiny", overrides=overrides)


def run_training(
    dataset,
    tokenizer,
    *,
    seed: int,
    spec: TrainerSpec,
    config: Config | None = None,
    run_dir: str | Path | None = None,
    eval_dataset=None,
):
    """Train a fresh model (``make_model(config.model, tokenizer, ...)``) on exactly the rows
    of ``dataset`` and return it (a ``PeftModel`` when LoRA is on)."""
    from dpaudit.models import make_model

    config = config if config is not None else default_config(spec)
    if not isinstance(config, Config):
        raise InputError(f"config must be a dpaudit Config, got {type(config).__name__}")
    validate(config)
    train = config.train
    seeds = RunSeeds.from_seed(seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise InputError("the tokenizer has neither a pad token nor an eos token")

    if not spec.private and (train.dp.noise_multiplier is not None or train.dp.target_epsilon is not None):
        warnings.warn(
            f"train.dp is set but the trainer {spec.name} is not private: it is ignored "
            "(choose train.trainer: dpaudit.train:dpsgd for DP-SGD)",
            UserWarning,
            stacklevel=3,
        )
    unit = train.dp.unit if spec.private else "example"
    if unit not in spec.units:
        raise InputError(f"trainer {spec.name} does not support train.dp.unit={unit}")
    data = load_data(dataset, unit=unit, max_length=config.data.max_length, pad_id=pad_id)
    steps = num_steps(train, data.num_units)
    plan = plan_privacy(train.dp, batch_size=train.batch_size, num_units=data.num_units, steps=steps) if spec.private else None
    eval_sequences = []
    if eval_dataset is not None and len(eval_dataset) > 0:
        eval_sequences = prepare_sequences(
            eval_dataset.select(range(min(len(eval_dataset), train.max_eval_examples))),
            max_length=config.data.max_length,
            pad_id=pad_id,
            what="evaluation dataset",
        )
    train_eval_sequences = data.sequences[: train.max_eval_examples]

    device = resolve_device(train.device)
    autocast_dtype = resolve_autocast(train.precision, device)
    out = Path(run_dir) if run_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    fork_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seeds.torch)
        model = make_model(config.model, tokenizer, seed=seeds.model).to(device)
        model.train()
        # train.dp.engine: ghost clipping or the vmap engine, for the plain DP-SGD engine only
        engine_class, engine_options = (choose_engine(spec.engine, train.dp.engine) if spec.private
                                        else (spec.engine, {}))
        engine = engine_class(
            model,
            **engine_options,
            expected_batch_size=train.batch_size,
            microbatch_size=train.microbatch_size,
            pad_id=pad_id,
            device=device,
            autocast_dtype=autocast_dtype,
            noise_multiplier=plan.noise_multiplier if plan else 0.0,
            max_grad_norm=plan.max_grad_norm if plan else math.inf,
        )
        try:
            _loop(
                model=model,
                tokenizer=tokenizer,
                engine=engine,
                spec=spec,
                train=train,
                data=data,
                steps=steps,
                plan=plan,
                seeds=seeds,
                device=device,
                autocast_dtype=autocast_dtype,
                pad_id=pad_id,
                eval_sequences=eval_sequences,
                train_eval_sequences=train_eval_sequences,
                out=out,
            )
        finally:
            engine.close()
    if plan is not None and train.dp.reproducible:  # the warning travels in the model's config.json
        model.config.dpaudit_warning = RELEASE_WARNING
    return model


def _loop(*, model, tokenizer, engine, spec, train, data, steps, plan, seeds, device, autocast_dtype, pad_id,
          eval_sequences, train_eval_sequences, out) -> None:
    params = engine.params
    before = checks.snapshot(params)
    optimizer = make_optimizer(list(params.values()), train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s, schedule=train.schedule, warmup_steps=train.warmup_steps, total_steps=steps),
    )
    # secure mode: batches from the OS CSPRNG, noise re-seeded from it every step; nothing recorded
    secure = noise_mode(plan is not None, train.dp) == "secure"
    rng = OSRandom() if secure else seeds.numpy_generator()
    if spec.sampler == "poisson":
        q = plan.sample_rate if plan else sample_rate(train.batch_size, data.num_units)
        sampler = PoissonSampler(num_units=data.num_units, sample_rate=q, generator=rng)
    else:
        sampler = ShuffleSampler(num_units=data.num_units, batch_size=train.batch_size, generator=rng)
    noise_generator = SecureGenerator(device) if secure else seeds.noise_generator(device)

    batch_sizes: list[int] = []
    nonfinite = {"updates": 0, "unit_gradients": 0, "losses": 0}
    log_writer = atomic_file(out / TRAIN_LOG) if out is not None else None  # in place only when training ends
    log = log_writer.__enter__() if log_writer is not None else None
    started = time.perf_counter()
    bar = Progress(total=steps, desc="train")
    eval_kwargs = dict(batch_size=train.microbatch_size, pad_id=pad_id, device=device, autocast_dtype=autocast_dtype)

    def evaluation() -> dict[str, float | None]:
        loss, ppl = evaluate(model, train_eval_sequences, **eval_kwargs)
        record = {"train_eval_loss": _finite(loss), "train_perplexity": _finite(ppl)}
        if eval_sequences:
            loss, ppl = evaluate(model, eval_sequences, **eval_kwargs)
            record.update(heldout_loss=_finite(loss), heldout_perplexity=_finite(ppl))
        return record

    try:
        if log is not None:  # step 0: the model before training, the baseline of "did it learn?"
            log.write(json.dumps({"step": 0, **evaluation(), "elapsed_s": 0.0}) + "\n")
        for step in range(1, steps + 1):
            chosen = sampler.sample()
            units = [[data.sequences[r] for r in data.units[u]] for u in chosen]
            lr = scheduler.get_last_lr()[0]
            if secure:
                noise_generator.next_step()
            stats = engine.step(units, noise_generator)
            bad = sum(1 for x in stats.losses if not math.isfinite(x))
            if bad:
                raise InputError(f"training diverged: the loss is NaN or infinite at step {step} of {steps} "
                                 f"({bad} of {len(stats.losses)} examples); lower train.lr or check the data")
            grads = [p.grad for p in params.values() if p.grad is not None]
            if grads and not bool(torch.isfinite(torch.stack([g.float().sum() for g in grads])).all()):
                nonfinite["updates"] += 1
            nonfinite["unit_gradients"] += stats.nonfinite_units
            nonfinite["losses"] += bad
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            batch_sizes.append(len(chosen))

            record: dict[str, Any] = {
                "step": step,
                "train_loss": _finite(sum(stats.losses) / len(stats.losses)) if stats.losses else None,
                "lr": lr,
                "batch_size": len(chosen),
                "examples": stats.num_examples,
            }
            if engine.private:
                record["clipped_fraction"] = stats.clipped_units / stats.num_units if stats.num_units else None
            if step % train.eval_every == 0 or step == steps:
                record.update(evaluation())
            record["elapsed_s"] = round(time.perf_counter() - started, 3)
            if log is not None:
                log.write(json.dumps(record) + "\n")
                log.flush()
            shown = {"loss": record["train_loss"]} if record["train_loss"] is not None else {}
            if "heldout_perplexity" in record and record["heldout_perplexity"] is not None:
                shown["heldout_ppl"] = record["heldout_perplexity"]
            bar.update(1, **shown)
            if out is not None and train.checkpoint_every and step % train.checkpoint_every == 0:
                (out / "checkpoints").mkdir(exist_ok=True)
                save_checkpoint(model, tokenizer, out / "checkpoints" / f"step-{step}")
    finally:
        bar.close()
        if log_writer is not None:
            log_writer.__exit__(*sys.exc_info())

    if out is None:
        return
    batch_check = checks.batch_size_check(
        batch_sizes, num_units=data.num_units, sample_rate=plan.sample_rate if plan else None
    )
    summary = checks.summarize(
        batch_sizes=batch_check,
        moved=checks.parameters_moved(before, params),
        nonfinite=nonfinite,
        # a DP trainer claims Poisson sampling, whatever it does: the batch sizes must tell
        sampler="poisson" if spec.private else spec.sampler,
    )
    # secure mode: the noise and the batches came from the OS, not from these seeds
    summary["seeds"] = {**seeds.to_dict(), "noise": None} if secure else seeds.to_dict()
    summary["noise"] = noise_mode(plan is not None, train.dp)
    write_json_atomic(out / TRAIN_CHECKS, summary)
    write_json_atomic(out / DP_EVENT, dp_record(spec, plan, num_units=data.num_units, steps=steps,
                                                batch_size=train.batch_size, noise=noise_mode(plan is not None, train.dp)))


def dp_record(spec: TrainerSpec, plan: PrivacyPlan | None, *, num_units: int, steps: int, batch_size: int,
              noise: str | None = None) -> dict:
    """The content of ``dp_event.json`` (see the module docstring); ``noise`` is the mode of
    :func:`noise_mode`, and a reproducible run's record carries :data:`RELEASE_WARNING`."""
    common = {"schema_version": SCHEMA_VERSION, "trainer": spec.name, "noise": noise}
    if noise == "reproducible":
        common["warning"] = RELEASE_WARNING
    if plan is None:
        import dp_accounting

        return {
            **common,
            "event": accounting.event_to_dict(dp_accounting.NonPrivateDpEvent()),
            "accountant": None,
            "delta": None,
            "epsilon": None,  # infinity: no privacy
            "unit": "example",
            "num_units": num_units,
            "sample_rate": None,
            "steps": steps,
            "noise_multiplier": None,
            "max_grad_norm": None,
            "expected_batch_size": batch_size,
            "target_epsilon": None,
            "sampler": spec.sampler,
        }
    return {
        **common,
        "event": accounting.event_to_dict(plan.event()),
        "accountant": plan.accountant,
        "delta": plan.delta,
        "epsilon": plan.epsilon(),
        "unit": plan.unit,
        "num_units": plan.num_units,
        "sample_rate": plan.sample_rate,
        "steps": plan.steps,
        "noise_multiplier": plan.noise_multiplier,
        "max_grad_norm": plan.max_grad_norm,
        "expected_batch_size": plan.expected_batch_size,
        "target_epsilon": plan.target_epsilon,
        "sampler": "poisson",  # what the accounting assumes; train_checks.json tests it
    }


# --------------------------------------------------------------------------- trainers


def nonprivate(dataset, tokenizer, *, seed: int, config: Config | None = None, run_dir: str | Path | None = None,
               eval_dataset=None):
    """Non-private training (shuffled batches of ``train.batch_size`` rows, no clipping, no
    noise; epsilon = infinity). ``config=None`` uses the ``tiny`` preset."""
    return run_training(dataset, tokenizer, seed=seed, spec=NONPRIVATE, config=config, run_dir=run_dir,
                        eval_dataset=eval_dataset)


def dpsgd(dataset, tokenizer, *, seed: int, config: Config | None = None, run_dir: str | Path | None = None,
          eval_dataset=None):
    """DP-SGD (Abadi et al. 2016) with Poisson sampling over the protected units of
    ``train.dp.unit``, per-unit clipping to ``train.dp.max_grad_norm``, Gaussian noise and
    division by the expected batch size. ``config=None`` uses the ``tiny`` preset with
    ``train.dp.noise_multiplier=1.0`` (a bare plug-in call)."""
    return run_training(dataset, tokenizer, seed=seed, spec=DPSGD, config=config, run_dir=run_dir,
                        eval_dataset=eval_dataset)


dpsgd.claims_dp = True  # the run checks its train.dp before any work
