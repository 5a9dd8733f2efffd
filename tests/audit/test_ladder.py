"""The ladder's simulations (dpaudit.audit.ladder): the ideal scores against a naive loop over
steps, and the white-box rung's test (one pre-registered guess fraction, the DP-SGD family
test) on mechanisms whose epsilon is known: the claimed noise is rarely rejected, half of it
is a violation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit.accounting import epsilon, noise_multiplier
from dpaudit.audit import BonferroniStrategy, CanaryScores
from dpaudit.audit.ladder import (
    GUESS_FRACTIONS,
    RUNGS,
    Rung,
    choose_guess_fraction,
    ideal_bounds,
    ideal_scores,
    rung_bound,
)
from dpaudit.errors import InputError

DELTA = 1e-5


def _naive_scores(rng, member, sigma, q, steps):
    """Step by step: a member is sampled with probability q and adds its clipped gradient (1);
    every step adds N(0, sigma^2) to each canary's coordinate."""
    total = np.zeros(member.size)
    for _ in range(steps):
        total += (rng.random(member.size) < q) * member
        total += rng.normal(0.0, sigma, member.size)
    return total


@pytest.mark.parametrize("q, steps", [(1.0, 3), (0.1, 20)])
def test_ideal_scores_follow_the_step_by_step_mechanism(q, steps):
    member = np.arange(40_000) % 2 == 0
    fast = ideal_scores(np.random.default_rng(0), member=member, noise_multiplier=0.8, sample_rate=q, steps=steps)
    slow = _naive_scores(np.random.default_rng(1), member, 0.8, q, steps)
    for side in (member, ~member):
        assert stats.ks_2samp(fast[side], slow[side]).pvalue > 1e-3
    assert fast[member].mean() == pytest.approx(q * steps, abs=5 * math.sqrt(steps) * 0.8 / 140)
    assert fast[~member].std() == pytest.approx(math.sqrt(steps) * 0.8, rel=0.03)


def _white_box_bounds(*, true_sigma, claimed_sigma, q, steps, m, trials, seed):
    """The white-box rung's test as the ladder runs it: the guess fraction pre-registered on
    the claim, then the family test on scores of the true mechanism."""
    sig = 0.05
    g = choose_guess_fraction(noise_multiplier=claimed_sigma, sample_rate=q, steps=steps, num_canaries=m,
                              delta=DELTA, significance=sig, seed=seed)
    rng = np.random.default_rng(seed + 1)
    out = []
    for t in range(trials):
        member = rng.random(m) < 0.5
        s = ideal_scores(rng, member=member, noise_multiplier=true_sigma, sample_rate=q, steps=steps)
        scores = CanaryScores(in_scores=s[member], out_scores=s[~member], seed=t)
        out.append(rung_bound(scores, methods=("claimed_curve",), noise_multiplier=claimed_sigma, sample_rate=q,
                              steps=steps, delta=DELTA, significance=sig,
                              strategy=BonferroniStrategy(grid=(g,))).epsilon)
    return out


def test_white_box_rung_at_the_claimed_noise_is_rarely_above_the_claim():
    # the twin's regime (q = 1, T = 3) at epsilon 4: 40 draws; at significance 0.05 the claim
    # may be exceeded by chance in about 2 of them, 7 or more would have probability < 0.5%
    q, steps = 1.0, 3
    sigma = noise_multiplier(target_epsilon=4.0, sample_rate=q, steps=steps, delta=DELTA)
    claim = epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
    bounds = _white_box_bounds(true_sigma=sigma, claimed_sigma=sigma, q=q, steps=steps, m=20_000, trials=40, seed=0)
    assert sum(b > claim for b in bounds) <= 6
    assert np.median(bounds) > 0.5 * claim  # and the test has power: near the ideal, not at 0


def test_white_box_rung_with_half_the_noise_is_a_violation():
    q, steps = 1.0, 3
    sigma = noise_multiplier(target_epsilon=4.0, sample_rate=q, steps=steps, delta=DELTA)
    claim = epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
    bounds = _white_box_bounds(true_sigma=sigma / 2, claimed_sigma=sigma, q=q, steps=steps, m=20_000, trials=5,
                               seed=0)
    assert all(b > claim for b in bounds)


