"""Deliberately broken DP-SGD trainers, for validating the audits. NEVER use them to train.

Each one runs the real loop and records the same ``dp_event.json`` as
``dpaudit.train:dpsgd`` (it claims the correct Poisson-sampled Gaussian guarantee, and its
``train_checks.json`` claims Poisson sampling), but breaks one step of DP-SGD; the one
exception, ``microstep_accounting``, breaks the accounting itself: its correct-looking
record is that of the wrong event (rate q / k, k * T steps).

===========================  ==============================================================
``no_noise``                 no Gaussian noise at all
``unscaled_noise``           noise N(0, sigma^2 I): not multiplied by the clipping norm C
                             (1/C times the right noise: a no-op at C = 1, over-noised
                             for C < 1; a leak only for C > 1)
``batch_clipping``           the summed batch gradient is clipped to C, not each unit's
``shuffle_as_poisson``       shuffled fixed-size batches, accounted as Poisson sampling
``realised_batch_size``      the noisy sum is divided by the realised batch size
``mean_noise_on_sum``        noise std sigma * C / B (calibrated for the mean) added to the
                             sum before dividing by B: B times too little noise
``microstep_accounting``     accounts each of k = 4 gradient-accumulation micro-steps as a
                             step: records rate q / k and k * T steps, samples at rate q
``noisy_microsteps``         CONSERVATIVE (over-noised, no privacy bug): each of k = 4
                             micro-steps adds its own noise, sqrt(k) times the claimed std
``nonfinite_passthrough``    norms of loss-scaled gradients overflow float16 to inf; an
                             inf/nan guard maps them to 0, so those units go in unclipped
``unclipped_params``         biases are left out of per-unit clipping but still updated
                             with their raw summed gradient
``reused_noise``             the same noise vector at every step (a reused PRNG key)
===========================  ==============================================================

Direction. Every variant but ``noisy_microsteps`` is less private than its recorded
guarantee (a sound audit may flag it); ``noisy_microsteps`` is MORE private than claimed
(a negative control: an audit that flags it is wrong). :data:`CONSERVATIVE` names it.

Where the bug classes come from (kinds, not citations of particular reports):
``mean_noise_on_sum`` and ``noisy_microsteps`` are the two ways of getting the noise scale
wrong when the noise is added at a different point (sum vs mean, per micro-batch vs per
logical batch) than the calibration assumed, a recurring topic of DP-SGD library issue
threads on noise scaling with gradient accumulation / virtual batches;
``microstep_accounting`` is the accounting side of the same confusion (physical vs logical
batches: the accountant is stepped per micro-batch, or q is computed from the physical
batch size; Opacus's ``BatchMemoryManager`` and ``signal_skip_step`` exist to keep them
apart); ``nonfinite_passthrough`` combines two recurring hazards, low-precision /
mixed-precision per-sample norm computation and non-finite guards that fail open;
``unclipped_params`` is the class where per-sample gradient machinery covers only some
layer types or parameters (hooks-based implementations support a list of layers) and the
rest is trained with ordinary batch gradients; ``reused_noise`` is the functional-PRNG
mistake of drawing every step's noise from the same key (JAX without ``random.split``) or
re-seeding the noise generator each step.

Kept apart from the real engine on purpose: nothing in :mod:`dpaudit.train.engine` knows
about these variants. Use them as ``train.trainer: dpaudit.train.faulty:NAME``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from dpaudit import accounting
from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.train.engine import CANARY_KEY, CLIP_EPS, DPSGDEngine, StepStats
from dpaudit.train.loop import TrainerSpec, default_config, run_training
from dpaudit.train.plan import num_steps, sample_rate
from dpaudit.train.record import TrainingRecord
from dpaudit.train.units import group_units
from dpaudit.train.step import make_step

MICROSTEPS = 4  # k: gradient-accumulation micro-steps per logical step, for the micro-step variants


class NoNoiseEngine(DPSGDEngine):
    def add_noise(self, summed, generator):
        return summed


class UnscaledNoiseEngine(DPSGDEngine):
    def noise_std(self) -> float:
        return self.noise_multiplier  # should be noise_multiplier * max_grad_norm


class BatchClippingEngine(DPSGDEngine):
    def summed_gradients(self, units):
        def add_unclipped(unit_grads, total, stats, units):
            if next(iter(unit_grads.values())).shape[0] == 0:
                return
            for name, g in unit_grads.items():
                total[name] += g.sum(0)
            norms = torch.stack([g.reshape(g.shape[0], -1).pow(2).sum(1) for g in unit_grads.values()]).sum(0).sqrt()
            stats.add_norms(norms, units, max_grad_norm=math.inf)  # no unit is clipped

        total, stats = self._summed(units, add_unclipped)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in total.values()))
        factor = (self.max_grad_norm / (norm + CLIP_EPS)).clamp(max=1.0)
        return {name: g * factor for name, g in total.items()}, stats


class RealisedBatchSizeEngine(DPSGDEngine):
    def normalize(self, noisy, realised_batch_size):
        return {name: g / max(realised_batch_size, 1) for name, g in noisy.items()}


class MeanNoiseOnSumEngine(DPSGDEngine):
    """Noise std sigma * C / B, right for the mean, added to the sum, which is then divided
    by B: the update's noise std is sigma * C / B^2 instead of sigma * C / B."""

    def noise_std(self) -> float:
        return super().noise_std() / self.expected_batch_size


