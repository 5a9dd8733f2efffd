"""Likelihood-ratio attacks, LiRA (Carlini, Chien, Nasr, Song, Terzis, Tramer 2022,
"Membership Inference Attacks From First Principles", IEEE S&P).

For each candidate ``x`` the attack models the distribution of a per-example statistic
``phi(f(x))`` over models trained with ``x`` ("in") and without it ("out") as Gaussians
fitted on reference (shadow) models, and asks which one better explains the target's
value. The paper's statistic for classifiers is the logit-scaled confidence
``log(p / (1 - p))``; for language models we use the sequence-level statistic

    phi(x) = mean token log-probability of x   (= minus the LM loss)

An average over many tokens is close to Gaussian, and unlike the sum it does not scale
with the text's length.

* ``lira_online``: ``score = log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2)``,
  the log likelihood ratio. Needs ``references`` and ``reference_keep``.
* ``lira_offline``: only "out" models. One-sided test of "phi came from the out
  distribution": ``score = -log Pr[Z >= phi]``, ``Z ~ N(mu_out, s_out^2)``, minus the log
  p-value (higher = member; a monotone function of ``(phi - mu_out) / s_out``). Uses the
  references with ``reference_keep`` False for each candidate, or all of them when
  ``reference_keep`` is None.

``variance``:
  ``"fixed"`` (default): one variance for all candidates per group (in / out), pooled
  from the deviations of each candidate's reference values from that candidate's mean.
  The paper recommends it when there are few reference models (below ~64).
  ``"per_example"``: each candidate's own sample variance over its in (out) models;
  candidates with fewer than two models in a group use the pooled value.

Gaps: a candidate without any "in" (or "out") reference model gets the other group's mean
shifted by the average in-minus-out gap of the candidates that have both. When a pooled
variance has no degrees of freedom (one model per group and candidate), the other
group's is used, and when neither has any, 1.0: with equal variances the scores' order
does not depend on their value.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _stats

from dpaudit.attacks.base import (
    Attack,
    AttackInputs,
    InOut,
    fill_missing_means,
    reference_logprobs,
    sequence_logprob,
    split_in_out,
)
from dpaudit.attacks.registry import register
from dpaudit.errors import InputError

__all__ = ["LiraOffline", "LiraOnline"]

_VARIANCES = ("fixed", "per_example")
_MIN_STD = 1e-12


def _pooled(stats: InOut) -> tuple[float, float]:
    vi, vo = stats.pooled_var_in, stats.pooled_var_out
    if math.isnan(vi) and math.isnan(vo):
        return 1.0, 1.0
    if math.isnan(vi):
        vi = vo
    if math.isnan(vo):
        vo = vi
    return vi, vo


def _stds(stats: InOut, variance: str) -> tuple[np.ndarray, np.ndarray]:
    vi, vo = _pooled(stats)
    n = len(stats.n_in)
    if variance == "fixed":
        var_in, var_out = np.full(n, vi), np.full(n, vo)
    else:
        var_in = np.where(stats.n_in >= 2, stats.var_in, vi)
        var_out = np.where(stats.n_out >= 2, stats.var_out, vo)
    return np.maximum(np.sqrt(var_in), _MIN_STD), np.maximum(np.sqrt(var_out), _MIN_STD)


class _Lira(Attack):
    def __init__(self, *, variance: str = "fixed") -> None:
        self.variance = variance

    def validate_params(self) -> None:
        if self.variance not in _VARIANCES:
            raise InputError(f"{self.name}: variance must be one of {_VARIANCES}, got {self.variance!r}")

    def _fit(self, inputs: AttackInputs, *, need_in: bool):
        phi = sequence_logprob(inputs.target, "target")
        stats = split_in_out(reference_logprobs(inputs.references), inputs.reference_keep)
        mu_in, mu_out = fill_missing_means(stats, self.name, need_in=need_in)
        s_in, s_out = _stds(stats, self.variance)
        return phi, mu_in, mu_out, s_in, s_out


@register("lira_online")
class LiraOnline(_Lira):
    """Carlini et al. 2022 online LiRA: Gaussian log likelihood ratio in vs out."""

    requires = frozenset({"references", "reference_keep"})

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        keep = inputs.reference_keep
        if not keep.any() or keep.all():
            raise InputError(
                f"{self.name} needs reference models with and without each candidate; "
                "reference_keep is all " + ("True" if keep.all() else "False")
            )
        phi, mu_in, mu_out, s_in, s_out = self._fit(inputs, need_in=True)
        return _stats.norm.logpdf(phi, mu_in, s_in) - _stats.norm.logpdf(phi, mu_out, s_out)


@register("lira_offline")
class LiraOffline(_Lira):
    """Carlini et al. 2022 offline LiRA: minus the log p-value of phi under N(mu_out, s_out^2)."""

    requires = frozenset({"references"})

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        phi, _, mu_out, _, s_out = self._fit(inputs, need_in=False)
        return -_stats.norm.logsf(phi, mu_out, s_out)
