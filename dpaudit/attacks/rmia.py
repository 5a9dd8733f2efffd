"""RMIA (Zarifzadeh, Liu, Shokri 2024, "Low-Cost High-Power Membership Inference
Attacks", ICML).

RMIA compares the likelihood ratio of the candidate ``x`` with that of population
samples ``z`` known to be non-members:

    LR(x) = Pr(x | theta) / Pr(x),   Pr(x) = E_{theta'}[Pr(x | theta')] over reference models
    score(x) = Pr_z[ LR(x) / LR(z) > gamma ]                              (higher = member)

``Pr(x | theta)``: the paper uses the probability of the true label. For a text we use the
per-token geometric mean probability ``exp(mean token log-prob)``, a number in (0, 1]
comparable across lengths (the product of all token probabilities underflows, and the
offline correction below needs a probability on a [0, 1] scale). Ratios are taken in log
space.

``Pr(x)``, the average over reference models of which about half were trained on ``x``:

* online (``reference_keep`` given and the candidate has "in" and "out" models):
  ``Pr(x) = (mean_in + mean_out) / 2``, each a mean of ``Pr(x | theta')`` over the group;
* offline (only "out" models for the candidate, e.g. ``reference_keep`` None): the
  paper's linear approximation of the missing "in" models, ``Pr_in ~ a Pr_out + (1 - a)``,
  so ``Pr(x) = ((1 + a) Pr_out(x) + (1 - a)) / 2``;
* a candidate with "in" models only: the mean over them.

``a``: a number in [0, 1] is used as given. ``None`` (default): when some candidates have
both "in" and "out" reference models, ``a`` is fitted to them by least squares of
``1 - Pr_in = a (1 - Pr_out)`` (the approximation itself); otherwise ``a = 1``. The paper
tunes ``a`` for classifiers (0.3 and thereabouts), whose training points get probabilities
near 1; a text's per-token probability is far smaller (0.01 to 0.3), fine-tuning moves it
little, and with ``a = 0.3`` the constant ``(1 - a)`` would swamp ``Pr_out`` and reduce the
attack to LOSS. ``a = 1`` takes ``Pr(x) = Pr_out(x)``.

Population ``z``: ``inputs.population_target`` / ``population_references`` when given;
those texts are assumed to be in no reference model's training set, so ``Pr(z)`` uses the
offline formula. Without a population, each candidate is compared with all *other*
candidates (leave-one-out), with ``Pr(z)`` computed as for candidates. The candidates
include members, so the scores are no longer the paper's calibrated fractions, but they
rank the candidates exactly as ``LR(x)`` does, which is what ROC curves use.
"""

from __future__ import annotations

import math

import numpy as np

from dpaudit.attacks.base import (
    Attack,
    AttackInputs,
    reference_logprobs,
    sequence_logprob,
    split_in_out,
)
from dpaudit.attacks.registry import register
from dpaudit.errors import InputError

__all__ = ["RMIA"]


@register("rmia")
class RMIA(Attack):
    """Zarifzadeh et al. 2024: fraction of population ``z`` with ``LR(x)/LR(z) > gamma``.

    Parameters: ``gamma`` (> 0, default 1.0); ``a`` (offline approximation, in [0, 1],
    or None to fit it to in/out reference models, else 1.0; see the module docstring).
    """

    requires = frozenset({"references"})

    def __init__(self, *, gamma: float = 1.0, a: float | None = None) -> None:
        self.gamma = gamma
        self.a = a

    def validate_params(self) -> None:
        g = self.gamma
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not (0 < g < math.inf):
            raise InputError(f"rmia: gamma must be a positive number, got {g!r}")
        a = self.a
        if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float)) or not (0 <= a <= 1)):
            raise InputError(f"rmia: a must be None or in [0, 1], got {a!r}")

    def offline_a(self, inputs: AttackInputs) -> float:
        """The ``a`` used for the offline approximation on these inputs."""
        if self.a is not None:
            return float(self.a)
        if inputs.reference_keep is None:
            return 1.0
        st = split_in_out(np.exp(reference_logprobs(inputs.references)), inputs.reference_keep)
        both = (st.n_in > 0) & (st.n_out > 0)
        if not both.any():
            return 1.0
        u, v = 1.0 - st.mean_in[both], 1.0 - st.mean_out[both]
        return float(np.clip(np.dot(u, v) / max(np.dot(v, v), 1e-300), 0.0, 1.0))

    @staticmethod
    def _offline(p_out: np.ndarray, a: float) -> np.ndarray:
        return 0.5 * ((1.0 + a) * p_out + (1.0 - a))

    def _log_ratio_candidates(self, inputs: AttackInputs, a: float) -> np.ndarray:
        log_p = sequence_logprob(inputs.target, "target")
        st = split_in_out(np.exp(reference_logprobs(inputs.references)), inputs.reference_keep)
        has_in, has_out = st.n_in > 0, st.n_out > 0
        with np.errstate(invalid="ignore"):
            marginal = np.where(
                has_in & has_out,
                0.5 * (st.mean_in + st.mean_out),
                np.where(has_out, self._offline(st.mean_out, a), st.mean_in),
            )
        return log_p - np.log(marginal)

    def _log_ratio_population(self, inputs: AttackInputs, a: float) -> np.ndarray:
        log_p = sequence_logprob(inputs.population_target, "population_target")
        p_ref = np.exp(reference_logprobs(inputs.population_references, "population_references"))
        return log_p - np.log(self._offline(p_ref.mean(axis=0), a))

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        a = self.offline_a(inputs)
        r_x = self._log_ratio_candidates(inputs, a)
        threshold = r_x - math.log(float(self.gamma))  # LR(x)/LR(z) > gamma  <=>  r_z < threshold
        if inputs.population_target is not None:
            r_z = np.sort(self._log_ratio_population(inputs, a))
            if r_z.size == 0:
                raise InputError("rmia: the population is empty")
            return np.searchsorted(r_z, threshold, side="left") / r_z.size
        if r_x.size < 2:
            raise InputError("rmia without a population compares candidates with each other; it needs at least 2")
        counts = np.searchsorted(np.sort(r_x), threshold, side="left")
        counts -= r_x < threshold  # leave x itself out
        return counts / (r_x.size - 1)