class NoisyMicrostepsEngine(DPSGDEngine):
    """Gradient accumulation over ``microsteps`` micro-steps (the batch's units split into k
    contiguous chunks), each micro-step adding its own N(0, sigma^2 C^2 I) to its partial
    clipped sum: total noise std sqrt(k) * sigma * C. Over-noised, not a privacy bug.
    Gradient canaries get their k noise draws too (their block in the first micro-step's sum)."""

    microsteps = MICROSTEPS

    def step(self, units, generator=None) -> StepStats:
        units = list(units)
        k = self.microsteps
        bounds = [round(i * len(units) / k) for i in range(k + 1)]
        total, stats = self.zeros(), StepStats()
        for lo, hi in itertools.pairwise(bounds):
            partial, part = self.summed_gradients(units[lo:hi])
            noisy = self.add_noise(partial, generator)  # the bug: noise per micro-step
            for name in total:
                total[name] += noisy[name]
            stats.num_units += part.num_units
            stats.merge(part, range(lo, hi))
        if self.canaries is not None:
            block = self.canaries.block(device=self.device)
            source = self.canaries.noise_source(generator)
            released = self.add_noise({CANARY_KEY: block}, source)[CANARY_KEY]
            for _ in range(k - 1):  # the bug on the canaries' coordinates too: noise per micro-step
                released = released + self.add_noise({CANARY_KEY: torch.zeros_like(block)}, source)[CANARY_KEY]
            self.canaries.observe(released)
        update = self.normalize(total, len(units))
        for name, p in self.params.items():
            p.grad = update[name].to(p.dtype)
        return stats


class NonfinitePassthroughEngine(DPSGDEngine):
    """Per-unit norms taken of the loss-scaled gradient (mixed-precision training with a
    loss scaler, initial scale ``loss_scale`` = 2^16 as torch's ``GradScaler``) with the
    squared norm held in ``norm_dtype`` = float16: it overflows to inf once
    ``loss_scale * ||g||`` exceeds sqrt(65504) ~ 256, i.e. ||g|| > ~0.0039. A guard meant to
    keep NaN out of the clip factor maps non-finite norms to 0 (``nan_to_num(norm, nan=0,
    posinf=0)``), and a norm of 0 means "no clipping needed": the clip factor is 1 and the
    unit's full gradient goes in. Units whose gradient norm is below the threshold are
    clipped correctly. Here nearly every unit overflows, and the larger a unit's gradient
    (an outlier, a canary) the surer it passes unclipped; a NaN gradient passes too (as in
    the correct engine, where it makes the update NaN)."""

    loss_scale = 2.0**16
    norm_dtype = torch.float16

    def clip_factors(self, norms):
        squared = (norms * self.loss_scale).pow(2).to(self.norm_dtype)
        guarded = torch.where(torch.isfinite(squared), norms, torch.zeros_like(norms))  # fails open
        return super().clip_factors(guarded)


