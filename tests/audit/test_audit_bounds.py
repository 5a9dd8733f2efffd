"""The four bounds: fast code against slow naive references, known values, validation."""

import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats

from dpaudit.audit import (
    clopper_pearson_upper,
    epsilon_clopper_pearson,
    epsilon_from_gdp,
    epsilon_one_run,
    epsilon_one_run_fdp,
    fdp_one_run_rejects,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_lower_bound,
    mu_one_run_fdp,
    one_run_p_value,
)
from dpaudit.errors import InputError


# ------------------------------------------------------------------ naive references
def naive_binom_pmf(k, n, p):
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


def naive_one_run_p_value(m, r, v, eps, delta):
    """Steinke et al. 2023 p-value, with an exhaustive loop for alpha and exact pmfs."""
    q = math.exp(eps) / (1 + math.exp(eps))
    beta = sum(naive_binom_pmf(k, r, q) for k in range(v, r + 1))
    alpha = 0.0
    for i in range(1, v + 1):
        window = sum(naive_binom_pmf(k, r, q) for k in range(v - i, v))
        alpha = max(alpha, window / i)
    return min(beta + alpha * 2 * m * delta, 1.0)


def naive_largest(pred, step, top):
    """Largest grid point x in [0, top] with pred(x) True: a coarse linear scan (no
    monotonicity assumed), then a fine scan of +-2 coarse steps around it."""
    coarse = 0.0
    for x in np.arange(0.0, top, 0.05):
        if pred(x):
            coarse = x
    best = 0.0
    for x in np.arange(max(0.0, coarse - 0.1), coarse + 0.1, step):
        if pred(x):
            best = x
    return best


def naive_fdp_rejects(m, c_all, c, mu, tau):
    """Mahloujifar et al. 2025 recursion, written out over full arrays (no early stop),
    with the standard library's normal distribution."""
    normal = NormalDist()

    def blow_up_inverse(y):
        if y <= 0.0 or y >= 1.0:
            return min(max(y, 0.0), 1.0)
        return normal.cdf(normal.inv_cdf(y) - mu)

    r = [0.0] * (c + 1)
    h = [0.0] * (c + 1)
    r[c] = tau * c / m
    h[c] = tau * (c_all - c) / m
    for i in range(c - 1, -1, -1):
        h[i] = max(h[i + 1], blow_up_inverse(r[i + 1]))
        r[i] = min(r[i + 1] + i / (c_all - i) * (h[i] - h[i + 1]), 1.0)
    return r[0] + h[0] > c_all / m


def naive_cp_upper(k, n, alpha):
    """Clopper-Pearson upper bound by bisection on the binomial cdf: P[Bin(n, p) <= k] = alpha."""
    if k == n:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if stats.binom.cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------- one-run (Steinke)
def test_ceiling_check_3_47():
    eps = epsilon_one_run(num_canaries=1000, num_guesses=100, num_correct=100, delta=1e-5, significance=0.05)
    assert eps == pytest.approx(3.47, abs=0.01)


