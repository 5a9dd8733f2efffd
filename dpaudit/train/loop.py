"""The one training loop, shared by non-private training, DP-SGD and the faulty trainers.

A trainer is ``train(dataset, tokenizer, *, seed) -> PreTrainedModel`` (the plug-in
contract); the toolkit's own trainers also take the keyword-only ``config``, ``record``
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

What it reports (when the caller passes a :class:`~dpaudit.train.record.TrainingRecord` as
``record``; the train stage writes it as ``train_log.jsonl``, ``dp_event.json`` and
``train_checks.json``):

- ``log``: a ``step`` 0 record with the evaluation below before any update (the baseline of
  "did the model learn?"), then one record per step: ``step``, ``train_loss`` (mean
  per-example loss of the batch; null for an empty batch), ``lr``, ``batch_size`` (units),
  ``examples`` (rows), ``elapsed_s``, for DP engines ``clipped_fraction``; every
  ``eval_every`` steps and at the last step also ``train_eval_loss``/``train_perplexity`` (on
  the first ``max_eval_examples`` training rows) and ``heldout_loss``/``heldout_perplexity``
  (on ``eval_dataset``), token-weighted. The log is NOT privatised: it is for the operator.
- ``dp``: the run's :class:`~dpaudit.accounting.DpRecord` (a non-private run has one too,
  with a non-private event, so later stages always find one). Recompute epsilon from it,
  do not trust the logged one.
- ``checks``: see :mod:`dpaudit.train.checks`.
- ``gradient_canaries``: with ``train.dp.gradient_canaries: M > 0`` (DP trainers only), the
  :class:`~dpaudit.audit.gradient_canaries.GradientCanaryRecord` of M white-box canaries
  added to every step's clipped sum (:mod:`dpaudit.train.gradient_canaries`); the model
  then carries :data:`~dpaudit.train.plan.GRADIENT_CANARY_WARNING` in its config.json.
- ``unit_clipping``: for DP engines, the :class:`~dpaudit.audit.groups.UnitClipping` of the
  run: per protected unit, how often it was sampled, how often its pre-clipping gradient norm
  exceeded the bound, and the sum of those norms (who pays for the privacy, Bagdasaryan et al.
  2019, arXiv 1905.12101); None when the engine does not say whose norm is whose. Like the log,
  it is NOT privatised: it is for the operator and the report.
- ``checkpoint(step, model, tokenizer)`` is called every ``checkpoint_every`` steps.

Noise nobody can replay. DP training is in secure mode by default (``train.dp.reproducible:
false``, Opacus calls it ``secure_mode``): the Poisson batches are drawn from a ChaCha20
keystream under a key from the operating system's CSPRNG
(:class:`~dpaudit.train.sampling.SecureRandom`), and the Gaussian noise of the DP-SGD engine from
ChaCha20 under a key of its own (:class:`~dpaudit.train.sampling.SecureGenerator`,
:mod:`dpaudit.train.chacha`); nothing is recorded, so the files of a run do not let anyone
regenerate its noise. Engines that call ``torch.randn``
with the generator themselves get torch's generator re-seeded from the OS at every step
(docs/security.md). ``reproducible: true`` seeds both from the run
seed, for audits and tests; such a model carries :data:`RELEASE_WARNING` in its config.json.

Determinism: given the seed, training on CPU is bit-for-bit repeatable in reproducible mode
(and always for non-private training). Every random stream comes from
``numpy.random.SeedSequence(seed).spawn``; torch's global RNG (used by dropout, if the model
has any) is forked, seeded and restored around training.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn.utils import get_total_norm

from dpaudit.config import Config, TrainConfig, load_config, validate
from dpaudit.devices import resolve_device
from dpaudit.errors import InputError
from dpaudit.progress import Progress
from dpaudit.train import checks
from dpaudit.train.engine import CLIP_EPS, DPSGDEngine, GradientEngine, NonPrivateEngine
from dpaudit.train.evaluate import evaluate
from dpaudit.train.ghost import choose_engine
from dpaudit.train.gradient_canaries import GradientCanaries
from dpaudit.train.plan import (
    PrivacyPlan,
    dp_record,
    make_optimizer,
    make_scheduler,
    noise_mode,
    num_steps,
    plan_privacy,
    release_warning,
    resolve_autocast,
    sample_rate,
)
from dpaudit.train.record import TrainingRecord
from dpaudit.train.sampling import PoissonSampler, RunSeeds, SecureGenerator, SecureRandom, ShuffleSampler
from dpaudit.train.units import TrainingData, load_data, prepare_sequences


@dataclass(frozen=True)
class TrainerSpec:
    """How a trainer differs from another: its name (recorded in its DP record), whether it
    claims DP, the gradient engine, the sampler it really uses, and the unit kinds it supports."""

    name: str
    private: bool
    engine: type[GradientEngine]
    sampler: str = "poisson"  # "poisson" | "shuffle": what the loop really does
    units: tuple[str, ...] = ("example", "user")


NONPRIVATE = TrainerSpec("dpaudit.train:nonprivate", private=False, engine=NonPrivateEngine, sampler="shuffle")
DPSGD = TrainerSpec("dpaudit.train:dpsgd", private=True, engine=DPSGDEngine)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def default_config(spec: TrainerSpec) -> Config:
    """The config used when a trainer is called as a bare plug-in (no ``config``): the
    ``tiny`` preset, with ``train.dp.noise_multiplier=1.0`` for DP trainers."""
    overrides = [f"train.trainer={spec.name}"]
    if spec.private:
        overrides.append("train.dp.noise_multiplier=1.0")
    return load_config("tiny", overrides=overrides)


def run_training(dataset, tokenizer, *, seed: int, spec: TrainerSpec, config: Config | None = None,
                 record: TrainingRecord | None = None, eval_dataset=None):
    """Train a fresh model (``make_model(config.model, tokenizer, ...)``) on exactly the rows
    of ``dataset`` and return it (a ``PeftModel`` when LoRA is on); fill ``record`` when given."""
    from dpaudit.models import make_model

    config = config if config is not None else default_config(spec)
    if not isinstance(config, Config):
        raise InputError(f"config must be a dpaudit Config, got {type(config).__name__}")
    validate(config)
    train = config.train
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise InputError("the tokenizer has neither a pad token nor an eos token")
    if not spec.private and (train.dp.noise_multiplier is not None or train.dp.target_epsilon is not None
                             or train.dp.gradient_canaries):
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
            max_length=config.data.max_length, pad_id=pad_id, what="evaluation dataset")
    device = resolve_device(train.device, what="train.device")
    seeds = RunSeeds.from_seed(seed)
    fork_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seeds.torch)
        model = make_model(config.model, tokenizer, seed=seeds.model).to(device)
        model.train()
        loop = _Loop(model=model, tokenizer=tokenizer, spec=spec, train=train, data=data, steps=steps, plan=plan,
                     seeds=seeds, device=device, autocast_dtype=resolve_autocast(train.precision, device),
                     pad_id=pad_id, eval_sequences=eval_sequences, record=record)
        loop.run()
    warning = release_warning(reproducible=train.dp.reproducible, gradient_canaries=train.dp.gradient_canaries)
    if plan is not None and warning is not None:  # the warning travels in the model's config.json
        model.config.dpaudit_warning = warning
    return model


@dataclass
class _Loop:
    """One training run's state: the engine, sampler, noise, optimizer and what is recorded."""

    model: Any
    tokenizer: Any
    spec: TrainerSpec
    train: TrainConfig
    data: TrainingData
    steps: int
    plan: PrivacyPlan | None
    seeds: RunSeeds
    device: torch.device
    autocast_dtype: torch.dtype | None
    pad_id: int
    eval_sequences: list
    record: TrainingRecord | None
    batch_sizes: list[int] = field(default_factory=list)
    nonfinite: dict[str, int] = field(default_factory=lambda: {"updates": 0, "unit_gradients": 0, "losses": 0})
    unit_tally: _UnitTally | None = None

    def run(self) -> None:
        # train.dp.engine: ghost clipping or the vmap engine, for the plain DP-SGD engine only
        engine_class, options = (choose_engine(self.spec.engine, self.train.dp.engine) if self.spec.private
                                 else (self.spec.engine, {}))
        engine = engine_class(
            self.model, **options, expected_batch_size=self.train.batch_size,
            microbatch_size=self.train.microbatch_size, pad_id=self.pad_id, device=self.device,
            autocast_dtype=self.autocast_dtype, noise_multiplier=self.plan.noise_multiplier if self.plan else 0.0,
            max_grad_norm=self.plan.max_grad_norm if self.plan else math.inf)
        try:
            self._train(engine)
        finally:
            engine.close()

    @property
    def noise(self) -> str | None:
        return noise_mode(self.plan is not None, self.train.dp)

    def _sampler(self, rng):
        train, data = self.train, self.data
        if self.spec.sampler == "poisson":
            q = self.plan.sample_rate if self.plan else sample_rate(train.batch_size, data.num_units)
            return PoissonSampler(num_units=data.num_units, sample_rate=q, generator=rng)
        return ShuffleSampler(num_units=data.num_units, batch_size=train.batch_size, generator=rng)

    def evaluation(self) -> dict[str, float | None]:
        kwargs = dict(batch_size=self.train.microbatch_size, pad_id=self.pad_id, device=self.device,
                      autocast_dtype=self.autocast_dtype)
        loss, ppl = evaluate(self.model, self.data.sequences[: self.train.max_eval_examples], **kwargs)
        out = {"train_eval_loss": _finite(loss), "train_perplexity": _finite(ppl)}
        if self.eval_sequences:
            loss, ppl = evaluate(self.model, self.eval_sequences, **kwargs)
            out.update(heldout_loss=_finite(loss), heldout_perplexity=_finite(ppl))
        return out

    def _train(self, engine: GradientEngine) -> None:
        train, params = self.train, engine.params
        before = checks.snapshot(params)
        optimizer = make_optimizer(list(params.values()), train)
        scheduler = make_scheduler(optimizer, train, self.steps)
        # secure mode: batches and noise from keystreams keyed by the OS CSPRNG; nothing recorded
        secure = self.noise == "secure"
        sampler = self._sampler(SecureRandom() if secure else self.seeds.numpy_generator())
        noise_generator = SecureGenerator(self.device) if secure else self.seeds.noise_generator(self.device)
        canaries = None
        if self.plan is not None and self.train.dp.gradient_canaries:
            canaries = GradientCanaries(
                num_canaries=self.train.dp.gradient_canaries, sample_rate=self.plan.sample_rate,
                max_grad_norm=self.plan.max_grad_norm, rng=SecureRandom() if secure else self.seeds.canary_generator(),
                noise_generator=None if secure else self.seeds.canary_noise_generator(self.device))
            engine.attach_canaries(canaries)
        if engine.private and self.record is not None:
            self.unit_tally = _UnitTally(self.data.num_units)
        started = time.perf_counter()
        bar = Progress(total=self.steps, desc="train")
        try:
            if self.record is not None:  # step 0: the model before training, the baseline of "did it learn?"
                self.record.log.append({"step": 0, **self.evaluation(), "elapsed_s": 0.0})
            for step in range(1, self.steps + 1):
                chosen = sampler.sample()
                lr = scheduler.get_last_lr()[0]
                if secure:
                    noise_generator.next_step()
                stats = engine.step([[self.data.sequences[r] for r in self.data.units[u]] for u in chosen],
                                    noise_generator)
                optimizer.step()
                scheduler.step()
                # what the step saw is read only now, with the step queued whole (StepStats); the
                # update is still in p.grad
                self._check_finite(step, stats, params)
                if engine.private and self.unit_tally is not None:
                    self.unit_tally.add(chosen, stats, max_grad_norm=engine.max_grad_norm)
                optimizer.zero_grad(set_to_none=True)
                self.batch_sizes.append(len(chosen))
                row = self._log_row(step, stats, lr=lr, batch_size=len(chosen), engine=engine, started=started)
                shown = {"loss": row["train_loss"]} if row["train_loss"] is not None else {}
                if row.get("heldout_perplexity") is not None:
                    shown["heldout_ppl"] = row["heldout_perplexity"]
                bar.update(1, **shown)
        finally:
            bar.close()
        if self.record is not None:
            self._finish(before, params, secure)
            self.record.gradient_canaries = canaries.result() if canaries is not None else None
            if self.unit_tally is not None:
                self.record.unit_clipping = self.unit_tally.result(self.data, max_grad_norm=self.plan.max_grad_norm)

    def _check_finite(self, step: int, stats, params) -> None:
        bad = sum(1 for x in stats.losses if not math.isfinite(x))
        if bad:
            raise InputError(f"training diverged: the loss is NaN or infinite at step {step} of {self.steps} "
                             f"({bad} of {len(stats.losses)} examples); lower train.lr or check the data")
        grads = [p.grad for p in params.values() if p.grad is not None]
        # the largest magnitude of the update: inf or nan exactly when an entry is (a few kernels on a GPU)
        if grads and not bool(torch.isfinite(get_total_norm(grads, norm_type=math.inf))):
            self.nonfinite["updates"] += 1
        self.nonfinite["unit_gradients"] += stats.nonfinite_units
        self.nonfinite["losses"] += bad

    def _log_row(self, step: int, stats, *, lr: float, batch_size: int, engine, started: float) -> dict[str, Any]:
        row: dict[str, Any] = {
            "step": step,
            "train_loss": _finite(sum(stats.losses) / len(stats.losses)) if stats.losses else None,
            "lr": lr,
            "batch_size": batch_size,
            "examples": stats.num_examples,
        }
        if engine.private:
            row["clipped_fraction"] = stats.clipped_units / stats.num_units if stats.num_units else None
        if step % self.train.eval_every == 0 or step == self.steps:
            row.update(self.evaluation())
        row["elapsed_s"] = round(time.perf_counter() - started, 3)
        if self.record is not None:
            self.record.log.append(row)
            every = self.train.checkpoint_every
            if self.record.checkpoint is not None and every and step % every == 0:
                self.record.checkpoint(step, self.model, self.tokenizer)
        return row

    def _finish(self, before, params, secure: bool) -> None:
        """The sampler and update checks and the DP record, into ``self.record``."""
        batch_check = checks.batch_size_check(
            self.batch_sizes, num_units=self.data.num_units, sample_rate=self.plan.sample_rate if self.plan else None)
        summary = checks.summarize(
            batch_sizes=batch_check,
            moved=checks.parameters_moved(before, params),
            nonfinite=self.nonfinite,
            # a DP trainer claims Poisson sampling, whatever it does: the batch sizes must tell
            sampler="poisson" if self.spec.private else self.spec.sampler,
        )
        # secure mode: the noise and the batches came from keys drawn from the OS, not from these seeds
        summary["seeds"] = {**self.seeds.to_dict(), "noise": None} if secure else self.seeds.to_dict()
        summary["noise"] = self.noise
        self.record.checks = summary
        self.record.dp = dp_record(trainer=self.spec.name, sampler=self.spec.sampler, plan=self.plan,
                                   num_units=self.data.num_units, steps=self.steps,
                                   batch_size=self.train.batch_size, noise=self.noise,
                                   gradient_canaries=self.train.dp.gradient_canaries if self.plan else 0)


