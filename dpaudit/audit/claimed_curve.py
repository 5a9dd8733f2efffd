"""Test one run's guesses against the *claimed* trade-off curve, not one (epsilon, delta).

The accountant's DpEvent knows a whole privacy profile delta(eps), eps >= 0, and so a
trade-off curve f (Dong, Roth, Su 2019, "Gaussian Differential Privacy",
arXiv 1905.02383, Prop. 2.12; built in :mod:`dpaudit.audit.tradeoff`). The one-run
f-DP analysis of Mahloujifar, Melis, Chaudhuri, "Auditing f-Differential Privacy in One
Run" (ICML 2025, arXiv 2410.22235) holds for any trade-off function, so the observed
guesses (m canaries, each in with probability 1/2; r guesses, v correct) can be tested
against the claimed f itself: a sound test of the claim, and more powerful than testing
one (epsilon, delta) point of it (which is what :func:`~dpaudit.audit.epsilon_one_run`
does).

* :func:`claimed_curve_rejects` -- whether counts reject a curve at a significance.
* :func:`claimed_curve_bound` -- the test on a :class:`CanaryScores`, for the DP-SGD family
  (noise multiplier sigma, Poisson rate q, T steps), with a strategy for (k+, k-) and an
  epsilon-equivalent.

The curves (:class:`TradeOffCurve`, :func:`claimed_tradeoff_curve`,
:func:`tradeoff_curve_from_profile`) live in :mod:`dpaudit.audit.tradeoff` and are
importable from here too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real

import numpy as np

from dpaudit.audit._validation import _check_delta, _check_one_run_counts, _check_significance
from dpaudit.audit.bounds import _fdp_rejects_with, mu_one_run_fdp
from dpaudit.audit.canary_scores import CanaryScores
from dpaudit.audit.results import BoundResult
from dpaudit.audit.selection import select_guesses
from dpaudit.audit.strategy import DEFAULT_STRATEGY
from dpaudit.audit.tradeoff import (
    CURVE_DISCRETIZATION,
    GaussianCurve,
    TradeOffCurve,
    _as_blow_up_inverse,
    _dpsgd_curve,
    claimed_tradeoff_curve,
    tradeoff_curve_from_profile,
)
from dpaudit.errors import InputError

__all__ = [
    "TradeOffCurve",
    "claimed_curve_bound",
    "claimed_curve_rejects",
    "claimed_tradeoff_curve",
    "tradeoff_curve_from_profile",
]

# Search over sigma' for the epsilon-equivalent: sigma' = sigma * 2^u on a dyadic lattice
# of u (so that curves are shared across calls through the cache), to 2^-10 in u
# (sigma' to a relative 7e-4).
_U_RESOLUTION = 2.0**-10
_SIGMA_MAX = 1e3  # "nearly perfect privacy": not rejected there -> report 0
_SIGMA_MIN = 1e-2
_EPS_DESCENT_CAP = 200.0  # stop lowering sigma' once its curve's epsilon exceeds this


@functools.lru_cache(maxsize=256)
def _accountant_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """:func:`dpaudit.accounting.epsilon` (PLD, its default settings), cached."""
    from dpaudit import accounting

    return accounting.epsilon(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=delta)


# ------------------------------------------------------------------------- the test
def claimed_curve_rejects(*, num_canaries, num_guesses, num_correct, curve, significance: float = 0.05) -> bool:
    """Whether ``num_correct`` of ``num_guesses`` correct rejects "the mechanism is f-DP".

    Mahloujifar, Melis, Chaudhuri 2025, "Auditing f-Differential Privacy in One Run"
    (arXiv 2410.22235): m = ``num_canaries`` canaries, each included independently with
    probability 1/2; the recursion of :func:`~dpaudit.audit.fdp_one_run_rejects` with the
    inverse blow-up B^-1(y) = f(1 - y) of a symmetric trade-off function f. True means:
    if the mechanism were f-DP, this many correct guesses would have probability at most
    ``significance``.

    ``curve`` is a :class:`TradeOffCurve`, a DpEvent (or its dict form; its claimed curve
    is built with :func:`claimed_tradeoff_curve`), or any callable f(x) that is a
    symmetric trade-off function (convex, continuous, non-increasing, f(x) <= 1 - x).
    """
    m, r, v = _check_one_run_counts(num_canaries, num_guesses, num_correct)
    significance = _check_significance(significance)
    return _fdp_rejects_with(m, r, v, _as_blow_up_inverse(curve), significance)


def _perfect_privacy(y: float) -> float:
    """B^-1 of f(x) = 1 - x: every trade-off function lies below it."""
    return y


# ------------------------------------------------------------------- the DP-SGD bound
def _check_positive(name: str, value, *, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, Real | np.floating) or not math.isfinite(float(value)):
        raise InputError(f"{name} must be a finite positive number, got {value!r}")
    value = float(value)
    if value <= 0.0 or (upper is not None and value > upper):
        raise InputError(f"{name} must be in (0, {upper:g}], got {value}" if upper else f"{name} must be > 0, got {value}")
    return value


def _check_family(noise_multiplier, sample_rate, steps, delta) -> tuple[float, float, int, float]:
    """(sigma, q, T, delta) of a claimed DP-SGD run, checked (InputError otherwise)."""
    sigma = _check_positive("noise_multiplier", noise_multiplier)
    q = _check_positive("sample_rate", sample_rate, upper=1.0)
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or int(steps) < 1:
        raise InputError(f"steps must be a positive integer, got {steps!r}")
    delta = _check_delta(delta)
    if delta == 0.0:
        raise InputError("delta must be > 0 (the accountant's epsilon at delta = 0 is infinite)")
    return sigma, q, int(steps), delta


def _mu_proxy(m: int, r: int, v: int, significance: float) -> float:
    """The split's chooser: the Gaussian f-DP mu bound, a fast proxy for the curve test."""
    return mu_one_run_fdp(num_canaries=m, num_guesses=r, num_correct=v, significance=significance)


