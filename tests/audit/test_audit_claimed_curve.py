"""The one-run test against the claimed trade-off curve (Mahloujifar et al. 2025 with a
DpEvent's PLD curve): naive references, exact curves, a simulation whose true curve is
the accountant's, the epsilon-equivalent, validation.

Simulation: m canaries, each in with probability 1/2; per canary T steps, each step's
observation x_t ~ N(b_t, sigma_true^2) with b_t ~ Bernoulli(q) when the canary is in and
b_t = 0 when it is out -- exactly T steps of the Poisson-sampled Gaussian mechanism, so
its trade-off curve is the one the accountant computes for (sigma_true, q, T). The score
is the exact log-likelihood ratio sum_t log(1 - q + q exp((2 x_t - 1) / (2 sigma_true^2))).

With m <= 2000 the claim sigma was rejected on sigma / 2 data in only 30-65% of trials
in every (q, T, sigma) tried, so the power checks use m = 10000, q = 0.5, T = 10, sigma = 3
(claimed epsilon 2.36 at delta 1e-5; sigma / 2 has epsilon 5.84).
"""

import json
import math
from statistics import NormalDist

import dp_accounting
import numpy as np
import pytest
from scipy import stats

import dpaudit.audit as audit_pkg
from dpaudit import accounting
from dpaudit.audit import (
    DEFAULT_GUESS_FRACTIONS,
    CanaryScores,
    SplitStrategy,
    TradeOffCurve,
    available_bounds,
    claimed_curve_bound,
    claimed_curve_rejects,
    claimed_tradeoff_curve,
    fdp_one_run_rejects,
    mu_one_run_fdp,
    tradeoff_curve_from_profile,
)
from dpaudit.audit.canary_scores import tie_keys
from dpaudit.audit.strategy import distinct_guess_pairs, one_run_guess_counts
from dpaudit.errors import InputError

DELTA = 1e-5
SIG = 0.05
# the simulated DP-SGD family (see the module docstring)
M, Q, T, SIGMA = 10_000, 0.5, 10, 3.0


# ------------------------------------------------------------------ naive references
def naive_rejects(m, c_all, c, f, tau):
    """Mahloujifar et al. 2025 recursion over full arrays (no early stop) for a general
    symmetric trade-off function f, with B^-1(y) = f(1 - y)."""
    if c == 0:
        return False
    r = [0.0] * (c + 1)
    h = [0.0] * (c + 1)
    r[c] = tau * c / m
    h[c] = tau * (c_all - c) / m
    for i in range(c - 1, -1, -1):
        h[i] = max(h[i + 1], f(1.0 - r[i + 1]))
        r[i] = min(r[i + 1] + i / (c_all - i) * (h[i] - h[i + 1]), 1.0)
    return r[0] + h[0] > c_all / m


def gaussian_f(mu):
    normal = NormalDist()

    def f(x):
        if x <= 0.0:
            return 1.0
        if x >= 1.0:
            return 0.0
        return normal.cdf(normal.inv_cdf(1.0 - x) - mu)

    return f


def eps_delta_f(eps, delta=0.0):
    def f(x):
        return max(0.0, 1.0 - delta - math.exp(eps) * x, math.exp(-eps) * (1.0 - delta - x))

    return f


def envelope_f(epsilons, deltas):
    """Dong, Roth, Su 2019 Prop. 2.12 written out: a plain max over all the profile's lines
    (no hull), each line in the form of the proposition."""
    e = np.asarray(epsilons, float)
    d = np.asarray(deltas, float)
    steep_e, steep_d = e[e <= 700], d[e <= 700]
    up, flat_d = np.exp(steep_e), np.exp(-e)

    def f(x):
        steep = (1.0 - steep_d) - up * x
        flat = flat_d * ((1.0 - d) - x)
        return max(0.0, float(steep.max()), float(flat.max()))

    return f


