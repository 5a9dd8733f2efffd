"""Test-only faulty DP-SGD steps, one per kind of parameter that per-sample machinery can get
wrong (issue 28): each clips every other parameter correctly. NEVER use them to train.

- biases unclipped: ``dpaudit.train.faulty:unclipped_params_step`` (the zoo's, every ``*bias``);
- :data:`norm_gains_unclipped_step`: norm layers' gains out of the norm, summed raw;
- :data:`linear_half_norm_step`: an ``nn.Linear`` layer's per-example norm counted at half
  its value (GPT-2's ``Conv1D`` is not an ``nn.Linear``; a tied output layer belongs to the
  embedding);
- :data:`embedding_out_of_norm_step`: the embeddings left out of the norm, then scaled by the
  clip factor of the rest.

From the repository root they are ``tests.step_faults:NAME`` for ``dpaudit validate --step``.
"""

from __future__ import annotations

import torch
from torch import nn

from dpaudit.train.engine import DPSGDEngine
from dpaudit.train.step import make_step


class KindFaultEngine(DPSGDEngine):
    """The squared per-example norm is sum_p weight(p) ||g_p||^2; parameters with weight None
    are not clipped at all (their raw per-example gradients are summed)."""

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self.weight = {name: self.norm_weight(model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2])
                       for name in self.params}

    @staticmethod
    def norm_weight(module: nn.Module, attr: str) -> float | None:
        return 1.0

    def clipped_sum(self, unit_grads, total, stats, units=None):
        first = next(iter(unit_grads.values()))
        if first.shape[0] == 0:
            return
        squares = torch.zeros(first.shape[0], dtype=torch.float32, device=first.device)
        for name, g in unit_grads.items():
            if self.weight[name] is not None:
                squares += self.weight[name] * g.reshape(g.shape[0], -1).pow(2).sum(1)
        factors = self.clip_factors(squares.sqrt())
        for name, g in unit_grads.items():
            total[name] += g.sum(0) if self.weight[name] is None else torch.einsum("k,k...->...", factors, g)
        self.record_norms(squares.sqrt(), stats, units)


class NormGainsUnclipped(KindFaultEngine):
    @staticmethod
    def norm_weight(module, attr):
        return None if "norm" in type(module).__name__.lower() and attr == "weight" else 1.0


class LinearHalfNorm(KindFaultEngine):
    @staticmethod
    def norm_weight(module, attr):
        return 0.25 if isinstance(module, nn.Linear) else 1.0


class EmbeddingOutOfNorm(KindFaultEngine):
    @staticmethod
    def norm_weight(module, attr):
        return 0.0 if isinstance(module, nn.Embedding) else 1.0


norm_gains_unclipped_step = make_step(NormGainsUnclipped, name="norm_gains_unclipped_step")
linear_half_norm_step = make_step(LinearHalfNorm, name="linear_half_norm_step")
embedding_out_of_norm_step = make_step(EmbeddingOutOfNorm, name="embedding_out_of_norm_step")

#: fault -> (step, the canary that should show it)
FAULTS = {
    "biases unclipped": ("dpaudit.train.faulty:unclipped_params_step", "bias"),
    "norm gains unclipped": (norm_gains_unclipped_step, "norm"),
    "nn.Linear norm at half": (linear_half_norm_step, "weights"),
    "embedding out of the norm": (embedding_out_of_norm_step, "embedding"),
}
