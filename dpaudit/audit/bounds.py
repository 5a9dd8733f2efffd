"""Empirical lower bounds on epsilon: pure functions of counts.

Every function here takes counts (not scores), is keyword-only, and returns a plain
float. Choosing *which* counts to feed in (the threshold, or the numbers of guesses
k+ and k-) is the job of a strategy in :mod:`dpaudit.audit.strategy`; the counts must
not be the maximum over many thresholds tried on the same data unless the
significance was corrected for it.

Four bounds:

* :func:`epsilon_clopper_pearson` -- Jagielski, Ullman, Oprea 2020, "Auditing
  Differentially Private Machine Learning: How Private is Private SGD?". One score per
  independent training run (many runs).
* :func:`epsilon_one_run` -- Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One
  (1) Training Run". m canaries in one run, each included with probability 1/2.
* :func:`epsilon_one_run_fdp` -- Mahloujifar, Melis, Chaudhuri 2025, "Auditing
  f-Differential Privacy in One Run" (ICML 2025), against the Gaussian trade-off family.
* :func:`epsilon_from_gdp` -- Nasr et al. 2023, "Tight Auditing of Differentially
  Private Machine Learning", with the mu-GDP conversion of Dong, Roth, Su 2019,
  "Gaussian Differential Privacy".

All bounds hold with probability at least ``1 - significance``. Each is registered by
name in :mod:`dpaudit.audit.registry` ("clopper_pearson", "one_run", "one_run_fdp",
"gdp"); the first two are *sound* (they hold for any (epsilon, delta)-DP mechanism), the
f-DP and GDP epsilons are estimates that assume a Gaussian trade-off curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, special, stats

from dpaudit.audit._validation import (
    _check_confusion,
    _check_delta,
    _check_one_run_counts,
    _check_significance,
)
from dpaudit.audit.registry import register_bound
from dpaudit.errors import InputError

__all__ = [
    "clopper_pearson_upper",
    "epsilon_clopper_pearson",
    "one_run_p_value",
    "epsilon_one_run",
    "fdp_one_run_rejects",
    "mu_one_run_fdp",
    "epsilon_one_run_fdp",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_lower_bound",
    "epsilon_from_gdp",
]

# Bisection tolerance on epsilon / mu. Bounds are reported to about 6 decimals.
_TOL = 1e-7
# Beyond this the bound is reported as this value (never reached for m <= 10**7).
_EPS_CAP = 1e4
_MU_CAP = 1e3


# ------------------------------------------------------------------ Clopper-Pearson
def clopper_pearson_upper(*, successes, trials, significance: float):
    """One-sided exact (Clopper-Pearson) upper confidence bound on a binomial rate.

    Returns p_ub with P[p > p_ub] <= significance when ``successes ~ Bin(trials, p)``:
    the ``1 - significance`` quantile of Beta(k + 1, n - k), and 1 when k = n.
    Accepts scalars or arrays for ``successes``.
    """
    significance = _check_significance(significance)
    k = np.asarray(successes, dtype=float)
    n = float(trials)
    if n < 1 or np.any(k < 0) or np.any(k > n):
        raise InputError(f"need 0 <= successes <= trials and trials >= 1, got {successes}, {trials}")
    with np.errstate(invalid="ignore", divide="ignore"):
        ub = np.where(k < n, stats.beta.ppf(1.0 - significance, k + 1.0, np.maximum(n - k, 1.0)), 1.0)
    return float(ub) if ub.ndim == 0 else ub


def _log_ratio(num: float, den: float) -> float:
    if num <= 0.0:
        return 0.0
    return math.log(num) - math.log(den) if den > 0.0 else math.inf


@register_bound(
    "clopper_pearson", family="threshold", sound=True, paper="Jagielski et al. 2020", arxiv="2006.07709"
)
def epsilon_clopper_pearson(*, tp, fp, tn, fn, delta: float, significance: float = 0.05) -> float:
    """Epsilon lower bound from a membership test's confusion matrix.

    Jagielski, Ullman, Oprea 2020, "Auditing Differentially Private Machine Learning:
    How Private is Private SGD?". Each member / non-member outcome must come from an
    independent training run (the threshold fixed before seeing these outcomes). With
    one-sided Clopper-Pearson upper bounds FPR_ub and FNR_ub, each at
    ``significance / 2`` (union bound), an (eps, delta)-DP mechanism satisfies, with
    probability >= 1 - significance,

        eps >= max(log((1 - delta - FNR_ub) / FPR_ub), log((1 - delta - FPR_ub) / FNR_ub)),

    and the returned value is that maximum, floored at 0.
    """
    tp, fp, tn, fn = _check_confusion(tp, fp, tn, fn)
    delta = _check_delta(delta)
    significance = _check_significance(significance)
    fpr_ub = clopper_pearson_upper(successes=fp, trials=fp + tn, significance=significance / 2)
    fnr_ub = clopper_pearson_upper(successes=fn, trials=fn + tp, significance=significance / 2)
    eps = max(_log_ratio(1.0 - delta - fnr_ub, fpr_ub), _log_ratio(1.0 - delta - fpr_ub, fnr_ub))
    return max(0.0, eps)


# ----------------------------------------------------------- one run (Steinke et al.)
def one_run_p_value(*, num_canaries, num_guesses, num_correct, epsilon: float, delta: float) -> float:
    """p-value of ``num_correct`` or more correct guesses under (epsilon, delta)-DP.

    Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run",
    Theorem 3.1 / Proposition 5.2. With q = e^eps / (1 + e^eps), r guesses, v correct
    and m canaries (each included with probability 1/2):

        beta  = P[Bin(r, q) >= v]
        alpha = max_{i = 1..v} P[v - i <= Bin(r, q) < v] / i
        p     = beta + alpha * 2 * m * delta       (capped at 1)

    The alpha term is computed in one vectorised pass: the probabilities
    P[v - i <= Bin < v] for all i are a cumulative sum of the binomial pmf.
    """
    m, r, v = _check_one_run_counts(num_canaries, num_guesses, num_correct)
    delta = _check_delta(delta)
    return _one_run_p_value(m, r, v, float(epsilon), delta)


def _one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    if v == 0:
        return 1.0
    q = float(special.expit(eps))
    beta = float(special.bdtrc(v - 1, r, q))  # P[Bin(r, q) > v - 1]
    if delta == 0.0:
        return min(beta, 1.0)
    # P[v - i <= Bin < v] for i = 1..v is the cumulative sum of pmf(v-1), pmf(v-2), ...
    # (pmfs in log space; log q and log(1 - q) written so that large eps does not underflow).
    k = np.arange(v - 1, -1, -1, dtype=float)
    log_q, log_1mq = -np.logaddexp(0.0, -eps), -np.logaddexp(0.0, eps)
    log_pmf = special.gammaln(r + 1.0) - special.gammaln(k + 1.0) - special.gammaln(r - k + 1.0)
    log_pmf += k * log_q + (r - k) * log_1mq
    window = np.cumsum(np.exp(log_pmf))
    alpha = float(np.max(window / np.arange(1, v + 1)))
    return min(beta + alpha * 2.0 * m * delta, 1.0)


def _largest_rejected(rejects, *, start: float, cap: float) -> float:
    """Largest x >= 0 with rejects(x) True, assuming rejects is True on [0, x*) and False
    above x* (monotone). Returns 0 when rejects(0) is False, ``cap`` if never False."""
    if not rejects(0.0):
        return 0.0
    lo, hi = 0.0, start
    while rejects(hi):
        lo, hi = hi, 2.0 * hi
        if hi > cap:
            return cap
    while hi - lo > _TOL * max(1.0, lo):
        mid = 0.5 * (lo + hi)
        if rejects(mid):
            lo = mid
        else:
            hi = mid
    return lo


@register_bound("one_run", family="one_run", sound=True, paper="Steinke et al. 2023", arxiv="2305.08846")
def epsilon_one_run(
    *, num_canaries, num_guesses, num_correct, delta: float, significance: float = 0.05
) -> float:
    """Epsilon lower bound from one training run (Steinke, Nasr, Jagielski 2023).

    Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run".
    ``num_canaries`` (m) canaries, each included independently with probability 1/2;
    the auditor guesses "in" / "out" for ``num_guesses`` (r = k+ + k-) of them and
    abstains on the rest; ``num_correct`` (v) guesses are right. Returns the largest
    eps whose p-value (:func:`one_run_p_value`) is below ``significance`` (the p-value
    grows with eps), or 0 when even eps = 0 is not rejected.

    Ceiling check: m=1000, delta=1e-5, significance 0.05, r = v = 100 gives about 3.47.
    """
    m, r, v = _check_one_run_counts(num_canaries, num_guesses, num_correct)
    delta = _check_delta(delta)
    significance = _check_significance(significance)
    if v == 0:
        return 0.0
    # Cheap exit: the p-value with delta = 0 is a lower bound on the one with delta > 0.
    if _one_run_p_value(m, r, v, 0.0, 0.0) >= significance:
        return 0.0
    return _largest_rejected(
        lambda eps: _one_run_p_value(m, r, v, eps, delta) < significance, start=1.0, cap=_EPS_CAP
    )


# -------------------------------------------------- one run, f-DP (Mahloujifar et al.)
def fdp_one_run_rejects(*, num_canaries, num_guesses, num_correct, mu: float, significance: float = 0.05) -> bool:
    """Whether ``num_correct`` of ``num_guesses`` correct rejects "the mechanism is mu-GDP".

    Mahloujifar, Melis, Chaudhuri 2025, "Auditing f-Differential Privacy in One Run"
    (ICML 2025): the membership (alphabet size 2) version of their recursive bound on
    the probability of ``c`` or more correct guesses out of ``c'`` for an f-DP
    mechanism over m canaries, each included with probability 1/2. Here
    f = f_mu, the Gaussian trade-off curve f_mu(x) = Phi(Phi^-1(1 - x) - mu) of Dong,
    Roth, Su 2019, whose inverse "blow-up" is B^-1(y) = Phi(Phi^-1(y) - mu).

    With tau = significance, start from r_c = tau * c / m and h_c = tau * (c' - c) / m;
    for i = c - 1, ..., 0:

        h_i = max(h_{i+1}, B^-1(r_{i+1}))
        r_i = r_{i+1} + i / (c' - i) * (h_i - h_{i+1})

    The claim is rejected at level tau when r_0 + h_0 > c' / m. Once h stops growing
    nothing changes any more, so the loop stops early.
    """
    m, r, v = _check_one_run_counts(num_canaries, num_guesses, num_correct)
    significance = _check_significance(significance)
    mu = float(mu)
    if not mu >= 0.0:
        raise InputError(f"mu must be >= 0, got {mu}")
    return _fdp_rejects(m, r, v, mu, significance)


def _fdp_rejects(m: int, c_all: int, c: int, mu: float, tau: float) -> bool:
    """:func:`_fdp_rejects_with` for f = f_mu (Gaussian DP), B^-1 inlined for speed."""
    if c == 0:
        return False
    ndtri, erfc, sqrt_half = special.ndtri, math.erfc, math.sqrt(0.5)
    r = tau * c / m
    h = tau * (c_all - c) / m
    for i in range(c - 1, -1, -1):
        z = float(ndtri(r)) - mu  # B^-1(r) = Phi(z), with Phi(z) = erfc(-z / sqrt 2) / 2
        h_new = max(h, 0.5 * erfc(-z * sqrt_half))
        if h_new == h:
            break
        r = min(r + (i / (c_all - i)) * (h_new - h), 1.0)
        h = h_new
    return r + h > c_all / m


def _fdp_rejects_with(m: int, c_all: int, c: int, blow_up_inverse: Callable[[float], float], tau: float) -> bool:
    """Mahloujifar, Melis, Chaudhuri 2025 recursion for any trade-off function f.

    ``blow_up_inverse`` is B^-1(y) = f^-1(1 - y), which is f(1 - y) for a symmetric f
    (f_mu gives Phi(Phi^-1(y) - mu); pure eps-DP gives max(0, 1 - e^eps (1 - y),
    e^-eps y)). It is called with one float in [0, 1] at a time, at most ``c`` times,
    and must be non-decreasing. A pointwise smaller B^-1 (a smaller f, i.e. a weaker
    claim) never rejects where a larger one does not, so any valid lower bound on the
    claimed curve gives a sound test. See :func:`fdp_one_run_rejects` for the recursion.
    """
    if c == 0:
        return False
    r = tau * c / m
    h = tau * (c_all - c) / m
    for i in range(c - 1, -1, -1):
        h_new = max(h, blow_up_inverse(r))
        if h_new == h:
            break
        r = min(r + (i / (c_all - i)) * (h_new - h), 1.0)
        h = h_new
    return r + h > c_all / m


def mu_one_run_fdp(*, num_canaries, num_guesses, num_correct, significance: float = 0.05) -> float:
    """Lower bound on the Gaussian-DP parameter mu from one run.

    Mahloujifar, Melis, Chaudhuri 2025, "Auditing f-Differential Privacy in One Run":
    the largest mu such that "the mechanism is mu-GDP" (Dong, Roth, Su 2019) is rejected
    at level ``significance`` by the observed counts (see :func:`fdp_one_run_rejects`).
    Rejection is monotone in mu (a larger mu allows more correct guesses), so the
    boundary is found by bisection. Returns 0 when even mu = 0 is not rejected.
    """
    m, r, v = _check_one_run_counts(num_canaries, num_guesses, num_correct)
    significance = _check_significance(significance)
    return _largest_rejected(lambda mu: _fdp_rejects(m, r, v, mu, significance), start=1.0, cap=_MU_CAP)


def epsilon_one_run_fdp(
    *, num_canaries, num_guesses, num_correct, delta: float, significance: float = 0.05
) -> float:
    """Epsilon lower bound from one run against the Gaussian trade-off family.

    Mahloujifar, Melis, Chaudhuri 2025, "Auditing f-Differential Privacy in One Run":
    :func:`mu_one_run_fdp` gives mu_lb such that the mechanism is not mu-GDP for any
    mu < mu_lb (at confidence 1 - significance); the result is the epsilon of a
    mu_lb-GDP mechanism at ``delta`` (Dong, Roth, Su 2019, Corollary 2.13; see
    :func:`gdp_epsilon`). The epsilon reading assumes the mechanism's trade-off curve is
    Gaussian-shaped (true for DP-SGD to a good approximation); the mu bound itself needs
    no such assumption. Typically 1.2-2x the :func:`epsilon_one_run` bound for the same
    counts.
    """
    delta = _check_delta(delta)
    mu = mu_one_run_fdp(
        num_canaries=num_canaries, num_guesses=num_guesses, num_correct=num_correct, significance=significance
    )
    return gdp_epsilon(mu=mu, delta=delta)


# ---------------------------------------------------------------------- Gaussian DP
def gdp_delta(*, mu: float, epsilon: float) -> float:
    """delta(eps) of a mu-GDP mechanism (Dong, Roth, Su 2019, Corollary 2.13):

        delta = Phi(-eps/mu + mu/2) - e^eps * Phi(-eps/mu - mu/2)

    (the second term is evaluated in log space so large eps does not overflow).
    """
    mu, eps = float(mu), float(epsilon)
    if mu < 0 or eps < 0:
        raise InputError(f"mu and epsilon must be >= 0, got {mu}, {eps}")
    if mu == 0.0:
        return 0.0
    first = special.ndtr(-eps / mu + mu / 2.0)
    second = math.exp(eps + special.log_ndtr(-eps / mu - mu / 2.0))
    return float(max(first - second, 0.0))


def gdp_epsilon(*, mu: float, delta: float) -> float:
    """Smallest eps such that a mu-GDP mechanism is (eps, delta)-DP (Dong, Roth, Su 2019).

    Solves :func:`gdp_delta` (decreasing in eps) for eps with Brent's method; returns 0
    when delta is at least delta(0) = 2 Phi(mu/2) - 1, and inf when delta = 0 and mu > 0.
    """
    mu = float(mu)
    delta = _check_delta(delta)
    if not mu >= 0.0:
        raise InputError(f"mu must be >= 0, got {mu}")
    if mu == 0.0 or gdp_delta(mu=mu, epsilon=0.0) <= delta:
        return 0.0
    if delta == 0.0:
        return math.inf

    def gap(eps: float) -> float:
        return gdp_delta(mu=mu, epsilon=eps) - delta

    hi = max(1.0, mu * mu)
    while gap(hi) > 0.0:
        hi *= 2.0
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-10, rtol=1e-12))


def gdp_mu_lower_bound(*, tp, fp, tn, fn, significance: float = 0.05) -> float:
    """Lower bound on mu from a membership test's confusion matrix (Nasr et al. 2023).

    Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis 2023, "Tight Auditing
    of Differentially Private Machine Learning": a mu-GDP mechanism (Dong, Roth, Su 2019)
    satisfies FNR >= Phi(Phi^-1(1 - FPR) - mu), hence

        mu >= Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)

    with one-sided Clopper-Pearson upper bounds at ``significance / 2`` each. Floored at 0.
    """
    tp, fp, tn, fn = _check_confusion(tp, fp, tn, fn)
    significance = _check_significance(significance)
    fpr_ub = clopper_pearson_upper(successes=fp, trials=fp + tn, significance=significance / 2)
    fnr_ub = clopper_pearson_upper(successes=fn, trials=fn + tp, significance=significance / 2)
    mu = float(special.ndtri(1.0 - fpr_ub) - special.ndtri(fnr_ub))
    return max(0.0, mu) if math.isfinite(mu) else 0.0


def epsilon_from_gdp(*, tp, fp, tn, fn, delta: float, significance: float = 0.05) -> float:
    """Epsilon lower bound via Gaussian DP (Nasr et al. 2023; Dong, Roth, Su 2019).

    Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning": the
    mu lower bound of :func:`gdp_mu_lower_bound` at the chosen threshold, converted to
    epsilon at ``delta`` with :func:`gdp_epsilon`. Like the Clopper-Pearson bound it
    needs one independent training run per outcome; the epsilon reading assumes a
    Gaussian-shaped trade-off curve.
    """
    delta = _check_delta(delta)
    mu = gdp_mu_lower_bound(tp=tp, fp=fp, tn=tn, fn=fn, significance=significance)
    return gdp_epsilon(mu=mu, delta=delta)


# ------------------------------------------------------------------ registrations
_GAUSSIAN = "a Gaussian trade-off curve"


@register_bound(
    "one_run_fdp", family="one_run", sound=False, paper="Mahloujifar et al. 2025", arxiv="2410.22235",
    assumes=_GAUSSIAN,
)
def _one_run_fdp_with_mu(*, num_canaries, num_guesses, num_correct, delta, significance):
    """:func:`epsilon_one_run_fdp`, with the mu bound beside it."""
    mu = mu_one_run_fdp(
        num_canaries=num_canaries, num_guesses=num_guesses, num_correct=num_correct, significance=significance
    )
    return gdp_epsilon(mu=mu, delta=delta), {"mu": mu}


@register_bound("gdp", family="threshold", sound=False, paper="Nasr et al. 2023", arxiv="2302.07956", assumes=_GAUSSIAN)
def _gdp_with_mu(*, tp, fp, tn, fn, delta, significance):
    """:func:`epsilon_from_gdp`, with the mu bound beside it."""
    delta = _check_delta(delta)
    mu = gdp_mu_lower_bound(tp=tp, fp=fp, tn=tn, fn=fn, significance=significance)
    return gdp_epsilon(mu=mu, delta=delta), {"mu": mu}