class UnclippedParamsEngine(DPSGDEngine):
    """Parameters named ``*bias`` are outside the per-unit clipping: the norm is taken over
    the other parameters only, and the biases get the raw sum of their per-unit gradients
    (then noise and division by B as usual). Their sensitivity is unbounded."""

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self.unclipped = {name for name in self.params if self.is_unclipped(name)}
        if not self.unclipped or len(self.unclipped) == len(self.params):
            raise InputError(
                "dpaudit.train.faulty:unclipped_params needs trainable bias parameters and others "
                f"({len(self.unclipped)} of {len(self.params)} trainable parameters are biases; with LoRA there are none)"
            )

    @staticmethod
    def is_unclipped(name: str) -> bool:
        return name.endswith("bias")

    def summed_gradients(self, units):
        def accumulate(unit_grads, total, stats, units):
            if next(iter(unit_grads.values())).shape[0] == 0:
                return
            for name in self.unclipped:
                total[name] += unit_grads[name].sum(0)
            self.clipped_sum({n: g for n, g in unit_grads.items() if n not in self.unclipped}, total, stats, units)

        return self._summed(units, accumulate)


class ReusedNoiseEngine(DPSGDEngine):
    """The noise vector is drawn once, at the first step, and added again at every step (as
    with a PRNG key that is never split): the difference of two updates is noise-free. Each
    tensor's noise is drawn the first time it is seen (the parameters' at the first step,
    then the gradient canaries' block's)."""

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self._noise: dict[str, torch.Tensor] = {}

    def add_noise(self, summed, generator):
        std = self.noise_std()
        if std == 0:
            return summed
        for name, g in summed.items():
            if name not in self._noise:
                self._noise[name] = std * torch.randn(g.shape, generator=generator, device=g.device, dtype=g.dtype)
        return {name: g + self._noise[name] for name, g in summed.items()}


SPECS: dict[str, TrainerSpec] = {
    "no_noise": TrainerSpec("dpaudit.train.faulty:no_noise", private=True, engine=NoNoiseEngine),
    "unscaled_noise": TrainerSpec("dpaudit.train.faulty:unscaled_noise", private=True, engine=UnscaledNoiseEngine),
    "batch_clipping": TrainerSpec("dpaudit.train.faulty:batch_clipping", private=True, engine=BatchClippingEngine),
    "shuffle_as_poisson": TrainerSpec(
        "dpaudit.train.faulty:shuffle_as_poisson", private=True, engine=DPSGDEngine, sampler="shuffle"
    ),
    "realised_batch_size": TrainerSpec(
        "dpaudit.train.faulty:realised_batch_size", private=True, engine=RealisedBatchSizeEngine
    ),
    "mean_noise_on_sum": TrainerSpec("dpaudit.train.faulty:mean_noise_on_sum", private=True, engine=MeanNoiseOnSumEngine),
    "microstep_accounting": TrainerSpec(
        "dpaudit.train.faulty:microstep_accounting", private=True, engine=DPSGDEngine
    ),
    "noisy_microsteps": TrainerSpec("dpaudit.train.faulty:noisy_microsteps", private=True, engine=NoisyMicrostepsEngine),
    "nonfinite_passthrough": TrainerSpec(
        "dpaudit.train.faulty:nonfinite_passthrough", private=True, engine=NonfinitePassthroughEngine
    ),
    "unclipped_params": TrainerSpec("dpaudit.train.faulty:unclipped_params", private=True, engine=UnclippedParamsEngine),
    "reused_noise": TrainerSpec("dpaudit.train.faulty:reused_noise", private=True, engine=ReusedNoiseEngine),
}