@pytest.mark.parametrize(
    "m,r,v,eps,delta",
    [(100, 30, 25, 1.0, 1e-5), (1000, 40, 40, 2.5, 1e-3), (50, 50, 31, 0.3, 0.0), (500, 60, 45, 0.8, 1e-2)],
)
def test_one_run_p_value_matches_naive(m, r, v, eps, delta):
    fast = one_run_p_value(num_canaries=m, num_guesses=r, num_correct=v, epsilon=eps, delta=delta)
    assert fast == pytest.approx(naive_one_run_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("m,r,v,delta", [(1000, 50, 50, 1e-5), (200, 60, 52, 1e-5), (100, 40, 30, 0.0)])
def test_epsilon_one_run_matches_naive_scan(m, r, v, delta):
    fast = epsilon_one_run(num_canaries=m, num_guesses=r, num_correct=v, delta=delta)
    slow = naive_largest(lambda e: naive_one_run_p_value(m, r, v, e, delta) < 0.05, 0.002, 6.0)
    assert slow <= fast + 1e-9 <= slow + 0.002 + 1e-9


def test_one_run_p_value_at_bound_equals_significance():
    eps = epsilon_one_run(num_canaries=10_000, num_guesses=1000, num_correct=950, delta=1e-5)
    p = one_run_p_value(num_canaries=10_000, num_guesses=1000, num_correct=950, epsilon=eps, delta=1e-5)
    assert p == pytest.approx(0.05, abs=1e-5)


def test_one_run_zero_cases():
    assert epsilon_one_run(num_canaries=100, num_guesses=0, num_correct=0, delta=1e-5) == 0.0
    assert epsilon_one_run(num_canaries=100, num_guesses=10, num_correct=5, delta=1e-5) == 0.0
    assert epsilon_one_run_fdp(num_canaries=100, num_guesses=10, num_correct=5, delta=1e-5) == 0.0
    assert mu_one_run_fdp(num_canaries=100, num_guesses=0, num_correct=0) == 0.0


# --------------------------------------------------------------- one-run f-DP (Mahloujifar)
@pytest.mark.parametrize("m,r,v", [(1000, 100, 100), (1000, 200, 180), (300, 300, 200), (50, 20, 19)])
def test_fdp_matches_naive(m, r, v):
    for mu in (0.0, 0.3, 0.9, 1.7):
        assert fdp_one_run_rejects(num_canaries=m, num_guesses=r, num_correct=v, mu=mu) == naive_fdp_rejects(
            m, r, v, mu, 0.05
        )
    fast = mu_one_run_fdp(num_canaries=m, num_guesses=r, num_correct=v)
    slow = naive_largest(lambda mu: naive_fdp_rejects(m, r, v, mu, 0.05), 0.002, 4.0)
    assert slow <= fast + 1e-9 <= slow + 0.002 + 1e-9
    eps = epsilon_one_run_fdp(num_canaries=m, num_guesses=r, num_correct=v, delta=1e-5)
    assert eps == pytest.approx(gdp_epsilon(mu=fast, delta=1e-5))


def test_fdp_rejection_is_monotone_in_mu():
    flags = [fdp_one_run_rejects(num_canaries=1000, num_guesses=300, num_correct=280, mu=mu)
             for mu in np.linspace(0, 3, 301)]
    first_false = flags.index(False)
    assert all(flags[:first_false]) and not any(flags[first_false:])


@pytest.mark.parametrize("m,r,v", [(1000, 100, 100), (1000, 400, 390), (10_000, 1000, 950), (10_000, 10_000, 8000)])
def test_fdp_is_larger_than_steinke(m, r, v):
    steinke = epsilon_one_run(num_canaries=m, num_guesses=r, num_correct=v, delta=1e-5)
    fdp = epsilon_one_run_fdp(num_canaries=m, num_guesses=r, num_correct=v, delta=1e-5)
    assert 1.2 * steinke <= fdp <= 2.5 * steinke


# ------------------------------------------------------------------- Clopper-Pearson
@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (0, 1000), (17, 400)])
def test_clopper_pearson_upper_matches_naive(k, n):
    assert clopper_pearson_upper(successes=k, trials=n, significance=0.05) == pytest.approx(
        naive_cp_upper(k, n, 0.05), abs=1e-9
    )
    # zero successes has a closed form: 1 - alpha^(1/n)
    if k == 0:
        assert clopper_pearson_upper(successes=0, trials=n, significance=0.05) == pytest.approx(1 - 0.05 ** (1 / n))


def test_epsilon_clopper_pearson_formula():
    tp, fp, tn, fn, delta = 90, 5, 95, 10, 1e-5
    fpr_ub = naive_cp_upper(fp, fp + tn, 0.025)
    fnr_ub = naive_cp_upper(fn, fn + tp, 0.025)
    want = max(math.log((1 - delta - fnr_ub) / fpr_ub), math.log((1 - delta - fpr_ub) / fnr_ub), 0.0)
    assert epsilon_clopper_pearson(tp=tp, fp=fp, tn=tn, fn=fn, delta=delta) == pytest.approx(want, rel=1e-7)
    # Symmetric in the roles of (FP, FN) and floored at 0.
    assert epsilon_clopper_pearson(tp=95, fp=10, tn=90, fn=5, delta=delta) == pytest.approx(want, rel=1e-7)
    assert epsilon_clopper_pearson(tp=50, fp=50, tn=50, fn=50, delta=delta) == 0.0


def test_clopper_pearson_zero_errors_closed_form():
    n = 1000
    ub = 1 - 0.025 ** (1 / n)
    want = math.log((1 - 1e-5 - ub) / ub)
    assert epsilon_clopper_pearson(tp=n, fp=0, tn=n, fn=0, delta=1e-5) == pytest.approx(want)