def claimed_curve_bound(
    scores: CanaryScores,
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    significance: float = 0.05,
    strategy=None,
) -> BoundResult:
    """Test one run's guesses against the claimed DP-SGD trade-off curve; epsilon-equivalent.

    Mahloujifar, Melis, Chaudhuri 2025 (arXiv 2410.22235), against the curve of
    ``noise_multiplier`` (sigma), Poisson ``sample_rate`` (q) and ``steps`` (T) from
    ``dp_accounting``'s PLD (:func:`claimed_tradeoff_curve`; Dong, Roth, Su 2019,
    arXiv 1905.02383, Prop. 2.12). The guesses are the k+ highest and k- lowest of all
    canaries, as in :meth:`CanaryScores.epsilon_one_run`, chosen by ``strategy``:

    * :class:`BonferroniStrategy` (default): each distinct (k+, k-) of the grid is tested
      at ``significance / G`` (G = number of pairs); "rejected" = some pair rejects.
    * :class:`SplitStrategy`: the pair is chosen on the choosing part (by the Gaussian
      f-DP bound, :func:`~dpaudit.audit.mu_one_run_fdp`, a fast proxy), then tested once
      at the full significance on the evaluating part.

    ``details["rejects_claim"]`` says whether the claim (sigma itself) is rejected. The
    reported ``epsilon`` is the epsilon-equivalent: the accountant's epsilon at ``delta``
    (:func:`dpaudit.accounting.epsilon`) of sigma' = ``details["sigma_equivalent"]``, the
    smallest sigma' in the family (same q and T) found to be rejected, by bisection on
    log sigma' to a relative 7e-4. It is on the conservative side: sigma' was itself
    rejected, and the true boundary lies between it and a sigma' that was not. It
    exceeds the claim's epsilon only if the claim is rejected; it is at least the
    claim's epsilon when the claim is rejected. It is 0 when even perfect privacy
    (f(x) = 1 - x, which every sigma' lies below) is not rejected, or when no sigma' up
    to 1e3 is. ``sound`` is True: the claimed curve is computed below the true one.
    """
    if not isinstance(scores, CanaryScores):
        raise InputError(f"scores must be a CanaryScores, got {type(scores).__name__}")
    sigma, q, steps, delta = _check_family(noise_multiplier, sample_rate, steps, delta)
    significance = _check_significance(significance)
    strategy = DEFAULT_STRATEGY if strategy is None else strategy

    sel, counts, rejecting = _candidates(scores, strategy, significance)
    m, per_test = sel.ranking.m, sel.significance_per_test
    claim_eps = _accountant_epsilon(sigma, q, steps, delta)
    found = _search_sigma(rejecting, sigma=sigma, q=q, steps=steps, delta=delta)
    rejects_claim = bool(found.claim_rejected)
    eps, sigma_eq = _epsilon_equivalent(found, claim_eps, sigma=sigma, q=q, steps=steps, delta=delta)
    # The pair reported: the most accurate of those that reject sigma' (all when none does).
    pool = range(len(counts)) if found.u_hi is None else found.hi_rejected
    j = max(pool, key=lambda j: (counts[j][2] / (counts[j][0] + counts[j][1]), -j))
    kp, km, v = counts[j]
    details = {
        "rejects_claim": rejects_claim,
        "sigma_equivalent": sigma_eq,
        "sigma_not_rejected": None if found.u_lo is None else sigma * 2.0**found.u_lo,
        "claim_epsilon": claim_eps,
        "noise_multiplier": sigma,
        "sample_rate": q,
        "steps": steps,
        "k_plus": kp,
        "k_minus": km,
        "significance_per_test": per_test,
        **sel.details,
        "candidates": [
            {"k_plus": a, "k_minus": b, "num_correct": c, "rejects_claim": i in found.claim_rejected}
            for i, (a, b, c) in enumerate(counts)
        ],
        "curve": {"accountant": "pld", "pessimistic": True, "value_discretization_interval": CURVE_DISCRETIZATION},
        "tie_break_seed": scores.tie_break_seed,
    }
    return BoundResult(
        "claimed_curve", float(eps), delta, significance, int(m), int(kp + km), int(v), strategy.describe(),
        details, True,
    )