CONSERVATIVE = frozenset({"noisy_microsteps"})  # more private than claimed: audits must NOT flag these

DESCRIPTIONS = {
    "no_noise": "no Gaussian noise",
    "unscaled_noise": "noise standard deviation sigma instead of sigma * C",
    "batch_clipping": "the batch gradient is clipped instead of each unit's",
    "shuffle_as_poisson": "shuffled fixed-size batches accounted as Poisson sampling",
    "realised_batch_size": "noisy sum divided by the realised batch size instead of the expected one",
    "mean_noise_on_sum": (
        "noise calibrated for the mean (std sigma * C / B) but added to the sum, so B times too little "
        "noise: a recurring bug class in DP-SGD implementations (where the noise goes relative to the "
        "division by B, e.g. library issue threads on noise scaling with gradient accumulation)"
    ),
    "microstep_accounting": (
        f"gradient accumulation accounted per micro-step: records rate q / {MICROSTEPS} and {MICROSTEPS} times "
        "the steps while sampling at rate q, which understates epsilon (about sqrt(k) times at small q); "
        "the physical-vs-logical batch confusion of accountants stepped per micro-batch or fed the "
        "physical batch size"
    ),
    "noisy_microsteps": (
        f"CONSERVATIVE, not a privacy bug: gradient accumulation over {MICROSTEPS} micro-steps, each adding its "
        "own noise, so the noise std is sqrt(k) times the claimed one (over-noised; a negative control); "
        "the noise-placement side of the micro-batch confusion"
    ),
    "nonfinite_passthrough": (
        "per-unit norms of loss-scaled (x 2^16) gradients overflow float16 to inf and a non-finite guard "
        "maps them to 0, i.e. clip factor 1: units with norm above ~0.0039 go in unclipped; the "
        "mixed-precision per-sample norm hazard combined with a nan/inf guard that fails open"
    ),
    "unclipped_params": (
        "biases are left out of per-unit clipping and updated with their raw summed gradient: the class "
        "where per-sample gradient machinery covers only some layers or parameters"
    ),
    "reused_noise": (
        "the same noise vector at every step, as with a reused (never split) PRNG key or a noise "
        "generator re-seeded each step: differences of updates are noise-free"
    ),
}


def _run(dataset, tokenizer, *, seed, spec, config, record, eval_dataset):
    return run_training(dataset, tokenizer, seed=seed, spec=spec, config=config, record=record,
                        eval_dataset=eval_dataset)


def _microstep_accounting(dataset, tokenizer, *, seed, spec, config, record, eval_dataset):
    """Train with the correct engine and Poisson rate q; record the accounting of k = MICROSTEPS
    micro-steps per step at rate q / k (sigma calibrated that way from a target epsilon)."""
    k = MICROSTEPS
    config = config if config is not None else default_config(spec)
    dp = config.train.dp if isinstance(config, Config) else None
    if dp is None or (dp.noise_multiplier is None) == (dp.target_epsilon is None):
        # let the real loop reject the config with its own message
        return run_training(dataset, tokenizer, seed=seed, spec=spec, config=config, record=record,
                            eval_dataset=eval_dataset)
    num_units = len(group_units(dataset, dp.unit))
    steps = num_steps(config.train, num_units)
    q = sample_rate(config.train.batch_size, num_units)
    delta = accounting.default_delta(num_units) if dp.delta is None else accounting.check_delta(dp.delta, num_units)
    sigma = dp.noise_multiplier
    if sigma is None:  # calibrated under the wrong accounting: too little noise for the target
        sigma = accounting.noise_multiplier(target_epsilon=dp.target_epsilon, sample_rate=q / k, steps=k * steps,
                                            delta=delta, method=dp.accountant)
        dp_run = dataclasses.replace(dp, noise_multiplier=float(sigma), target_epsilon=None)
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, dp=dp_run))
    model = run_training(dataset, tokenizer, seed=seed, spec=spec, config=config, record=record,
                         eval_dataset=eval_dataset)
    if record is not None:
        event = accounting.make_event(noise_multiplier=float(sigma), sample_rate=q / k, steps=k * steps)
        record.dp = record.dp.replace(
            event=event,
            logged_epsilon=accounting.epsilon_from_event(event, delta=delta, method=dp.accountant),
            sample_rate=q / k,
            steps=k * steps,
            target_epsilon=dp.target_epsilon,
        )
    return model


