"""Deliberately broken DP-SGD trainers, for validating the audits. NEVER use them to train.

Each one runs the real loop and records the same ``dp_event.json`` as
``dpaudit.train:dpsgd`` (it claims the correct Poisson-sampled Gaussian guarantee, and its
``train_checks.json`` claims Poisson sampling), but breaks one step of DP-SGD:

===========================  ==============================================================
``no_noise``                 no Gaussian noise at all
``unscaled_noise``           noise N(0, sigma^2 I): not multiplied by the clipping norm C
``batch_clipping``           the summed batch gradient is clipped to C, not each unit's
``shuffle_as_poisson``       shuffled fixed-size batches, accounted as Poisson sampling
``realised_batch_size``      the noisy sum is divided by the realised batch size
===========================  ==============================================================

Kept apart from the real engine on purpose: nothing in :mod:`dpaudit.train.engine` knows
about these variants. Use them as ``train.trainer: dpaudit.train.faulty:NAME``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dpaudit.config import Config
from dpaudit.train.engine import CLIP_EPS, DPSGDEngine
from dpaudit.train.loop import TrainerSpec, run_training


class NoNoiseEngine(DPSGDEngine):
    def add_noise(self, summed, generator):
        return summed


class UnscaledNoiseEngine(DPSGDEngine):
    def noise_std(self) -> float:
        return self.noise_multiplier  # should be noise_multiplier * max_grad_norm


class BatchClippingEngine(DPSGDEngine):
    def summed_gradients(self, units):
        def add_unclipped(unit_grads, total, stats):
            if next(iter(unit_grads.values())).shape[0] == 0:
                return
            for name, g in unit_grads.items():
                total[name] += g.sum(0)
            stats.unit_norms.extend(
                torch.stack([g.reshape(g.shape[0], -1).pow(2).sum(1) for g in unit_grads.values()]).sum(0).sqrt().tolist()
            )

        total, stats = self._summed(units, add_unclipped)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in total.values()))
        factor = (self.max_grad_norm / (norm + CLIP_EPS)).clamp(max=1.0)
        return {name: g * factor for name, g in total.items()}, stats


class RealisedBatchSizeEngine(DPSGDEngine):
    def normalize(self, noisy, realised_batch_size):
        return {name: g / max(realised_batch_size, 1) for name, g in noisy.items()}


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
}

DESCRIPTIONS = {
    "no_noise": "no Gaussian noise",
    "unscaled_noise": "noise standard deviation sigma instead of sigma * C",
    "batch_clipping": "the batch gradient is clipped instead of each unit's",
    "shuffle_as_poisson": "shuffled fixed-size batches accounted as Poisson sampling",
    "realised_batch_size": "noisy sum divided by the realised batch size instead of the expected one",
}


def _trainer(key: str):
    spec = SPECS[key]

    def train(dataset, tokenizer, *, seed: int, config: Config | None = None, run_dir: str | Path | None = None,
              eval_dataset=None):
        return run_training(dataset, tokenizer, seed=seed, spec=spec, config=config, run_dir=run_dir,
                            eval_dataset=eval_dataset)

    train.__name__ = train.__qualname__ = key
    train.__doc__ = f"FAULTY DP-SGD for validation: {DESCRIPTIONS[key]}. Claims the correct guarantee."
    train.claims_dp = True
    return train


no_noise = _trainer("no_noise")
unscaled_noise = _trainer("unscaled_noise")
batch_clipping = _trainer("batch_clipping")
shuffle_as_poisson = _trainer("shuffle_as_poisson")
realised_batch_size = _trainer("realised_batch_size")

FAULTY_TRAINERS = {key: globals()[key] for key in SPECS}

__all__ = ["DESCRIPTIONS", "FAULTY_TRAINERS", *SPECS]