def exact_gaussian_curve(x, mu):
    """f_mu(x) = Phi(Phi^-1(1 - x) - mu), with Phi^-1(1 - x) taken as isf(x) (exact near 0)."""
    return stats.norm.cdf(stats.norm.isf(x) - mu)


COUNTS = [(1000, 100, v) for v in (50, 70, 85, 95, 100)] + [
    (1000, 300, 280), (300, 300, 200), (50, 20, 19), (2000, 60, 58), (500, 500, 400), (10, 10, 10), (100, 1, 1),
    (100, 0, 0), (1000, 1000, 700),
]


@pytest.fixture(scope="module")
def family_curve():
    return claimed_tradeoff_curve(accounting.make_event(noise_multiplier=SIGMA, sample_rate=Q, steps=T))


# ------------------------------------------------------------- the general recursion
@pytest.mark.parametrize(
    "name,f",
    [("gauss0.7", gaussian_f(0.7)), ("gauss2", gaussian_f(2.0)), ("pure1", eps_delta_f(1.0)),
     ("pure3", eps_delta_f(3.0)), ("approx", eps_delta_f(1.5, 1e-3))],
)
def test_general_recursion_matches_naive(name, f):
    for m, r, v in COUNTS:
        for tau in (0.05, 0.005):
            fast = claimed_curve_rejects(num_canaries=m, num_guesses=r, num_correct=v, curve=f, significance=tau)
            assert fast == naive_rejects(m, r, v, f, tau), (name, m, r, v, tau)


def test_pld_curve_recursion_matches_naive(family_curve):
    # the hull evaluation against a plain max over all of the profile's lines
    f = envelope_f(family_curve.epsilons, family_curve.deltas)
    for m, r, v in COUNTS + [(M, 100, 97), (M, 1000, 900), (M, 10_000, 8600)]:
        fast = claimed_curve_rejects(num_canaries=m, num_guesses=r, num_correct=v, curve=family_curve)
        assert fast == naive_rejects(m, r, v, f, SIG), (m, r, v)


def test_gaussian_special_case_matches_fdp_one_run():
    for mu in (0.0, 0.3, 0.9, 1.7, 3.0):
        f = gaussian_f(mu)
        for m, r, v in COUNTS:
            general = claimed_curve_rejects(num_canaries=m, num_guesses=r, num_correct=v, curve=f)
            assert general == fdp_one_run_rejects(num_canaries=m, num_guesses=r, num_correct=v, mu=mu), (mu, m, r, v)


