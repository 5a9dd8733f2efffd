"""The plan of a training run, resolved before the first step: its number of steps, its
privacy (sampling rate, noise calibrated from a target epsilon, delta), its learning-rate
schedule, optimizer and precision, and the DP record it will claim."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpaudit import accounting
from dpaudit.accounting import DpRecord
from dpaudit.config import DPConfig, TrainConfig
from dpaudit.errors import InputError

RELEASE_WARNING = ("trained in reproducible mode (train.dp.reproducible: true): its DP noise and Poisson batches "
                   "follow from the run seed, so anyone with the seed can replay them; not fit for release")
GRADIENT_CANARY_WARNING = ("trained with gradient canaries (train.dp.gradient_canaries > 0): an audit model, whose "
                           "DP-SGD run carried canary gradients to measure its noise; not fit for release")


def release_warning(*, reproducible: bool, gradient_canaries: int = 0) -> str | None:
    """The warning a DP model carries in its DP record and its config.json: :data:`RELEASE_WARNING`
    (reproducible mode), :data:`GRADIENT_CANARY_WARNING` (a run with gradient canaries), both
    when both apply, None when neither does."""
    parts = [w for w, on in ((RELEASE_WARNING, reproducible), (GRADIENT_CANARY_WARNING, gradient_canaries > 0)) if on]
    return "; and ".join(parts) or None


def noise_mode(private: bool, dp: DPConfig) -> str | None:
    """``"secure"`` (noise and sampling from OS entropy, the default of DP training),
    ``"reproducible"`` (both from the run seed) or None (non-private training: no noise)."""
    if not private:
        return None
    return "reproducible" if dp.reproducible else "secure"


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


def dp_record(*, trainer: str, sampler: str, plan: PrivacyPlan | None, num_units: int, steps: int, batch_size: int,
              noise: str | None = None, gradient_canaries: int = 0) -> DpRecord:
    """The :class:`~dpaudit.accounting.DpRecord` a run of this plan claims (``plan`` None: a
    non-private run, which samples with ``sampler``); ``noise`` is the mode of
    :func:`noise_mode`, and the record of a reproducible run or of a run with
    ``gradient_canaries`` carries :func:`release_warning`."""
    warning = release_warning(reproducible=noise == "reproducible", gradient_canaries=gradient_canaries)
    if plan is None:
        return DpRecord.nonprivate(trainer=trainer, num_units=num_units, steps=steps, expected_batch_size=batch_size,
                                   sampler=sampler, noise=noise, warning=warning)
    # sampler "poisson": what the accounting assumes, whatever the trainer does (train_checks.json tests it)
    return DpRecord.dpsgd(trainer=trainer, noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
                          steps=plan.steps, delta=plan.delta, max_grad_norm=plan.max_grad_norm, unit=plan.unit,
                          num_units=plan.num_units, expected_batch_size=plan.expected_batch_size,
                          accountant=plan.accountant, target_epsilon=plan.target_epsilon, noise=noise,
                          warning=warning)


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


def lr_factors(train: TrainConfig, steps: int) -> list[float]:
    """:func:`lr_factor` of every step of a run of ``steps`` steps with ``train``'s schedule."""
    return [lr_factor(t, schedule=train.schedule, warmup_steps=train.warmup_steps, total_steps=steps)
            for t in range(steps)]


def step_weights(train: TrainConfig, steps: int) -> list[float] | None:
    """How much of each step's noisy gradient sum the final model holds, for linear losses,
    relative to the step it holds most of: the weights of the last-iterate statistic
    (Steinke et al. 2025, arXiv 2410.06186; :func:`dpaudit.accounting.last_iterate_epsilon`)
    under this loop's optimizer (:func:`make_optimizer`) and schedule (:func:`lr_factors`).
    Plain SGD at a constant rate weighs every step alike. Momentum spreads a step's sum over
    the steps after it, so the last steps' sums are only partly applied when training stops.
    AdamW is taken where DP noise dominates its second moment, on every coordinate a canary
    moves (Tang et al. 2023, "DP-AdamBC", arXiv 2312.14334): noise of constant power, about
    which its update is linearized; the response of step t's update to step s's sum is then
    on average a_ts (1 - c_ts), a_ts and c_ts the bias-corrected weights of step s in the first
    and second moments at step t (the second moment holds the sum too, and normalizes part of
    it away: all of it at the first step, whose update is a sign). Weight decay shrinks the
    earlier steps' share. None for a trainer other than the toolkit's own loop: its update
    rule is unknown."""
    if not _own_loop(train):
        return None
    lr = train.lr * np.asarray(lr_factors(train, steps))
    theta, moment = np.zeros(steps), np.zeros(steps)  # the response of the final model to each step's sum
    beta1, beta2 = 0.9, 0.999  # torch.optim.AdamW's defaults, which make_optimizer keeps
    for t in range(steps):
        if train.optimizer == "adamw":
            age = t - np.arange(t + 1)
            first = (1 - beta1) * beta1 ** age / (1 - beta1 ** (t + 1))
            second = (1 - beta2) * beta2 ** age / (1 - beta2 ** (t + 1))
            theta = theta * (1 - lr[t] * train.weight_decay)
            theta[: t + 1] -= lr[t] * first * (1 - second)
        else:  # torch.optim.SGD: coupled weight decay, heavy-ball momentum without dampening
            d = train.weight_decay * theta
            d[t] += 1.0  # step t's sum
            moment = d if t == 0 else train.momentum * moment + d
            theta = theta - lr[t] * moment
    weights = -theta
    return (weights / weights.max()).tolist() if weights.max() > 0 else None


def optimizer_response(train: TrainConfig, steps: int) -> Callable[[Iterable[np.ndarray]], np.ndarray] | None:
    """This loop's optimizer and schedule (:func:`make_optimizer`, :func:`make_scheduler`) as a
    function: the gradients of one parameter, an array per step for ``steps`` steps, to its
    displacement from where it started, run by torch as the loop runs it (float32). Where
    :func:`step_weights` linearizes AdamW, this is its update itself: the final-model ideal of a
    released model (:func:`dpaudit.audit.ladder.ideal_scores`). None for a trainer other than
    the toolkit's own loop: its update rule is unknown."""
    if not _own_loop(train):
        return None

    def respond(grads: Iterable[np.ndarray]) -> np.ndarray:
        param = optimizer = scheduler = None
        for grad in grads:
            grad = torch.as_tensor(np.asarray(grad), dtype=torch.float32)
            if param is None:
                param = torch.nn.Parameter(torch.zeros_like(grad))
                optimizer = make_optimizer([param], train)
                scheduler = make_scheduler(optimizer, train, steps)
            param.grad = grad
            optimizer.step()
            scheduler.step()
        if param is None:
            raise InputError("optimizer_response: no gradients")
        return param.detach().numpy()

    return respond


def _own_loop(train: TrainConfig) -> bool:
    return train.trainer.startswith("dpaudit.train")


def make_optimizer(params: Sequence[torch.nn.Parameter], train: TrainConfig) -> torch.optim.Optimizer:
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    raise InputError(f"train.optimizer must be adamw or sgd, got {train.optimizer!r}")


def make_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig,
                   steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``train``'s schedule (:func:`lr_factor`) over a run of ``steps`` steps, on ``optimizer``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(
        s, schedule=train.schedule, warmup_steps=train.warmup_steps, total_steps=steps))
