"""Min-K% and Min-K%++: score a text by its least likely tokens.

* ``min_k`` (Shi et al. 2024, "Detecting Pretraining Data from Large Language Models",
  ICLR): the mean log-probability of the k% of the text's tokens that the model finds
  least likely. A member text has few very surprising tokens.
* ``min_k_pp`` (Zhang et al. 2025, "Min-K%++: Improved Baseline for Detecting
  Pre-Training Data from Large Language Models", ICLR): each token's log-probability is
  first standardised by the model's own next-token distribution at that position,
  ``(log p(x_t) - mu_t) / sigma_t`` with ``mu_t = E_z[log p(z)]`` and
  ``sigma_t^2 = Var_z[log p(z)]`` (``TokenSignals.mean`` / ``.std``); then the mean of
  the lowest k% is taken. Training on a text makes its tokens local maxima of the
  likelihood, which the standardisation detects.

The number of tokens kept is ``max(1, floor(k * T))`` for a text of ``T`` scored tokens;
``k = 1`` gives the mean over all tokens (the LOSS attack for ``min_k``).
"""

from __future__ import annotations

import numpy as np

from dpaudit.attacks.base import Attack, AttackInputs, sequence_logprob
from dpaudit.attacks.registry import register
from dpaudit.errors import InputError

__all__ = ["MinKAttack", "MinKPlusPlusAttack", "lowest_k_mean"]

#: Floor on sigma_t in Min-K%++: a (numerically) one-hot distribution has sigma = 0 and
#: log p - mu = 0; the standardised value tends to 0 there, which the floor reproduces.
STD_FLOOR = 1e-6


def lowest_k_mean(values: np.ndarray, mask: np.ndarray, k: float) -> np.ndarray:
    """Per row, the mean of the ``max(1, floor(k * count))`` smallest masked values (float64)."""
    values = np.asarray(values, dtype=np.float64)
    count = mask.sum(axis=1)
    keep = np.maximum(1, np.floor(k * count + 1e-9)).astype(np.int64)
    ordered = np.sort(np.where(mask, values, np.inf), axis=1)
    csum = np.cumsum(ordered, axis=1)
    return csum[np.arange(len(keep)), keep - 1] / keep


def _check_k(name: str, k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not (0.0 < float(k) <= 1.0):
        raise InputError(f"{name}: k must be a fraction in (0, 1], got {k!r}")


@register("min_k")
class MinKAttack(Attack):
    """Shi et al. 2024 Min-K%: mean of the lowest ``k`` fraction of token log-probs."""

    requires = frozenset()

    def __init__(self, *, k: float = 0.2) -> None:
        self.k = k

    def validate_params(self) -> None:
        _check_k(self.name, self.k)

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        t = inputs.target
        sequence_logprob(t, "target")  # refuses texts without a scored token
        return lowest_k_mean(t.logprob, t.mask, float(self.k))


@register("min_k_pp")
class MinKPlusPlusAttack(Attack):
    """Zhang et al. 2025 Min-K%++: mean of the lowest ``k`` fraction of
    ``(log p(x_t) - mu_t) / sigma_t``. Needs ``TokenSignals.mean``/``std``."""

    requires = frozenset()

    def __init__(self, *, k: float = 0.2) -> None:
        self.k = k

    def validate_params(self) -> None:
        _check_k(self.name, self.k)

    def missing(self, inputs: AttackInputs) -> list[str]:
        out = super().missing(inputs)
        if not inputs.target.has_distribution_stats:
            out.append("target mean/std (next-token distribution statistics)")
        return out

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        t = inputs.target
        sequence_logprob(t, "target")
        lp = t.logprob.astype(np.float64)
        z = (lp - t.mean) / np.maximum(t.std.astype(np.float64), STD_FLOOR)
        return lowest_k_mean(z, t.mask, float(self.k))