def _trainer(key: str):
    spec = SPECS[key]

    def train(dataset, tokenizer, *, seed: int, config: Config | None = None, record: TrainingRecord | None = None,
              eval_dataset=None):
        run = _microstep_accounting if key == "microstep_accounting" else _run
        return run(dataset, tokenizer, seed=seed, spec=spec, config=config, record=record,
                   eval_dataset=eval_dataset)

    train.__name__ = train.__qualname__ = key
    claim = ("Records the guarantee of its wrong accounting." if key == "microstep_accounting"
             else "Claims the correct guarantee.")
    train.__doc__ = f"FAULTY DP-SGD for validation: {DESCRIPTIONS[key]}. {claim}"
    train.claims_dp = True
    return train


no_noise = _trainer("no_noise")
unscaled_noise = _trainer("unscaled_noise")
batch_clipping = _trainer("batch_clipping")
shuffle_as_poisson = _trainer("shuffle_as_poisson")
realised_batch_size = _trainer("realised_batch_size")
mean_noise_on_sum = _trainer("mean_noise_on_sum")
microstep_accounting = _trainer("microstep_accounting")
noisy_microsteps = _trainer("noisy_microsteps")
nonfinite_passthrough = _trainer("nonfinite_passthrough")
unclipped_params = _trainer("unclipped_params")
reused_noise = _trainer("reused_noise")

FAULTY_TRAINERS = {key: globals()[key] for key in SPECS}

# One update of each faulty engine as a step plug-in for ``dpaudit validate --step``
# (:func:`dpaudit.train.step.make_step`: the engine, then plain SGD), named ``KEY_step``.
# ``reused_noise_step`` keeps its noise vector from one call to the next, as the trainer keeps
# it from one step to the next. ``shuffle_as_poisson`` and ``microstep_accounting`` have no
# step of their own: their update is the correct one (the bug is in sampling / accounting).
FAULTY_STEPS = {key: make_step(SPECS[key].engine, keep=("_noise",) if key == "reused_noise" else (),
                               name=f"{key}_step")
                for key in SPECS if key not in ("shuffle_as_poisson", "microstep_accounting")}
no_noise_step = FAULTY_STEPS["no_noise"]
unscaled_noise_step = FAULTY_STEPS["unscaled_noise"]
batch_clipping_step = FAULTY_STEPS["batch_clipping"]
realised_batch_size_step = FAULTY_STEPS["realised_batch_size"]
mean_noise_on_sum_step = FAULTY_STEPS["mean_noise_on_sum"]
noisy_microsteps_step = FAULTY_STEPS["noisy_microsteps"]
nonfinite_passthrough_step = FAULTY_STEPS["nonfinite_passthrough"]
unclipped_params_step = FAULTY_STEPS["unclipped_params"]
reused_noise_step = FAULTY_STEPS["reused_noise"]

__all__ = ["CONSERVATIVE", "DESCRIPTIONS", "FAULTY_STEPS", "FAULTY_TRAINERS", *SPECS,  # noqa: PLE0604
           *(f"{key}_step" for key in FAULTY_STEPS)]
