"""Gaussian-DP lower bounds from two samples of a mechanism's output (white-box audits).

A white-box audit of one DP-SGD step (Nasr et al. 2023, "Tight Auditing of Differentially
Private Machine Learning", arXiv 2302.07956) runs the step many times on a batch D and on
D plus a canary, and reduces each update to a few numbers (projections on directions the
auditor fixed in advance). This module turns the two samples -- ``in_samples`` (with the
canary), ``out_samples`` (without) -- into:

* :func:`two_sample_mu_bound`: a *rigorous* lower bound on the Gaussian-DP parameter mu
  (Dong, Roth, Su 2019, "Gaussian Differential Privacy", arXiv 1905.02383). It assumes
  nothing about the distribution of the samples, only that the runs are independent: a
  threshold test "in when the statistic exceeds t" has FNR >= Phi(Phi^-1(1 - FPR) - mu)
  under any mu-GDP mechanism, whatever the statistic's law, so Clopper-Pearson upper bounds
  on FPR and FNR give mu >= Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)
  (:func:`dpaudit.audit.bounds.gdp_mu_lower_bound`). The statistic (which column, which
  sign) and the threshold are chosen on one half of each sample and the counts taken on
  the other half, so the bound needs no correction for the choice (DESIGN.md section 4).
  :func:`mu_bound_over_pairs` does the same over several canaries, each with its own two
  samples: the canary is chosen with the statistic, on the first halves (steered by a
  normal fit, which never enters the bound).
* :func:`gaussian_mu_estimate`: the tighter *estimate* (difference of means over the
  pooled standard deviation) with an exact interval that holds only when both samples are
  Gaussian with one variance -- true for a correct Gaussian step, not for a buggy one. It
  never enters a verdict.

The trade-off between two samples does not depend on their scale, so neither needs the
step's learning rate or noise scale.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, special, stats

from dpaudit.audit._validation import _check_significance
from dpaudit.audit.bounds import clopper_pearson_upper, gdp_mu_lower_bound
from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable

__all__ = ["TwoSampleBound", "gaussian_mu_estimate", "mu_bound_over_pairs", "two_sample_mu_bound",
           "two_sample_mu_ceiling"]


@dataclass(frozen=True)
class TwoSampleBound:
    """A mu lower bound from a threshold test chosen on a split (see :func:`two_sample_mu_bound`).

    ``column`` and ``sign`` name the statistic (``sign * samples[:, column]``, "in" when
    above ``threshold``); ``tp``/``fp``/``tn``/``fn`` are the counts on the evaluation
    half; ``ceiling`` is the bound a perfect separation of that half would give; ``pair`` is
    the index of the chosen (in, out) pair (:func:`mu_bound_over_pairs`; 0 for one pair).
    """

    mu: float
    significance: float
    column: int
    sign: int
    threshold: float
    tp: int
    fp: int
    tn: int
    fn: int
    num_selection: tuple[int, int]
    ceiling: float
    pair: int = 0

    def to_dict(self) -> dict:
        return jsonable(asdict(self))


def _as_samples(name: str, x) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] < 4 or a.shape[1] < 1:
        raise InputError(f"{name} must be an array of shape (n,) or (n, k) with n >= 4, got shape {np.shape(x)}")
    if not np.isfinite(a).all():
        raise InputError(f"{name} holds NaN or infinite values")
    return a


def _mu_lower_bounds(tp, fp, n_in: int, n_out: int, significance: float) -> np.ndarray:
    """gdp_mu_lower_bound for arrays of (tp, fp), vectorised (same formula, floored at 0)."""
    fpr_ub = clopper_pearson_upper(successes=fp, trials=n_out, significance=significance / 2)
    fnr_ub = clopper_pearson_upper(successes=n_in - np.asarray(tp), trials=n_in, significance=significance / 2)
    with np.errstate(invalid="ignore"):
        mu = special.ndtri(1.0 - np.asarray(fpr_ub)) - special.ndtri(np.asarray(fnr_ub))
    return np.where(np.isfinite(mu), np.maximum(mu, 0.0), 0.0)


def _best_threshold(x_in: np.ndarray, x_out: np.ndarray, significance: float) -> tuple[float, float]:
    """The threshold t (guess "in" when x > t) with the largest mu bound on these samples,
    the middle one among ties; returns (t, that bound)."""
    values = np.unique(np.r_[x_in, x_out])
    thresholds = np.r_[values[0] - 1.0, (values[:-1] + values[1:]) / 2.0]
    s_in, s_out = np.sort(x_in), np.sort(x_out)
    tp = len(s_in) - np.searchsorted(s_in, thresholds, side="right")
    fp = len(s_out) - np.searchsorted(s_out, thresholds, side="right")
    mu = _mu_lower_bounds(tp, fp, len(s_in), len(s_out), significance)
    best = np.flatnonzero(mu == mu.max())
    i = best[len(best) // 2]
    return float(thresholds[i]), float(mu[i])


def two_sample_mu_ceiling(*, num_in: int, num_out: int, significance: float = 0.05) -> float:
    """The largest bound :func:`two_sample_mu_bound` can give with ``num_in`` / ``num_out``
    samples: that of a perfect separation of its evaluation half."""
    significance = _check_significance(significance)
    n_in, n_out = num_in - num_in // 2, num_out - num_out // 2
    return gdp_mu_lower_bound(tp=n_in, fp=0, tn=n_out, fn=0, significance=significance)


def _split(in_samples, out_samples, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """(selection in, evaluation in, selection out, evaluation out): random halves of each sample."""
    a_in, a_out = _as_samples("in_samples", in_samples), _as_samples("out_samples", out_samples)
    if a_in.shape[1] != a_out.shape[1]:
        raise InputError(f"in_samples and out_samples must have the same columns, got {a_in.shape[1]} "
                         f"and {a_out.shape[1]}")
    p_in, p_out = rng.permutation(len(a_in)), rng.permutation(len(a_out))
    return (a_in[p_in[: len(a_in) // 2]], a_in[p_in[len(a_in) // 2:]],
            a_out[p_out[: len(a_out) // 2]], a_out[p_out[len(a_out) // 2:]])


def _count(halves: tuple[np.ndarray, ...], column: int, sign: int, t: float, significance: float,
           pair: int = 0) -> TwoSampleBound:
    """The bound of the test (column, sign, threshold t) counted on the evaluation halves."""
    sel_in, ev_in, sel_out, ev_out = halves
    tp = int((sign * ev_in[:, column] > t).sum())
    fp = int((sign * ev_out[:, column] > t).sum())
    tn, fn = len(ev_out) - fp, len(ev_in) - tp
    mu = gdp_mu_lower_bound(tp=tp, fp=fp, tn=tn, fn=fn, significance=significance)
    ceiling = two_sample_mu_ceiling(num_in=len(sel_in) + len(ev_in), num_out=len(sel_out) + len(ev_out),
                                    significance=significance)
    return TwoSampleBound(mu=mu, significance=significance, column=int(column), sign=int(sign), threshold=float(t),
                          tp=tp, fp=fp, tn=tn, fn=fn, num_selection=(len(sel_in), len(sel_out)), ceiling=ceiling,
                          pair=int(pair))


def two_sample_mu_bound(*, in_samples, out_samples, significance: float = 0.05, seed: int = 0) -> TwoSampleBound:
    """Rigorous lower bound on mu (Gaussian DP) from two independent samples.

    Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning"
    (arXiv 2302.07956), with the Gaussian trade-off curve of Dong, Roth, Su 2019 (arXiv
    1905.02383). ``in_samples`` are the outputs (one row per independent run, one column
    per candidate statistic) of the mechanism on the neighbouring input with the canary,
    ``out_samples`` without it. Each sample is split at random (``seed``) in halves. On the
    first halves, every column, both signs and every threshold are tried and the one with
    the largest Clopper-Pearson mu bound is kept; on the second halves that one test is
    counted and :func:`dpaudit.audit.bounds.gdp_mu_lower_bound` gives the bound. With
    probability at least ``1 - significance`` the mechanism is not mu'-GDP for any
    mu' < the returned ``mu``, whatever the distribution of the statistics.
    """
    significance = _check_significance(significance)
    halves = _split(in_samples, out_samples, np.random.default_rng(seed))
    sel_in, _, sel_out, _ = halves
    best = None
    for column in range(sel_in.shape[1]):
        for sign in (1, -1):
            t, mu = _best_threshold(sign * sel_in[:, column], sign * sel_out[:, column], significance)
            if best is None or mu > best[0]:
                best = (mu, column, sign, t)
    _, column, sign, t = best
    return _count(halves, column, sign, t, significance)


def _modelled_test(x_in: np.ndarray, x_out: np.ndarray, n_in: int, n_out: int,
                   significance: float) -> tuple[float, float, float]:
    """(predicted bound, separation, threshold) of the test "in when x > t" on an evaluation
    half of ``n_in`` / ``n_out`` runs, predicted from a normal fit of each selection sample:
    t is the midpoint between two sorted values (or below all) whose predicted counts give
    the largest bound, the middle one among ties; the separation (mean difference over the
    larger standard deviation) breaks ties between tests."""
    m_in, m_out = x_in.mean(), x_out.mean()
    s_in, s_out = x_in.std(ddof=1), x_out.std(ddof=1)
    floor = max(1e-12 * max(abs(m_in), abs(m_out)), np.finfo(float).tiny)
    s_in, s_out = max(s_in, floor), max(s_out, floor)
    values = np.unique(np.r_[x_in, x_out])
    thresholds = np.r_[values[0] - 1.0, (values[:-1] + values[1:]) / 2.0]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        tpr = special.ndtr((m_in - thresholds) / s_in)
        fpr = special.ndtr((m_out - thresholds) / s_out)
    mu = _mu_lower_bounds(np.rint(tpr * n_in), np.rint(fpr * n_out), n_in, n_out, significance)
    best = np.flatnonzero(mu == mu.max())
    i = best[len(best) // 2]
    return float(mu[i]), float((m_in - m_out) / max(s_in, s_out)), float(thresholds[i])


def mu_bound_over_pairs(*, pairs, significance: float = 0.05, seed: int = 0) -> TwoSampleBound:
    """A rigorous lower bound on mu, as :func:`two_sample_mu_bound`, from several neighbouring
    pairs at once: ``pairs`` is a list of ``(in_samples, out_samples)``, one per canary (each
    its own pair of neighbouring inputs, its own independent runs, its own columns).

    Each pair is split at random (``seed``) in halves. On the first halves one test is chosen
    among every pair, column and sign: the one whose normal fit of the two selection samples
    predicts the largest bound on the evaluation halves, with the threshold that fit prefers
    (:func:`_modelled_test`; a smoother choice than the best threshold on the selection counts,
    which overfits when many statistics compete); that test is counted on its pair's second
    halves. The choice of the canary is part of the choice of the test, made on runs the count
    does not use, so the bound needs no correction for the number of canaries or statistics:
    with probability at least ``1 - significance`` the mechanism is not mu'-GDP (on the chosen
    pair of neighbouring inputs, hence not at all) for any mu' < ``mu``, whatever the
    distribution of the statistics (the normal fit only steers the choice). ``pair`` names the
    chosen pair.
    """
    significance = _check_significance(significance)
    if len(pairs) == 0:
        raise InputError("mu_bound_over_pairs needs at least one (in_samples, out_samples) pair")
    rng = np.random.default_rng(seed)
    splits, best = [], None
    for k, (in_samples, out_samples) in enumerate(pairs):
        halves = _split(in_samples, out_samples, rng)
        splits.append(halves)
        sel_in, ev_in, sel_out, ev_out = halves
        for column in range(sel_in.shape[1]):
            for sign in (1, -1):
                mu, separation, t = _modelled_test(sign * sel_in[:, column], sign * sel_out[:, column], len(ev_in),
                                                   len(ev_out), significance)
                if best is None or (mu, separation) > best[0]:
                    best = ((mu, separation), k, column, sign, t)
    _, k, column, sign, t = best
    return _count(splits[k], column, sign, t, significance, pair=k)


LARGE_T = 1e5  # beyond, the noncentral t's quantiles come from its normal approximation


def _noncentrality(t: float, df: int, p: float) -> float:
    """The noncentrality lam with P[T <= t] = p for T ~ noncentral t(df, lam) (decreasing in lam).

    For |t| > ``LARGE_T`` (a step whose runs barely vary: scipy's distribution returns NaN
    there) T = (Z + lam) / sqrt(V / df) is lam / sqrt(V / df) but for a vanishing Z, V ~ chi2(df),
    which gives lam from a chi2 quantile."""
    def gap(lam: float) -> float:
        return float(stats.nct.cdf(t, df, lam)) - p

    if abs(t) <= LARGE_T:
        lo, hi = t - 1.0, t + 1.0
        while gap(lo) < 0:
            lo -= 2.0 * (hi - lo)
        while gap(hi) > 0:
            hi += 2.0 * (hi - lo)
        try:
            return float(optimize.brentq(gap, lo, hi, xtol=1e-10))
        except ValueError:  # NaN from the distribution's tails
            pass
    return t * math.sqrt(float(stats.chi2.ppf(1.0 - p if t > 0 else p, df)) / df)


def gaussian_mu_estimate(*, in_samples, out_samples, confidence: float = 0.95) -> tuple[float, float, float]:
    """Estimate of mu with its interval, *assuming* both samples are Gaussian with one variance.

    Under that assumption the two samples are N(m_out, s^2) and N(m_out + mu s, s^2), and
    the trade-off between them is exactly the mu-GDP curve (Dong, Roth, Su 2019, arXiv
    1905.02383), so mu is the standardised mean difference. Returns (estimate, low, high):
    the estimate is (mean_in - mean_out) / pooled std; the interval inverts the noncentral
    t distribution of the two-sample t statistic (exact under the assumption; two-sided at
    ``confidence``). A correct Gaussian DP-SGD step satisfies the assumption; a faulty one
    need not, so this is an estimate (Nasr et al. 2023, arXiv 2302.07956, use the same
    reading for their tight white-box audits), never a bound. Infinite when both samples
    are constant and differ.
    """
    x1 = _as_samples("in_samples", in_samples)
    x0 = _as_samples("out_samples", out_samples)
    if x1.shape[1] != 1 or x0.shape[1] != 1:
        raise InputError("gaussian_mu_estimate takes one statistic (1-D samples)")
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must be in (0, 1), got {confidence}")
    x1, x0 = x1[:, 0], x0[:, 0]
    n1, n0 = len(x1), len(x0)
    diff = float(x1.mean() - x0.mean())
    pooled = math.sqrt((((x1 - x1.mean()) ** 2).sum() + ((x0 - x0.mean()) ** 2).sum()) / (n1 + n0 - 2))
    if pooled == 0.0 or not math.isfinite(diff / pooled):
        mu = 0.0 if diff == 0.0 else math.copysign(math.inf, diff)
        return mu, mu, mu
    d = diff / pooled
    scale = math.sqrt(n1 * n0 / (n1 + n0))
    df = n1 + n0 - 2
    alpha = 1.0 - confidence
    low = _noncentrality(d * scale, df, 1.0 - alpha / 2) / scale
    high = _noncentrality(d * scale, df, alpha / 2) / scale
    return d, low, high