def test_gaussian_pld_curve_gives_the_gaussian_decisions():
    """The PLD curve of one Gaussian (noise 1/mu) rejects exactly where f_mu does, up to
    counts at the boundary (none on these counts), and the mu bound is reproduced."""
    mu = 1.3
    curve = claimed_tradeoff_curve(dp_accounting.GaussianDpEvent(1.0 / mu))
    for m, r in [(1000, 100), (1000, 300), (500, 500), (2000, 60)]:
        for v in range(r // 2, r + 1):
            pld = claimed_curve_rejects(num_canaries=m, num_guesses=r, num_correct=v, curve=curve)
            assert pld == fdp_one_run_rejects(num_canaries=m, num_guesses=r, num_correct=v, mu=mu), (m, r, v)
    # the mu bound: counts whose Gaussian bound is just above / below mu
    for m, r, v in [(1000, 200, 180), (1000, 100, 100)]:
        mu_lb = mu_one_run_fdp(num_canaries=m, num_guesses=r, num_correct=v)
        above = claimed_tradeoff_curve(dp_accounting.GaussianDpEvent(1.0 / (mu_lb * 0.99)))
        below = claimed_tradeoff_curve(dp_accounting.GaussianDpEvent(1.0 / (mu_lb * 1.01)))
        assert claimed_curve_rejects(num_canaries=m, num_guesses=r, num_correct=v, curve=above)
        assert not claimed_curve_rejects(num_canaries=m, num_guesses=r, num_correct=v, curve=below)


def test_rejection_is_monotone_in_the_curve():
    """A pointwise larger f rejects wherever a smaller one does (the recursion is monotone)."""
    for m, r in [(1000, 200), (300, 300)]:
        for v in range(r // 2, r + 1, 3):
            flags = [
                claimed_curve_rejects(num_canaries=m, num_guesses=r, num_correct=v, curve=gaussian_f(mu))
                for mu in (3.0, 2.0, 1.5, 1.0, 0.5, 0.2, 0.0)  # f grows as mu falls
            ]
            assert flags == sorted(flags), (m, r, v, flags)


# ------------------------------------------------------------------- the PLD curve
X = np.concatenate([np.logspace(-15, -1, 300), np.linspace(0.1, 0.9, 201), 1.0 - np.logspace(-1, -15, 300)])


@pytest.mark.parametrize(
    "event,mu",
    [
        (dp_accounting.GaussianDpEvent(1.0), 1.0),
        (dp_accounting.GaussianDpEvent(0.5), 2.0),
        (dp_accounting.GaussianDpEvent(3.0), 1.0 / 3.0),
        # no sampling (q = 1), 4 steps: one Gaussian of noise sigma / 2
        (accounting.make_event(noise_multiplier=2.0, sample_rate=1.0, steps=4), 1.0),
    ],
)
def test_pld_curve_is_below_and_close_to_the_exact_gaussian_curve(event, mu):
    curve = claimed_tradeoff_curve(event)
    exact = exact_gaussian_curve(X, mu)
    f = curve(X)
    gap = exact - f
    # never above (up to floating point at values of 1e-20 and below), and close
    assert np.all(f <= exact * (1 + 1e-9) + 1e-18)
    assert gap.max() < 2e-6
    # near x = 1 the curve is tiny: still close in relative terms where it is above 1e-12
    big = exact > 1e-12
    assert np.max(gap[big] / exact[big]) < 2e-3
    # the inverse blow-up is f(1 - y), also in its scalar form
    y = 1.0 - X
    assert np.allclose(curve.blow_up_inverse(y), f, rtol=1e-9, atol=1e-12)
    assert [curve._blow_up_inverse_scalar(float(t)) for t in y[::37]] == pytest.approx(
        curve.blow_up_inverse(y[::37]), rel=1e-12, abs=1e-300
    )


def test_pld_curve_is_a_symmetric_trade_off_function(family_curve):
    x = np.linspace(0.0, 1.0, 2001)
    f = family_curve(x)
    assert np.all(np.diff(f) <= 1e-15)  # non-increasing
    assert np.all(f <= 1.0 - x + 1e-15)  # below perfect privacy
    assert np.all(np.diff(f, 2) >= -1e-9)  # convex
    # symmetric: f(f(x)) = x wherever f is strictly decreasing (f is an involution there)
    inner = (f > 1e-6) & (x > 1e-6)
    assert np.allclose(family_curve(f[inner]), x[inner], atol=1e-6)
    # the hull equals the plain envelope of the profile's lines
    env = envelope_f(family_curve.epsilons, family_curve.deltas)
    xs = np.r_[np.logspace(-12, -1, 50), np.linspace(0.1, 0.9, 50), 1 - np.logspace(-1, -12, 50)]
    assert family_curve(xs) == pytest.approx([env(float(t)) for t in xs], rel=1e-9, abs=1e-15)


def test_profile_curve_of_one_point_is_the_eps_delta_curve():
    for eps, delta in [(1.0, 0.0), (0.3, 1e-3), (0.0, 0.1)]:
        curve = tradeoff_curve_from_profile(epsilons=[eps], deltas=[delta])
        f = eps_delta_f(eps, delta)
        assert curve(X) == pytest.approx([f(float(t)) for t in X], rel=1e-12, abs=1e-15)


def test_non_private_event_rejects_nothing():
    curve = claimed_tradeoff_curve(dp_accounting.NonPrivateDpEvent())
    assert np.all(curve(X) == 0.0)
    assert not claimed_curve_rejects(num_canaries=100, num_guesses=100, num_correct=100, curve=curve)


def test_curve_from_event_dict_and_event_accepted():
    event = accounting.make_event(noise_multiplier=SIGMA, sample_rate=Q, steps=T)
    as_dict = claimed_tradeoff_curve(accounting.event_to_dict(event))
    assert np.array_equal(as_dict.deltas, claimed_tradeoff_curve(event).deltas)
    # a DpEvent passed as the curve of claimed_curve_rejects
    assert claimed_curve_rejects(num_canaries=1000, num_guesses=100, num_correct=100, curve=event)


# --------------------------------------------------------------------- simulation
def simulate(seed, sigma_true, m=M, q=Q, steps=T):
    rng = np.random.default_rng(seed)
    member = rng.random(m) < 0.5
    b = (rng.random((m, steps)) < q) & member[:, None]
    x = rng.normal(b.astype(float), sigma_true)
    score = np.log1p(q * np.expm1((2.0 * x - 1.0) / (2.0 * sigma_true**2))).sum(axis=1)
    return CanaryScores.from_labels(scores=score, is_member=member, seed=0)


def naive_guess_counts(cs, kp, km):
    scores, member, _ = cs.pooled()  # canary order
    keys = tie_keys(cs.seed, scores.size)
    order = np.lexsort((keys, scores))
    return int(member[order[scores.size - kp :]].sum() + (~member[order[:km]]).sum())


def curve_test_rejects(cs, curve, significance=SIG):
    """Bonferroni over the default guess pairs, each at significance / G."""
    pairs = distinct_guess_pairs(DEFAULT_GUESS_FRACTIONS, cs.num_canaries)
    return any(
        claimed_curve_rejects(
            num_canaries=cs.num_canaries, num_guesses=kp + km, num_correct=naive_guess_counts(cs, kp, km),
            curve=curve, significance=significance / len(pairs),
        )
        for kp, km in pairs
    )


def allowed(trials, significance):
    """Binomial 99.9% upper quantile: Monte-Carlo slack on top of the significance."""
    return int(stats.binom.ppf(0.999, trials, significance))


def rejection_rates(curve, sigma_true, trials, seed, significance=SIG, steinke=False):
    claim_eps = accounting.epsilon(noise_multiplier=SIGMA, sample_rate=Q, steps=T, delta=DELTA)
    seeds = np.random.SeedSequence(seed).spawn(trials)
    curve_rej = steinke_rej = 0
    for s in seeds:
        cs = simulate(s, sigma_true)
        curve_rej += curve_test_rejects(cs, curve, significance)
        if steinke:
            steinke_rej += cs.bound("one_run", delta=DELTA, significance=significance).epsilon > claim_eps
    return curve_rej, steinke_rej


def test_simulation_correct_sigma_is_rarely_rejected(family_curve):
    trials = 200
    rejected, _ = rejection_rates(family_curve, SIGMA, trials, seed=1)
    print(f"sigma_true = sigma: claim rejected in {rejected}/{trials}")
    assert rejected <= allowed(trials, SIG)
    # exact Clopper-Pearson: the rejection rate is not shown to exceed the significance
    assert stats.binomtest(rejected, trials, SIG, alternative="greater").pvalue > 0.001


def test_simulation_half_sigma_is_rejected_and_beats_steinke(family_curve):
    trials = 100
    curve_rej, steinke_rej = rejection_rates(family_curve, SIGMA / 2, trials, seed=2, steinke=True)
    print(f"sigma_true = sigma/2: curve test rejects {curve_rej}/{trials}, Steinke one_run {steinke_rej}/{trials}")
    assert curve_rej >= 0.95 * trials
    assert curve_rej > steinke_rej


@pytest.mark.slow
@pytest.mark.parametrize("significance", [0.05, 0.5])
def test_simulation_rates_many_trials(family_curve, significance):
    trials = 400
    null, _ = rejection_rates(family_curve, SIGMA, trials, seed=3, significance=significance)
    alt, steinke = rejection_rates(family_curve, SIGMA / 2, trials, seed=4, significance=significance, steinke=True)
    print(f"significance {significance}: null {null}/{trials}; sigma/2: curve {alt}/{trials}, Steinke {steinke}/{trials}")
    assert null <= allowed(trials, significance)
    assert alt >= 0.95 * trials
    assert alt > steinke


# ------------------------------------------------------------ the bound and its epsilon
def check_bound_consistency(res, cs):
    d = res.details
    claim_eps = accounting.epsilon(noise_multiplier=SIGMA, sample_rate=Q, steps=T, delta=DELTA)
    assert res.method == "claimed_curve" and res.sound is True
    assert d["claim_epsilon"] == pytest.approx(claim_eps)
    # rejects_claim is the Bonferroni test of the claim itself
    family = claimed_tradeoff_curve(accounting.make_event(noise_multiplier=SIGMA, sample_rate=Q, steps=T))
    assert d["rejects_claim"] == curve_test_rejects(cs, family)
    assert d["significance_per_test"] == pytest.approx(SIG / d["num_candidates"])
    assert res.num_correct == naive_guess_counts(cs, d["k_plus"], d["k_minus"])
    # conservative side: "reported > claim" only with a rejection; a rejection reports >= claim
    if res.epsilon > claim_eps:
        assert d["rejects_claim"]
    if d["rejects_claim"]:
        assert res.epsilon >= claim_eps
    if d["sigma_equivalent"] is None:
        assert res.epsilon == 0.0
        return
    s_eq, s_no = d["sigma_equivalent"], d["sigma_not_rejected"]
    eps_eq = accounting.epsilon(noise_multiplier=s_eq, sample_rate=Q, steps=T, delta=DELTA)
    assert res.epsilon == pytest.approx(max(eps_eq, claim_eps) if d["rejects_claim"] else min(eps_eq, claim_eps))
    # the reported sigma' was rejected (by some pair), the one just above it was not
    assert curve_test_rejects(cs, claimed_tradeoff_curve(accounting.make_event(noise_multiplier=s_eq, sample_rate=Q, steps=T)))
    assert s_no is not None and s_no < s_eq <= s_no * (1 + 1e-3)
    assert not curve_test_rejects(cs, claimed_tradeoff_curve(accounting.make_event(noise_multiplier=s_no, sample_rate=Q, steps=T)))
    # monotone: rejected above, not below (checked on a few sigma' around the boundary)
    for factor in (0.5, 0.9, 0.99):
        ev = accounting.make_event(noise_multiplier=s_no * factor, sample_rate=Q, steps=T)
        assert not curve_test_rejects(cs, claimed_tradeoff_curve(ev))
    for factor in (1.01, 1.1, 2.0):
        ev = accounting.make_event(noise_multiplier=s_eq * factor, sample_rate=Q, steps=T)
        assert curve_test_rejects(cs, claimed_tradeoff_curve(ev))
    json.dumps(res.to_dict())


def test_bound_on_correct_sigma_is_consistent_and_below_the_claim():
    cs = simulate(np.random.SeedSequence(11), SIGMA)
    res = claimed_curve_bound(cs, noise_multiplier=SIGMA, sample_rate=Q, steps=T, delta=DELTA)
    print(res.epsilon, res.details["sigma_equivalent"], res.details["claim_epsilon"])
    assert not res.details["rejects_claim"]
    assert 0.0 < res.epsilon <= res.details["claim_epsilon"]
    check_bound_consistency(res, cs)


def test_bound_on_half_sigma_rejects_and_exceeds_the_claim():
    cs = simulate(np.random.SeedSequence(12), SIGMA / 2)
    res = claimed_curve_bound(cs, noise_multiplier=SIGMA, sample_rate=Q, steps=T, delta=DELTA)
    print(res.epsilon, res.details["sigma_equivalent"], res.details["claim_epsilon"])
    assert res.details["rejects_claim"]
    assert res.details["sigma_equivalent"] < SIGMA
    assert res.epsilon > res.details["claim_epsilon"]
    # more than the (epsilon, delta) bound from the same scores
    assert res.epsilon > cs.bound("one_run", delta=DELTA).epsilon
    check_bound_consistency(res, cs)


@pytest.mark.slow
def test_epsilon_equivalent_below_claim_in_most_trials():
    trials = 20
    above = 0
    for s in np.random.SeedSequence(13).spawn(trials):
        cs = simulate(s, SIGMA)
        res = claimed_curve_bound(cs, noise_multiplier=SIGMA, sample_rate=Q, steps=T, delta=DELTA)
        above += res.epsilon > res.details["claim_epsilon"]
        assert (res.epsilon > res.details["claim_epsilon"]) <= res.details["rejects_claim"]
    assert above <= allowed(trials, SIG)


def test_bound_zero_when_nothing_is_rejected():
    rng = np.random.default_rng(0)
    cs = CanaryScores.from_labels(scores=rng.normal(size=200), is_member=rng.random(200) < 0.5)
    res = claimed_curve_bound(cs, noise_multiplier=SIGMA, sample_rate=Q, steps=T, delta=DELTA)
    assert res.epsilon == 0.0
    assert res.details["sigma_equivalent"] is None and not res.details["rejects_claim"]
    assert res.num_guesses == res.details["k_plus"] + res.details["k_minus"]


def test_bound_with_split_strategy():
    cs = simulate(np.random.SeedSequence(14), SIGMA / 2, m=4000)
    strategy = SplitStrategy(fraction=0.5, seed=3)
    res = claimed_curve_bound(cs, noise_multiplier=SIGMA, sample_rate=Q, steps=T, delta=DELTA, strategy=strategy)
    assert res.strategy["name"] == "split" and res.num_canaries == 2000
    assert res.details["significance_per_test"] == SIG
    # the evaluating part, rebuilt by hand, tested at the full significance
    scores, member, _ = cs.pooled()  # canary order
    keys = tie_keys(cs.seed, scores.size)
    ev = np.random.default_rng(3).permutation(scores.size)[2000:]
    sub = CanaryScores.from_labels(scores=scores[ev], is_member=member[ev])
    cand = res.details["chosen_candidate"]
    kp, km = one_run_guess_counts(tuple(cand) if isinstance(cand, list) else cand, 2000)
    assert (res.details["k_plus"], res.details["k_minus"]) == (kp, km)
    order = np.lexsort((keys[ev], scores[ev]))
    v = int(member[ev][order[2000 - kp :]].sum() + (~member[ev][order[:km]]).sum())
    assert res.num_correct == v
    family = claimed_tradeoff_curve(accounting.make_event(noise_multiplier=SIGMA, sample_rate=Q, steps=T))
    assert res.details["rejects_claim"] == claimed_curve_rejects(
        num_canaries=2000, num_guesses=kp + km, num_correct=v, curve=family, significance=SIG
    )
    assert sub.num_canaries == 2000


# ------------------------------------------------------------------------ registry
def test_not_registered_but_exported():
    assert "claimed_curve" not in available_bounds()
    for name in ("claimed_curve_bound", "claimed_curve_rejects", "claimed_tradeoff_curve",
                 "tradeoff_curve_from_profile", "TradeOffCurve"):
        assert name in audit_pkg.__all__
    assert isinstance(claimed_tradeoff_curve(dp_accounting.GaussianDpEvent(1.0)), TradeOffCurve)


# ---------------------------------------------------------------------- validation
@pytest.fixture(scope="module")
def small_scores():
    rng = np.random.default_rng(0)
    member = rng.random(100) < 0.5
    return CanaryScores.from_labels(scores=rng.normal(member * 2.0), is_member=member)


GOOD = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "delta": 1e-5}


@pytest.mark.parametrize(
    "change",
    [
        {"noise_multiplier": 0.0}, {"noise_multiplier": -1.0}, {"noise_multiplier": float("nan")},
        {"noise_multiplier": True}, {"noise_multiplier": "1"}, {"sample_rate": 0.0}, {"sample_rate": 1.5},
        {"steps": 0}, {"steps": 2.5}, {"steps": True}, {"delta": 0.0}, {"delta": 1.0}, {"delta": None},
        {"significance": 0.0}, {"significance": 1.0}, {"strategy": "bonferroni"},
    ],
)
def test_bound_validation(small_scores, change):
    with pytest.raises(InputError):
        claimed_curve_bound(small_scores, **{**GOOD, **change})


def test_bound_needs_canary_scores_and_keywords(small_scores):
    with pytest.raises(InputError, match="CanaryScores"):
        claimed_curve_bound([1.0, 2.0], **GOOD)
    with pytest.raises(TypeError):
        claimed_curve_bound(small_scores, 1.0, 0.1, 10, 1e-5)  # keyword-only


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_canaries": 0, "num_guesses": 0, "num_correct": 0},
        {"num_canaries": 10, "num_guesses": 11, "num_correct": 5},
        {"num_canaries": 10, "num_guesses": 5, "num_correct": 6},
        {"num_canaries": 10, "num_guesses": 5, "num_correct": -1},
        {"num_canaries": 10, "num_guesses": 5.5, "num_correct": 1},
    ],
)
def test_rejects_validation(kwargs):
    with pytest.raises(InputError):
        claimed_curve_rejects(**kwargs, curve=gaussian_f(1.0))