@pytest.mark.slow
def test_white_box_rung_at_a_subsampled_q_is_sound():
    # a run's own q < 1 (the released model's regime): the claimed noise stays below the claim
    q, steps = 0.1, 20
    sigma = noise_multiplier(target_epsilon=4.0, sample_rate=q, steps=steps, delta=DELTA)
    claim = epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
    bounds = _white_box_bounds(true_sigma=sigma, claimed_sigma=sigma, q=q, steps=steps, m=20_000, trials=8, seed=3)
    assert sum(b > claim for b in bounds) <= 2  # P(>= 3 of 8 at 0.05) < 0.6%
    assert max(bounds) > 0


def test_the_guess_fraction_depends_on_the_claim_alone():
    kw = dict(noise_multiplier=1.0, sample_rate=1.0, steps=3, num_canaries=10_000, delta=DELTA, significance=0.05)
    g = choose_guess_fraction(**kw, seed=7)
    assert g in GUESS_FRACTIONS and choose_guess_fraction(**kw, seed=7) == g
    with pytest.raises(InputError, match="too few"):
        choose_guess_fraction(**{**kw, "num_canaries": 3})


def test_the_guess_fraction_is_one_that_could_exceed_the_claim():
    # epsilon 6 with 10^4 canaries: 1% of guesses gives the largest ideal bound, but even with
    # every guess right it cannot exceed 6 (all its guesses right: 4.3); the rule takes the best
    # fraction whose ceiling is above the claim
    from dpaudit.audit.ceilings import claimed_curve_ceiling

    q, steps, m = 1.0, 3, 10_000
    sigma = noise_multiplier(target_epsilon=6.0, sample_rate=q, steps=steps, delta=DELTA)
    kw = dict(noise_multiplier=sigma, sample_rate=q, steps=steps, num_canaries=m, delta=DELTA, significance=0.05)

    def ceiling(g):
        return claimed_curve_ceiling(**kw, strategy=BonferroniStrategy(grid=(g,)))

    def ideal(g):
        return ideal_bounds(**kw, methods=("claimed_curve",), strategy=BonferroniStrategy(grid=(g,)), trials=1)[0]

    g = choose_guess_fraction(**kw)
    assert ceiling(g) > 6.0 > ceiling(0.01) and ideal(0.01) > ideal(g)
    assert all(ideal(g) >= ideal(h) for h in GUESS_FRACTIONS if h * m >= 2 and ceiling(h) > 6.0)


@pytest.mark.parametrize("q, steps, m, targets, fractions", [
    (1.0, 3, 10_000, (1.0, 4.0, 8.0), GUESS_FRACTIONS[::2]),
    (0.05, 40, 1_000, (1.0, 4.0), (0.03,)),  # a ceiling of 3.86 there: above the first claim, below the second
])
def test_can_violate_is_the_ceiling_above_the_claim(q, steps, m, targets, fractions):
    """Two curves in place of the ceiling's search: the same answer, on claims either side of
    what m canaries can show (the search itself is the reference)."""
    from dpaudit.audit.ceilings import claimed_curve_can_violate, claimed_curve_ceiling

    answers = set()
    for target in targets:
        sigma = noise_multiplier(target_epsilon=target, sample_rate=q, steps=steps, delta=DELTA)
        kw = dict(noise_multiplier=sigma, sample_rate=q, steps=steps, num_canaries=m, delta=DELTA, significance=0.05)
        claim = epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
        for g in fractions:
            strategy = BonferroniStrategy(grid=(g,))
            fast = claimed_curve_can_violate(**kw, strategy=strategy)
            assert fast == (claimed_curve_ceiling(**kw, strategy=strategy) > claim), (target, g)
            answers.add(fast)
    assert answers == {True, False}


def test_ideal_bounds_are_seeded_and_need_a_trial():
    kw = dict(noise_multiplier=1.0, sample_rate=1.0, steps=3, num_canaries=2_000, delta=DELTA, significance=0.05,
              methods=("one_run", "claimed_curve"))
    assert ideal_bounds(**kw, trials=2, seed=1) == ideal_bounds(**kw, trials=2, seed=1)
    with pytest.raises(InputError, match="trials"):
        ideal_bounds(**kw, trials=0)