def _candidates(scores: CanaryScores, strategy, significance: float):
    """The strategy's selection on ``scores``, its (k+, k-, correct) candidates, and
    ``rejecting(blow_up_inverse)``: the indices of the candidates that reject a curve."""
    pooled, member, keys = scores.pooled()
    sel = select_guesses(strategy, scores=pooled, member=member, tie_keys=keys, significance=significance,
                         chooser=_mu_proxy, chooser_name="mu")
    m, per_test = sel.ranking.m, sel.significance_per_test
    counts = [(kp, km, sel.ranking.correct(kp, km)) for kp, km in sel.pairs]

    def rejecting(blow_up_inverse) -> list[int]:
        return [j for j, (kp, km, v) in enumerate(counts) if _fdp_rejects_with(m, kp + km, v, blow_up_inverse, per_test)]

    return sel, counts, rejecting


def exceeds_claim(scores: CanaryScores, *, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  significance: float = 0.05, strategy=None) -> bool:
    """Whether :func:`claimed_curve_bound` on ``scores`` reports more than the claim's
    epsilon, without its search: the claim and sigma' = sigma * 2^-r (r the search's
    resolution, the largest sigma' below sigma it tests) are both rejected, and that
    sigma' has the larger accountant epsilon. Rejection is monotone in sigma', so this is
    the bound's own answer, up to a tie of the accountant's discretised epsilons (where it
    says no). Two curves instead of the search's dozen."""
    sigma, q, steps, delta = _check_family(noise_multiplier, sample_rate, steps, delta)
    significance = _check_significance(significance)
    _, _, rejecting = _candidates(scores, DEFAULT_STRATEGY if strategy is None else strategy, significance)
    below = sigma * 2.0**-_U_RESOLUTION
    return (all(rejecting(_dpsgd_curve(s, q, steps, CURVE_DISCRETIZATION)._blow_up_inverse_scalar) for s in (sigma, below))
            and _accountant_epsilon(below, q, steps, delta) > _accountant_epsilon(sigma, q, steps, delta))


@dataclass(frozen=True)
class _Search:
    """Where the search over sigma' = sigma * 2^u ended (candidates as indices)."""

    claim_rejected: list[int]  # the candidates that reject the claim (u = 0) itself
    u_lo: float | None  # largest u known NOT rejected
    u_hi: float | None  # smallest u known rejected
    hi_rejected: list[int]  # the candidates that reject sigma * 2^u_hi