def test_rejects_bad_curve_and_significance():
    with pytest.raises(InputError, match="curve must be"):
        claimed_curve_rejects(num_canaries=10, num_guesses=5, num_correct=5, curve="gaussian")
    with pytest.raises(InputError):
        claimed_curve_rejects(num_canaries=10, num_guesses=5, num_correct=5, curve=gaussian_f(1.0), significance=2)
    with pytest.raises(TypeError):
        claimed_curve_rejects(10, 5, 5, gaussian_f(1.0))  # keyword-only


def test_curve_validation():
    with pytest.raises(InputError):
        claimed_tradeoff_curve("not an event")
    with pytest.raises(InputError):
        claimed_tradeoff_curve({"type": "no_such_event"})
    with pytest.raises(InputError):
        claimed_tradeoff_curve(dp_accounting.GaussianDpEvent(1.0), value_discretization_interval=0.0)
    with pytest.raises(InputError):
        claimed_tradeoff_curve(dp_accounting.UnsupportedDpEvent())
    for eps, delta in [([], []), ([1.0, 2.0], [0.1]), ([-1.0], [0.0]), ([1.0], [1.5]), ([np.inf], [0.0]),
                       ([[1.0]], [[0.0]])]:
        with pytest.raises(InputError):
            tradeoff_curve_from_profile(epsilons=eps, deltas=delta)


def test_sanity_of_the_simulation_scores():
    """The score is the exact log-likelihood ratio of the in / out distributions."""
    x = np.array([[0.3, -1.2, 2.0]])
    s = 0.8
    lr = np.prod((1 - Q) + Q * stats.norm.pdf(x, 1.0, s) / stats.norm.pdf(x, 0.0, s))
    ours = np.log1p(Q * np.expm1((2 * x - 1) / (2 * s**2))).sum()
    assert ours == pytest.approx(math.log(lr))
