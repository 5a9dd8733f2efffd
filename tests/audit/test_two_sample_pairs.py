"""The Gaussian-DP bound over several canaries (dpaudit.audit.two_sample.mu_bound_over_pairs)
against a naive reference and in simulation; the Gaussian estimate's interval far out."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import special, stats

from dpaudit.audit.bounds import gdp_mu_lower_bound
from dpaudit.audit.two_sample import gaussian_mu_estimate, mu_bound_over_pairs
from dpaudit.errors import InputError


def _naive_pairs(pairs, significance, seed):
    """mu_bound_over_pairs with plain loops: the same split, the normal fit's predicted bound
    at every midpoint threshold, the count on the chosen pair's second halves."""
    rng = np.random.default_rng(seed)
    halves, best = [], None
    for k, (x_in, x_out) in enumerate(pairs):
        p_in, p_out = rng.permutation(len(x_in)), rng.permutation(len(x_out))
        h = (x_in[p_in[: len(x_in) // 2]], x_in[p_in[len(x_in) // 2:]],
             x_out[p_out[: len(x_out) // 2]], x_out[p_out[len(x_out) // 2:]])
        halves.append(h)
        n_in, n_out = len(h[1]), len(h[3])
        for col, sign in itertools.product(range(x_in.shape[1]), (1, -1)):
            a, b = sign * h[0][:, col], sign * h[2][:, col]
            values = sorted(set(a) | set(b))
            scored = []
            for t in [values[0] - 1.0] + [(u + v) / 2 for u, v in itertools.pairwise(values)]:
                tp = round(float(special.ndtr((a.mean() - t) / a.std(ddof=1))) * n_in)
                fp = round(float(special.ndtr((b.mean() - t) / b.std(ddof=1))) * n_out)
                scored.append((gdp_mu_lower_bound(tp=tp, fp=fp, tn=n_out - fp, fn=n_in - tp,
                                                  significance=significance), t))
            top = [t for mu, t in scored if mu == max(m for m, _ in scored)]
            key = (max(m for m, _ in scored), (a.mean() - b.mean()) / max(a.std(ddof=1), b.std(ddof=1)))
            if best is None or key > best[0]:
                best = (key, k, col, sign, top[len(top) // 2])
    _, k, col, sign, t = best
    ev_in, ev_out = halves[k][1], halves[k][3]
    tp, fp = int((sign * ev_in[:, col] > t).sum()), int((sign * ev_out[:, col] > t).sum())
    return gdp_mu_lower_bound(tp=tp, fp=fp, tn=len(ev_out) - fp, fn=len(ev_in) - tp, significance=significance), k


def test_bound_over_pairs_matches_naive_reference():
    rng = np.random.default_rng(5)
    for shifts in ((0.0, 0.0), (1.0, 2.5, 0.5), (3.0,)):
        pairs = [(rng.normal(0, 1, (24, 3)) + [s, s / 2, 0.0], rng.normal(0, 1, (22, 3))) for s in shifts]
        got = mu_bound_over_pairs(pairs=pairs, significance=0.05, seed=11)
        mu, pair = _naive_pairs(pairs, 0.05, 11)
        assert got.mu == pytest.approx(mu, abs=1e-12) and got.pair == pair
        assert got.tp + got.fn == 12 and got.fp + got.tn == 11
    constant = mu_bound_over_pairs(pairs=[(np.zeros((40, 2)), np.zeros((40, 2))), (np.ones((40, 2)), np.zeros((40, 2)))])
    assert constant.pair == 1 and constant.fp == constant.fn == 0 and constant.mu == constant.ceiling
    with pytest.raises(InputError, match="at least one"):
        mu_bound_over_pairs(pairs=[])


def test_bound_over_pairs_is_sound_and_finds_the_one_canary_that_leaks():
    """Five canaries with several statistics each: the bound exceeds the true mu no more often
    than 5% allows; when one canary's mechanism is 1.9 times the claim, it is found."""
    alpha, trials, n, shares = 0.05, 100, 100, np.array([1.0, 0.6, 0.3, 0.05])
    rng = np.random.default_rng(0)
    allowed = stats.binom.ppf(0.999, trials, alpha)
    for mu in (1.0, 2.0):
        bounds = np.array([mu_bound_over_pairs(pairs=[(rng.normal(0, 1, (n, 4)) + mu * shares,
                                                       rng.normal(0, 1, (n, 4))) for _ in range(5)],
                                               significance=alpha, seed=t).mu for t in range(trials)])
        assert (bounds > mu).sum() <= allowed, (mu, (bounds > mu).sum())
    found = [mu_bound_over_pairs(pairs=[(rng.normal(0, 1, (n, 4)) + (3.8 if k == 3 else 2.0) * shares,
                                         rng.normal(0, 1, (n, 4))) for k in range(5)], significance=alpha, seed=t)
             for t in range(30)]
    assert np.mean([b.mu > 2.0 for b in found]) >= 0.8 and np.mean([b.pair == 3 for b in found]) >= 0.9


def test_estimate_interval_far_out():
    """A step whose runs barely vary (t statistic ~1e9): the interval from the chi2 limit of
    the noncentral t, not NaN or a hang; continuous with the exact one."""
    rng = np.random.default_rng(2)
    est, low, high = gaussian_mu_estimate(in_samples=rng.normal(1e9, 1, 50), out_samples=rng.normal(0, 1, 50))
    assert low < est < high and high / low == pytest.approx(1.33, abs=0.05)
    x_in, x_out = rng.normal(2e4, 1, 50), rng.normal(0, 1, 50)  # t ~ 1e5: both sides of the switch agree
    exact = gaussian_mu_estimate(in_samples=x_in, out_samples=x_out)
    far = gaussian_mu_estimate(in_samples=x_in * 1.5, out_samples=x_out * 1.5)
    assert far[1] / far[0] == pytest.approx(exact[1] / exact[0], rel=1e-3)