class _UnitTally:
    """Per protected unit of a DP run: steps sampled, steps clipped, the sum of its
    pre-clipping norms. A step whose engine did not say whose norm is whose (``unit_index``
    not one per norm) makes the whole tally unknown."""

    def __init__(self, num_units: int):
        self.sampled = np.zeros(num_units, dtype=np.int64)
        self.clipped = np.zeros(num_units, dtype=np.int64)
        self.norm_sum = np.zeros(num_units, dtype=np.float64)
        self.known = True

    def add(self, chosen, stats, *, max_grad_norm: float) -> None:
        if not self.known:
            return
        if len(stats.unit_index) != len(stats.unit_norms):
            self.known = False
            return
        chosen = np.asarray(chosen, dtype=np.int64)
        np.add.at(self.sampled, chosen, 1)  # a unit twice in one batch (a shuffle crossing an epoch) counts twice
        if not stats.unit_norms:
            return
        who = chosen[np.asarray(stats.unit_index, dtype=np.int64)]
        norms = np.asarray(stats.unit_norms, dtype=np.float64)
        finite = np.isfinite(norms)
        np.add.at(self.norm_sum, who[finite], norms[finite])
        np.add.at(self.clipped, who, (~finite) | (norms + CLIP_EPS > max_grad_norm))

    def result(self, data: TrainingData, *, max_grad_norm: float):
        from dpaudit.audit.groups import UnitClipping

        if not self.known:
            return None
        ids = data.unit_ids if data.unit_ids is not None else [str(u) for u in range(data.num_units)]
        return UnitClipping(unit_ids=np.asarray(ids, dtype=str), sampled=self.sampled, clipped=self.clipped,
                            norm_sum=self.norm_sum, max_grad_norm=max_grad_norm)


# --------------------------------------------------------------------------- trainers


def nonprivate(dataset, tokenizer, *, seed: int, config: Config | None = None, record: TrainingRecord | None = None,
               eval_dataset=None):
    """Non-private training (shuffled batches of ``train.batch_size`` rows, no clipping, no
    noise; epsilon = infinity). ``config=None`` uses the ``tiny`` preset."""
    return run_training(dataset, tokenizer, seed=seed, spec=NONPRIVATE, config=config, record=record,
                        eval_dataset=eval_dataset)


def dpsgd(dataset, tokenizer, *, seed: int, config: Config | None = None, record: TrainingRecord | None = None,
          eval_dataset=None):
    """DP-SGD (Abadi et al. 2016, arXiv 1607.00133) with Poisson sampling over the protected
    units of ``train.dp.unit``, per-unit clipping to ``train.dp.max_grad_norm``, Gaussian noise
    and division by the expected batch size. ``config=None`` uses the ``tiny`` preset with
    ``train.dp.noise_multiplier=1.0`` (a bare plug-in call)."""
    return run_training(dataset, tokenizer, seed=seed, spec=DPSGD, config=config, record=record,
                        eval_dataset=eval_dataset)


dpsgd.claims_dp = True  # the run checks its train.dp before any work
