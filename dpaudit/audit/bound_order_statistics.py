"""The order-statistics one-run bound (Xiang et al. 2025, arXiv 2509.08704): an estimate.

Model. ``m`` canaries, each passes through its *own, independent* binary channel
``N(+mu/2, 1)`` (in) or ``N(-mu/2, 1)`` (out), the Gaussian trade-off curve of mu-GDP. The
auditor guesses in or out by the sign of the log-likelihood ratio and releases the ``r``
guesses of largest magnitude. Given the magnitude threshold ``a`` that the top ``r`` clear,
each released guess is wrong with probability

    g(a) = Phibar(a + mu/2) / (Phibar(a - mu/2) + Phibar(a + mu/2)),

independently, and the threshold is an order statistic of the magnitudes: its quantile
``W = P[|Y| <= a]`` is ``Beta(m - r, r + 1)``. So the number of wrong guesses ``U`` has

    P[U <= u] = E_W[ BinomCDF(u; r, g(a(W))) ],

and "the mechanism is mu-GDP" is rejected at level alpha when that tail is below alpha.
Releasing any other r guesses only adds errors, so the test keeps its level for them.

Why an estimate and not a bound. The tail is exact for a *product* of independent
channels. A one-run audit does not have one: the canaries share one training run, and
Steinke et al.'s bound (arXiv 2305.08846) is sound because it allows any dependence. A
mechanism that is exactly mu-GDP with respect to every canary but draws one shared
magnitude for all of them (``tests/audit/test_audit_order_statistics.py``) makes this test
reject the true mu in 42% of runs at alpha = 0.05 (m = 1,000, every guess released). So it is registered with
``sound=False``: reported beside the others, it never decides a verdict and never counts
as an empirical epsilon.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy import optimize, special, stats

from dpaudit.audit.bounds import gdp_epsilon
from dpaudit.audit.registry import register_bound

__all__ = ["mu_order_statistics", "order_statistics_tail"]

_QUADRATURE_POINTS = 2000
_GRID_POINTS = 20001
_ASSUMES = "independent Gaussian channels, one per canary (a product mechanism)"


def _wrong_given_threshold(a: np.ndarray, mu: float) -> np.ndarray:
    """g(a): the error rate of a MAP guess whose |LLR| clears ``a`` (log space, stable)."""
    return special.expit(special.log_ndtr(-(a + mu / 2)) - special.log_ndtr(-(a - mu / 2)))


def _threshold_of_quantile(w: np.ndarray, mu: float) -> np.ndarray:
    """a(w): the magnitude with P[|Y| <= a] = w, Y ~ N(mu/2, 1) (the law of |Y| is the same out)."""
    grid = np.linspace(0.0, 12.0 + mu, _GRID_POINTS)
    cdf = special.ndtr(grid - mu / 2) - special.ndtr(-grid - mu / 2)
    return np.interp(w, cdf, grid)


@lru_cache(maxsize=64)
def _threshold_quantiles(m: int, r: int) -> np.ndarray:
    """Midpoint quadrature nodes of W ~ Beta(m - r, r + 1), the threshold's quantile."""
    return stats.beta.ppf((np.arange(_QUADRATURE_POINTS) + 0.5) / _QUADRATURE_POINTS, m - r, r + 1)


def order_statistics_tail(*, mu: float, num_canaries: int, num_guesses: int, num_wrong: int) -> float:
    """P[U <= u] under independent mu-GDP Gaussian channels (Xiang et al. 2025, arXiv 2509.08704).

    ``num_canaries`` m, ``num_guesses`` r (the top r by magnitude), ``num_wrong`` u."""
    m, r, u = int(num_canaries), int(num_guesses), int(num_wrong)
    if u >= r:
        return 1.0
    if r >= m:  # every guess released: no threshold
        return float(stats.binom.cdf(u, r, special.ndtr(-mu / 2)))
    g = _wrong_given_threshold(_threshold_of_quantile(_threshold_quantiles(m, r), mu), mu)
    return float(np.mean(stats.binom.cdf(u, r, g)))


def mu_order_statistics(*, num_canaries: int, num_guesses: int, num_wrong: int, significance: float) -> float:
    """The largest mu that the order-statistics test rejects at ``significance`` (0 if none).

    The tail grows with mu (a more leaky channel errs less), so the rejected mus form an
    interval [0, mu*): mu* solves tail(mu*) = significance."""
    def excess(mu):
        return order_statistics_tail(mu=mu, num_canaries=num_canaries, num_guesses=num_guesses,
                                     num_wrong=num_wrong) - significance

    if num_guesses == 0 or excess(1e-9) >= 0:
        return 0.0
    hi = 1.0
    while excess(hi) < 0:
        hi *= 2.0
        if hi > 64.0:
            return 64.0
    return float(optimize.brentq(excess, 1e-9, hi, xtol=1e-6))


@register_bound("order_statistics", family="one_run", sound=False, paper="Xiang et al. 2025", arxiv="2509.08704",
                assumes=_ASSUMES)
def _order_statistics(*, num_canaries, num_guesses, num_correct, delta, significance):
    """Epsilon at ``delta`` of the mu the order-statistics test rejects, with that mu."""
    mu = mu_order_statistics(num_canaries=num_canaries, num_guesses=num_guesses,
                             num_wrong=num_guesses - num_correct, significance=significance)
    return gdp_epsilon(mu=mu, delta=delta), {"mu": mu}