# ------------------------------------------------------------------------ Gaussian DP
def test_gdp_delta_epsilon_roundtrip_and_known_values():
    for mu in (0.2, 0.5, 1.0, 2.0, 4.0):
        for delta in (1e-3, 1e-5, 1e-8):
            eps = gdp_epsilon(mu=mu, delta=delta)
            if eps > 0:
                assert gdp_delta(mu=mu, epsilon=eps) == pytest.approx(delta, rel=1e-6)
    # Direct evaluation of Dong, Roth, Su (2019) Corollary 2.13 at a few points.
    for mu, eps in ((1.0, 1.0), (2.0, 3.0), (0.5, 0.1)):
        want = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        assert gdp_delta(mu=mu, epsilon=eps) == pytest.approx(want, rel=1e-10)
    assert gdp_epsilon(mu=0.0, delta=1e-5) == 0.0
    assert gdp_epsilon(mu=1.0, delta=0.5) == 0.0  # delta(0) = 2 Phi(1/2) - 1 = 0.383 < 0.5
    assert gdp_epsilon(mu=1.0, delta=0.0) == math.inf
    # Large mu does not overflow.
    assert math.isfinite(gdp_epsilon(mu=60.0, delta=1e-5))


def test_gdp_mu_lower_bound_formula():
    tp, fp, tn, fn = 180, 30, 170, 20
    fpr_ub = naive_cp_upper(fp, fp + tn, 0.025)
    fnr_ub = naive_cp_upper(fn, fn + tp, 0.025)
    want = stats.norm.ppf(1 - fpr_ub) - stats.norm.ppf(fnr_ub)
    assert gdp_mu_lower_bound(tp=tp, fp=fp, tn=tn, fn=fn) == pytest.approx(want, rel=1e-8)
    assert epsilon_from_gdp(tp=tp, fp=fp, tn=tn, fn=fn, delta=1e-5) == pytest.approx(
        gdp_epsilon(mu=want, delta=1e-5)
    )
    assert gdp_mu_lower_bound(tp=10, fp=10, tn=10, fn=10) == 0.0


# ------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_canaries=10, num_guesses=11, num_correct=5),
        dict(num_canaries=10, num_guesses=5, num_correct=6),
        dict(num_canaries=0, num_guesses=0, num_correct=0),
        dict(num_canaries=10, num_guesses=-1, num_correct=0),
        dict(num_canaries=10.5, num_guesses=5, num_correct=5),
        dict(num_canaries=10, num_guesses=True, num_correct=0),
    ],
)
def test_one_run_validation(kwargs):
    for fn in (epsilon_one_run, epsilon_one_run_fdp):
        with pytest.raises(InputError):
            fn(**kwargs, delta=1e-5)


@pytest.mark.parametrize("delta,significance", [(1.0, 0.05), (-1e-5, 0.05), (1e-5, 0.0), (1e-5, 1.0), (None, 0.05)])
def test_delta_significance_validation(delta, significance):
    with pytest.raises(ValueError):
        epsilon_one_run(num_canaries=100, num_guesses=10, num_correct=10, delta=delta, significance=significance)
    with pytest.raises(ValueError):
        epsilon_clopper_pearson(tp=1, fp=1, tn=1, fn=1, delta=delta, significance=significance)
    with pytest.raises(ValueError):
        epsilon_from_gdp(tp=1, fp=1, tn=1, fn=1, delta=delta, significance=significance)


def test_confusion_validation():
    with pytest.raises(InputError):
        epsilon_clopper_pearson(tp=0, fp=1, tn=1, fn=0, delta=1e-5)  # no members
    with pytest.raises(InputError):
        epsilon_from_gdp(tp=1, fp=0, tn=0, fn=1, delta=1e-5)  # no non-members
    with pytest.raises(InputError):
        epsilon_clopper_pearson(tp=-1, fp=1, tn=1, fn=1, delta=1e-5)


def test_keyword_only():
    with pytest.raises(TypeError):
        epsilon_one_run(100, 10, 10, 1e-5)  # noqa
    with pytest.raises(TypeError):
        epsilon_clopper_pearson(1, 1, 1, 1, 1e-5)  # noqa
