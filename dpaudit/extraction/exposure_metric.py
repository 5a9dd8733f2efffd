"""Exposure of an inserted secret (Carlini, Liu, Erlingsson, Kos, Song 2019, "The Secret
Sharer: Evaluating and Testing Unintended Memorization in Neural Networks", USENIX Security,
arXiv 1802.08232), from log-likelihoods already computed.

A canary ``s[r]`` holds a secret ``r`` drawn from a space ``R``. Rank all candidate secrets
by the model's likelihood of the canary they make (rank 1 = most likely); then

    exposure = log2 |R| - log2 rank(r)

between 0 (the secret is the least likely candidate) and ``log2 |R|`` (it is the model's
first choice); a model that has not learnt the secret gives about 1 bit (the expected rank
of a random candidate is about ``|R| / 2``). When ``R`` is too large to enumerate, the rank
is estimated from a sample of candidates: by counting (``method="rank"``), or by fitting a
skew-normal distribution to the sampled log-likelihoods and reading the canary's tail
probability from it (``method="skewnorm"``, as the paper does), which reaches beyond the
sample. :mod:`dpaudit.extraction.candidates` computes the log-likelihoods from a model.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from dpaudit.errors import InputError

__all__ = ["exposure"]

_METHODS = ("rank", "skewnorm")


def exposure(
    *,
    canary_logprob: float,
    candidate_logprobs: np.ndarray,
    secret_space_size: int,
    method: str = "rank",
) -> float:
    """Exposure of a canary's secret (Carlini et al. 2019, "The Secret Sharer").

    Args:
        canary_logprob: log-likelihood of the canary with the true secret under the model
            (e.g. ``TokenSignals.sum_logprob()`` of the canary text; any quantity where
            higher = the model finds it more likely, used alike for all candidates).
        candidate_logprobs: the same quantity for *other* candidate secrets: all of
            ``R`` except the true one (exact rank), or a uniform sample of ``R``.
        secret_space_size: ``|R|``, the number of possible secrets (a Python int may be
            huge).
        method: ``"rank"``: the fraction ``f`` of candidates more likely than the canary
            (ties count half) estimates the fraction of ``R``; ``"skewnorm"``: ``f`` is
            the upper tail beyond the canary of a skew-normal fitted to the candidates.

    Returns:
        ``log2 |R| - log2 rank`` with ``rank = 1 + (|R| - 1) f``, in ``[0, log2 |R|]``.
        With all of ``R`` but the secret given, the rank method is exact.
    """
    if method not in _METHODS:
        raise InputError(f"exposure: method must be one of {_METHODS}, got {method!r}")
    if isinstance(secret_space_size, bool) or not isinstance(secret_space_size, numbers.Integral):
        raise InputError(f"exposure: secret_space_size must be an integer, got {secret_space_size!r}")
    size = int(secret_space_size)
    if size < 2:
        raise InputError(f"exposure: secret_space_size must be at least 2, got {size}")
    canary = float(canary_logprob)
    if not math.isfinite(canary):
        raise InputError(f"exposure: canary_logprob must be finite, got {canary_logprob!r}")
    cands = np.asarray(candidate_logprobs, dtype=np.float64).ravel()
    if cands.size == 0:
        raise InputError("exposure: candidate_logprobs is empty")
    if not np.isfinite(cands).all():
        raise InputError("exposure: candidate_logprobs holds non-finite values")

    if method == "rank":
        better = np.count_nonzero(cands > canary) + 0.5 * np.count_nonzero(cands == canary)
        log_frac = math.log(better / cands.size) if better > 0 else -math.inf
    else:
        log_frac = _skewnorm_log_tail(cands, canary)
    return exposure_from_log_frac(size, log_frac)


def exposure_from_log_frac(size: int, log_frac: float) -> float:
    """``log2 |R| - log2 rank`` with ``rank = 1 + (|R| - 1) f`` and ``log_frac = log f``."""
    # log2(rank) = log2(1 + (|R| - 1) f), computed in logs so that tiny f and huge |R| work
    log_rank = np.logaddexp(0.0, math.log(size - 1) + log_frac) if log_frac > -math.inf else 0.0
    return float(max(0.0, math.log2(size) - log_rank / math.log(2)))


def _skewnorm_log_tail(cands: np.ndarray, canary: float) -> float:
    """log Pr[X >= canary] for X skew-normal, fitted by maximum likelihood to ``cands``."""
    from scipy import stats

    if cands.size < 3:
        raise InputError("exposure: the skew-normal fit needs at least 3 candidates")
    mu, sd = float(cands.mean()), float(cands.std())
    if not sd > 0:
        raise InputError("exposure: all candidate log-probabilities are equal; nothing to fit")
    z = (cands - mu) / sd  # the fit is better conditioned on standardised data
    a, loc, scale = stats.skewnorm.fit(z)
    return float(stats.skewnorm.logsf((canary - mu) / sd, a, loc, scale))

