"""The order-statistics one-run test (Xiang et al. 2025, arXiv 2509.08704): exact for
independent channels, and not sound for a one-run audit, which is why it is an estimate."""

import numpy as np
import pytest
from scipy import special, stats

from dpaudit.audit import CanaryScores, get_bound
from dpaudit.audit.bound_order_statistics import (
    mu_order_statistics,
    order_statistics_tail,
)

ALPHA = 0.05


def _top_r_errors(y: np.ndarray, r: int) -> np.ndarray:
    """Wrong MAP guesses (sign of y; every bit 'in' w.l.o.g.) among the r largest |y|, per row."""
    top = np.argsort(-np.abs(y), axis=1)[:, :r]
    return (np.take_along_axis(y, top, axis=1) < 0).sum(axis=1)


def _rejections(draw_errors, *, mu, m, r, trials, seed):
    """How often the test rejects the true mu over ``trials`` simulated runs."""
    rng = np.random.default_rng(seed)
    u_reject = max((u for u in range(r) if order_statistics_tail(mu=mu, num_canaries=m, num_guesses=r,
                                                                  num_wrong=u) < ALPHA), default=-1)
    return int((draw_errors(rng, trials) <= u_reject).sum())


def test_tail_matches_a_naive_simulation_of_independent_channels():
    mu, m, r = 1.0, 1000, 100
    rng = np.random.default_rng(0)
    errors = _top_r_errors(rng.normal(mu / 2, 1.0, size=(4000, m)), r)
    for u in (5, 8, 10, 12):
        simulated = (errors <= u).mean()
        exact = order_statistics_tail(mu=mu, num_canaries=m, num_guesses=r, num_wrong=u)
        assert abs(simulated - exact) < 4 * np.sqrt(exact * (1 - exact) / 4000) + 1e-3, (u, simulated, exact)


def test_all_guesses_released_is_a_binomial():
    tail = order_statistics_tail(mu=0.8, num_canaries=500, num_guesses=500, num_wrong=150)
    assert tail == pytest.approx(stats.binom.cdf(150, 500, special.ndtr(-0.4)))


@pytest.mark.parametrize("m, r, u, epsilon", [(1000, 100, 10, 3.1645), (1000, 1000, 309, 3.6700)])
def test_reproduces_the_papers_figures(m, r, u, epsilon):
    """Gaussian channels, delta 1e-5, 95%: values published with the paper's code."""
    bound = get_bound("order_statistics").evaluate(num_canaries=m, num_guesses=r, num_correct=r - u,
                                                   delta=1e-5, significance=0.05)[0]
    assert bound == pytest.approx(epsilon, abs=2e-3)


def test_keeps_its_level_on_independent_gaussian_mechanisms():
    mu, m, r = 1.0, 1000, 100
    rejected = _rejections(lambda rng, n: _top_r_errors(rng.normal(mu / 2, 1.0, size=(n, m)), r),
                           mu=mu, m=m, r=r, trials=400, seed=1)
    assert rejected <= stats.binom.ppf(0.999, 400, ALPHA), rejected


def test_keeps_its_level_on_randomized_response():
    """Randomized response with the Gaussian curve's error rate Phi(-mu/2) lies above the
    mu-GDP curve (it is more private), so a valid null: every magnitude is the same, and
    the released guesses err at the full rate."""
    mu, m, r = 1.0, 1000, 100
    rejected = _rejections(lambda rng, n: rng.binomial(r, special.ndtr(-mu / 2), size=n),
                           mu=mu, m=m, r=r, trials=400, seed=2)
    assert rejected <= stats.binom.ppf(0.999, 400, ALPHA), rejected


def test_is_not_sound_for_one_run_audits():
    """A mechanism exactly mu-GDP with respect to every canary: one magnitude A ~ |N(mu/2, 1)|
    shared by all canaries, each output +-A, flipped with probability 1/(1 + e^(mu A)). Per
    canary (A, sign) is N(+-mu/2, 1), yet the shared A makes the test reject the true mu far
    more often than alpha (169 of 400 runs with every guess released; 68 with 500 of them):
    hence ``sound=False``."""
    mu, m, r = 1.0, 1000, 1000

    def shared_magnitude(rng, n):
        a = np.abs(rng.normal(mu / 2, 1.0, size=n))
        return rng.binomial(r, 1.0 / (1.0 + np.exp(mu * a)))  # any r of the m tie; errors among them

    rejected = _rejections(shared_magnitude, mu=mu, m=m, r=r, trials=400, seed=3)
    assert rejected > 4 * ALPHA * 400, rejected
    assert not get_bound("order_statistics").sound


def test_ceiling_and_power_against_steinke():
    """Perfect guesses give a finite estimate that grows with m; on independent Gaussian
    scores at epsilon 4 it reads well above Steinke's sound bound."""
    ceilings = [get_bound("order_statistics").evaluate(num_canaries=m, num_guesses=m, num_correct=m, delta=1e-5,
                                                       significance=ALPHA)[0] for m in (100, 1000)]
    assert 0 < ceilings[0] < ceilings[1] < np.inf
    rng = np.random.default_rng(4)
    member = rng.random(1000) < 0.5
    y = rng.normal(np.where(member, 0.46, -0.46), 1.0)  # mu 0.92: epsilon 4 at delta 1e-5
    cs = CanaryScores(in_scores=y[member], out_scores=y[~member], seed=0)
    estimate, steinke = cs.bound("order_statistics", delta=1e-5), cs.bound("one_run", delta=1e-5)
    assert estimate.epsilon > steinke.epsilon + 0.5
    assert not estimate.sound and "independent" in get_bound("order_statistics").assumes


def test_no_guess_or_chance_rejects_nothing():
    assert mu_order_statistics(num_canaries=1000, num_guesses=0, num_wrong=0, significance=ALPHA) == 0.0
    assert mu_order_statistics(num_canaries=1000, num_guesses=100, num_wrong=50, significance=ALPHA) == 0.0