def test_rung_bound_shares_the_significance_among_its_methods():
    rng = np.random.default_rng(0)
    scores = CanaryScores(in_scores=rng.normal(3, 1, 500), out_scores=rng.normal(0, 1, 500), seed=0)
    kw = dict(noise_multiplier=1.0, sample_rate=1.0, steps=1, delta=DELTA, significance=0.1)
    both = rung_bound(scores, methods=("one_run", "claimed_curve"), **kw)
    assert both.significance == pytest.approx(0.05)
    alone = rung_bound(scores, methods=("claimed_curve",), **kw)
    half = rung_bound(scores, methods=("claimed_curve",), **{**kw, "significance": 0.05})
    assert alone.significance == pytest.approx(0.1) and alone.epsilon >= half.epsilon > 0


def test_rung_names_are_checked():
    with pytest.raises(InputError, match="rung must be one of"):
        Rung(rung="telepathy", bound=None, attack=None, significance=None, ideal=None, ideal_range=None,
             num_canaries=0, regime={})
    assert list(RUNGS) == ["released", "input_space", "white_box"]


def test_the_exact_gaussian_curve_of_full_batch_dp_sgd():
    # T steps at q = 1 are G_mu with mu = sqrt(T) / sigma: the exact curve lies on or above the
    # PLD's pessimistic one, within its discretisation, and gives the accountant's epsilon
    from dpaudit.accounting import make_event
    from dpaudit.audit.tradeoff import GaussianCurve, _dpsgd_curve, claimed_tradeoff_curve

    sigma, steps = 3.4, 3
    exact = _dpsgd_curve(sigma, 1.0, steps, 1e-3)
    assert isinstance(exact, GaussianCurve) and exact.mu == pytest.approx(math.sqrt(steps) / sigma)
    pld = claimed_tradeoff_curve(make_event(noise_multiplier=sigma, sample_rate=1.0, steps=steps))
    y = np.linspace(0.0, 1.0, 20_001)
    gap = exact.blow_up_inverse(y) - pld.blow_up_inverse(y)
    assert gap.min() >= 0.0 and gap.max() < 1e-5
    assert all(exact._blow_up_inverse_scalar(v) == pytest.approx(exact.blow_up_inverse(v), abs=1e-14) for v in y[::500])
    assert exact.epsilon(DELTA) == pytest.approx(epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=steps,
                                                         delta=DELTA), rel=1e-4)


def test_every_claim_of_the_demo_is_testable():
    """The demo's grid is chosen so that its default run can exit 0 on a correct trainer: the
    white-box rung of every DP model (q = 1 for the twin's steps, the preset's gradient
    canaries, a third of the significance) has a guess fraction whose ceiling is above the
    model's claim, and :func:`choose_guess_fraction` takes such a fraction when there is one
    (test above)."""
    from dpaudit.audit.ceilings import claimed_curve_ceiling
    from dpaudit.config import load_config
    from dpaudit.stages.ladder import TWIN_STEPS, rung_significance

    config = load_config("demo")
    models = [config.for_model(name) for name in config.model_names()]
    claims = sorted({c.train.dp.target_epsilon for c in models if c.train.dp.target_epsilon})
    assert claims == [1, 4, 12]
    for eps in claims:
        sigma = noise_multiplier(target_epsilon=eps, sample_rate=1.0, steps=TWIN_STEPS, delta=config.train.dp.delta)
        assert claimed_curve_ceiling(noise_multiplier=sigma, sample_rate=1.0, steps=TWIN_STEPS,
                                     num_canaries=config.audit.ladder.gradient_canaries, delta=config.train.dp.delta,
                                     significance=rung_significance(config),
                                     strategy=BonferroniStrategy(grid=(max(GUESS_FRACTIONS),))) > eps