def _search_sigma(rejecting: Callable[[Callable], list[int]], *, sigma, q, steps, delta) -> _Search:
    """The smallest rejected sigma' of the family (same q, T), to 2^-10 in log2 sigma'.

    ``rejecting(blow_up_inverse)`` lists the candidates that reject a curve."""

    def rejecting_at(u: float) -> list[int]:
        return rejecting(_dpsgd_curve(sigma * 2.0**u, q, steps, CURVE_DISCRETIZATION)._blow_up_inverse_scalar)

    # Every trade-off curve lies below f(x) = 1 - x, so if even that is not rejected no
    # sigma' is (and no PLD is needed).
    any_rejected = bool(rejecting(_perfect_privacy))
    claim_rej = rejecting_at(0.0) if any_rejected else []

    # Rejection is monotone in sigma'. (1) A larger sigma' gives a pointwise larger curve:
    # N(b, sigma'^2) is N(b, sigma^2) plus independent noise, a post-processing, so the
    # mechanism with more noise is at least as private. (2) The recursion is monotone in
    # B^-1: run it with g <= g' and write D_r = r' - r, D_h = h' - h; each step keeps
    # D_h >= 0 and D_r - w_i D_h unchanged, with w_i = i / (c' - i) decreasing as i falls,
    # so D_r >= w_i D_h >= 0 throughout and r'_0 + h'_0 >= r_0 + h_0. Hence the rejected
    # sigma' form an interval [sigma*, inf), found by bisection, and "some sigma' < sigma
    # is rejected" implies "sigma is rejected". (The PLD's discretisation could break (1)
    # by a hair; the claim is therefore tested on its own, and the caller reconciles
    # the epsilon with that test.)
    u_lo: float | None
    u_hi: float | None
    hi_rej: list[int] = []
    if not any_rejected:
        u_lo, u_hi = None, None
    elif claim_rej:
        u_lo, u_hi, hi_rej = None, 0.0, claim_rej
        u = -1.0
        while sigma * 2.0**u >= _SIGMA_MIN:
            curve = _dpsgd_curve(sigma * 2.0**u, q, steps, CURVE_DISCRETIZATION)
            rej = rejecting(curve._blow_up_inverse_scalar)
            if not rej:
                u_lo = u
                break
            u_hi, hi_rej = u, rej
            if _curve_epsilon(curve, delta) > _EPS_DESCENT_CAP:
                break  # overwhelming evidence: report this (rejected) sigma'
            u -= 1.0
    else:
        u_lo, u_hi = 0.0, None
        u = 1.0
        while sigma * 2.0**u <= _SIGMA_MAX:
            rej = rejecting_at(u)
            if rej:
                u_hi, hi_rej = u, rej
                break
            u_lo = u
            u += 1.0
    if u_lo is not None and u_hi is not None:
        while u_hi - u_lo > _U_RESOLUTION:
            mid = 0.5 * (u_lo + u_hi)
            rej = rejecting_at(mid)
            if rej:
                u_hi, hi_rej = mid, rej
            else:
                u_lo = mid
    return _Search(claim_rej, u_lo, u_hi, hi_rej)


def _epsilon_equivalent(found: _Search, claim_eps: float, *, sigma, q, steps, delta) -> tuple[float, float | None]:
    """(the accountant's epsilon at ``delta`` of the smallest rejected sigma', that sigma'); (0, None) if none."""
    if found.u_hi is None:
        return 0.0, None
    sigma_eq = sigma * 2.0**found.u_hi
    eps = claim_eps if found.u_hi == 0.0 else _accountant_epsilon(sigma_eq, q, steps, delta)
    # The accountant's epsilon is itself discretised; keep "reported > claim" <=> a
    # rejection of the claim exact, on the conservative side in both directions.
    eps = max(eps, claim_eps) if found.claim_rejected else min(eps, claim_eps)
    return eps, sigma_eq


def _curve_epsilon(curve, delta: float) -> float:
    """Smallest grid eps with delta(eps) <= delta (inf if none): a cheap stop for the descent."""
    if isinstance(curve, GaussianCurve):
        return curve.epsilon(delta)
    ok = curve.deltas <= delta
    return float(curve.epsilons[np.argmax(ok)]) if ok.any() else math.inf
