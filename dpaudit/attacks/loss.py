"""LOSS attack (Yeom, Giacomelli, Fredrikson, Jha 2018, "Privacy Risk in Machine Learning:
Analyzing the Connection to Overfitting"): training examples have lower loss.

score = mean token log-probability of the text under the target model = minus its LM loss.
"""

from __future__ import annotations

import numpy as np

from dpaudit.attacks.base import Attack, AttackInputs, sequence_logprob
from dpaudit.attacks.registry import register

__all__ = ["LossAttack"]


@register("loss")
class LossAttack(Attack):
    """Yeom et al. 2018: score = -loss = mean scored-token log-probability. No parameters."""

    requires = frozenset()

    def __init__(self) -> None:
        pass

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        return sequence_logprob(inputs.target, "target")