def test_ideal_scores_through_an_optimizer_follow_the_step_by_step_final_model():
    """Through a linear update rule (step t's gradient weighed w_t): each step adds w_t (when it
    samples a member) and N(0, (w_t sigma)^2) to the projection on the canary's direction."""
    member, w, q, sigma = np.arange(40_000) % 2 == 0, np.array([1.0, 0.5, 0.5, 0.25]), 0.3, 0.8

    def weighted(grads):  # descent by w_t times each step's gradient
        return -sum(wt * g for wt, g in zip(w, grads, strict=True))

    fast = ideal_scores(np.random.default_rng(0), member=member, noise_multiplier=sigma, sample_rate=q, steps=4,
                        optimizer=weighted)
    rng, slow = np.random.default_rng(1), np.zeros(member.size)
    for wt in w:
        slow += wt * ((rng.random(member.size) < q) * member + rng.normal(0.0, sigma, member.size))
    for side in (member, ~member):
        assert stats.ks_2samp(fast[side], slow[side]).pvalue > 1e-3
    assert fast[member].mean() == pytest.approx(q * w.sum(), abs=0.02)


def test_ideal_scores_through_the_loops_optimizers():
    """Plain SGD at a constant rate: the closed form, scaled by its rate. AdamW (the demo's
    fine-tune): a perfect attack on its final model sees less than on plain SGD's."""
    from dpaudit.config import TrainConfig
    from dpaudit.train.plan import optimizer_response

    member, regime = np.arange(20_000) % 2 == 0, dict(noise_multiplier=1.09, sample_rate=0.1, steps=40)
    closed = ideal_scores(np.random.default_rng(0), member=member, **regime)
    sgd = optimizer_response(TrainConfig(trainer="dpaudit.train:dpsgd", optimizer="sgd", lr=0.5), 40)
    through = ideal_scores(np.random.default_rng(1), member=member, **regime, optimizer=sgd) / 0.5
    for side in (member, ~member):
        assert stats.ks_2samp(closed[side], through[side]).pvalue > 1e-3
    adamw = optimizer_response(TrainConfig(trainer="dpaudit.train:dpsgd", optimizer="adamw", lr=5e-3), 40)
    auc = {name: CanaryScores(in_scores=s[member], out_scores=s[~member]).auc() for name, s in
           (("closed", closed), ("adamw", ideal_scores(np.random.default_rng(2), member=member, **regime,
                                                       optimizer=adamw)))}
    assert 0.6 < auc["adamw"] < auc["closed"] - 0.01


def test_ideal_scores_with_a_canarys_own_share_of_each_inclusion():
    """``signal``: a sampled member adds signal[t] (not 1) at step t. All ones is the ideal
    itself, draw for draw; a naive loop over steps agrees in law; all zeros leaves nothing to
    tell members apart; a wrong length or a value outside [0, 1] is refused."""
    from dpaudit.config import TrainConfig
    from dpaudit.train.plan import optimizer_response

    member, regime = np.arange(20_000) % 2 == 0, dict(noise_multiplier=0.8, sample_rate=0.3, steps=4)
    adamw = optimizer_response(TrainConfig(trainer="dpaudit.train:dpsgd", optimizer="adamw", lr=5e-3), 4)
    for optimizer in (None, adamw):
        plain = ideal_scores(np.random.default_rng(0), member=member, **regime, optimizer=optimizer)
        ones = ideal_scores(np.random.default_rng(0), member=member, **regime, optimizer=optimizer, signal=np.ones(4))
        if optimizer is not None:
            np.testing.assert_array_equal(plain, ones)
        zero = ideal_scores(np.random.default_rng(1), member=member, **regime, optimizer=optimizer, signal=np.zeros(4))
        assert stats.ks_2samp(zero[member], zero[~member]).pvalue > 1e-3
    signal = np.array([1.0, 0.8, 0.6, 0.4])
    fast = ideal_scores(np.random.default_rng(2), member=member, **regime, signal=signal)
    rng, slow = np.random.default_rng(3), np.zeros(member.size)
    for s in signal:
        slow += s * (rng.random(member.size) < 0.3) * member + rng.normal(0.0, 0.8, member.size)
    for side in (member, ~member):
        assert stats.ks_2samp(fast[side], slow[side]).pvalue > 1e-3
    assert fast[member].mean() == pytest.approx(0.3 * signal.sum(), abs=0.03)
    for bad in (np.ones(3), np.array([1.0, 1.0, 1.0, 1.5]), np.array([1.0, -0.1, 1.0, 1.0])):
        with pytest.raises(InputError, match="signal"):
            ideal_scores(np.random.default_rng(0), member=member, **regime, signal=bad)
