"""One contract, checked on every registered bound (the shape of scikit-learn's
``parametrize_with_checks``): a citation, the family's keyword-only signature, a finite
non-negative epsilon on valid counts, monotone in the evidence, and -- for every sound
bound -- no more exceedances of a known epsilon than its significance allows.

Known mechanism: randomized response (RR) with epsilon e, which is (e, 0)-DP for each
canary. One-run family: each of m canaries is in by a fair coin, and each guess is right
with probability q = e^e / (1 + e^e), independently. Threshold family: one independent run
per outcome, TP ~ Bin(n, q) members said "member", FP ~ Bin(n, 1 - q) non-members did.
At delta = 0 a sound bound exceeds e with probability at most its significance, so over
TRIALS simulated audits the number of exceedances X is at most Bin(TRIALS, significance)
in the stochastic order; the check fails when the exact tail P[Bin >= X] is below
CHECK_LEVEL.

The last test adds a bound in this file only and shows that the registry, CanaryScores
and this contract pick it up with nothing else edited.
"""

import inspect
import math
import re

import numpy as np
import pytest
from scipy import special, stats

from dpaudit.audit import CanaryScores, available_bounds, epsilon_one_run, get_bound, register_bound
from dpaudit.audit import registry
from dpaudit.audit.registry import FAMILIES

DELTA = 1e-5
TRIALS, SIGNIFICANCE, CHECK_LEVEL = 200, 0.1, 1e-3
RR_EPSILON = 1.0

ONE_RUN_COUNTS = [  # (m, r, v)
    (1, 1, 1), (10, 10, 0), (10, 4, 4), (100, 10, 7), (100, 100, 50), (1000, 100, 100), (1000, 1000, 700),
    (5000, 50, 49), (5000, 5000, 2600),
]
THRESHOLD_COUNTS = [  # (tp, fp, tn, fn)
    (1, 0, 1, 0), (0, 1, 0, 1), (10, 0, 10, 0), (50, 50, 50, 50), (90, 3, 97, 10), (1000, 0, 1000, 0),
    (700, 300, 700, 300), (3, 0, 500, 497),
]


def _evaluate(spec, counts, *, delta=DELTA, significance=0.05) -> float:
    names = FAMILIES[spec.family][:-2]
    eps, extras = spec.evaluate(**dict(zip(names, counts, strict=True)), delta=delta, significance=significance)
    assert isinstance(extras, dict) and all(isinstance(k, str) for k in extras)
    return eps


# --------------------------------------------------------------------- the checks
def check_citation(spec):
    assert isinstance(spec.paper, str) and re.search(r"\b(19|20)\d\d\b", spec.paper), spec.paper
    assert spec.arxiv is None or re.fullmatch(r"\d{4}\.\d{4,5}(v\d+)?", spec.arxiv), spec.arxiv
    assert spec.family in FAMILIES
    # a sound bound assumes nothing about the mechanism; an estimate says what it assumes
    assert (spec.assumes is None) == spec.sound, spec.assumes


def check_signature(spec):
    params = inspect.signature(spec.fn).parameters
    for name in FAMILIES[spec.family]:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def check_finite_and_non_negative(spec):
    for counts in ONE_RUN_COUNTS if spec.family == "one_run" else THRESHOLD_COUNTS:
        eps = _evaluate(spec, counts)
        assert math.isfinite(eps) and eps >= 0.0, (counts, eps)


def check_monotone_in_the_evidence(spec):
    """One-run: non-decreasing in v at fixed (m, r). Threshold: in TP at fixed FP."""
    if spec.family == "one_run":
        m, r = 200, 30
        rows = [[(m, r, v) for v in range(r + 1)]]
    else:
        n = 60
        rows = [[(tp, fp, n - fp, n - tp) for tp in range(n + 1)] for fp in (0, 6, 30)]
    for row in rows:
        eps = [_evaluate(spec, counts) for counts in row]
        assert all(b >= a for a, b in zip(eps, eps[1:], strict=False)), (row[0], eps)


def _simulated_counts(family: str, rng: np.random.Generator):
    q = special.expit(RR_EPSILON)
    if family == "one_run":
        m, r = 1000, 500
        member = rng.random(m) < 0.5  # each canary in by a fair coin
        says_in = np.where(rng.random(m) < q, member, ~member)  # RR: right with probability q
        return m, r, int(np.sum(says_in[:r] == member[:r]))  # guesses on a fixed r of them
    n = 500
    tp, fp = int(rng.binomial(n, q)), int(rng.binomial(n, 1 - q))
    return tp, fp, n - fp, n - tp


def check_sound_on_randomized_response(spec):
    rng = np.random.default_rng(20250)
    exceed = sum(
        _evaluate(spec, _simulated_counts(spec.family, rng), delta=0.0, significance=SIGNIFICANCE) > RR_EPSILON
        for _ in range(TRIALS)
    )
    tail = stats.binom.sf(exceed - 1, TRIALS, SIGNIFICANCE)  # P[Bin(TRIALS, SIGNIFICANCE) >= exceed]
    assert tail >= CHECK_LEVEL, f"{spec.name}: {exceed}/{TRIALS} above epsilon {RR_EPSILON} (tail {tail:.2g})"


CHECKS = [check_citation, check_signature, check_finite_and_non_negative, check_monotone_in_the_evidence]


# ------------------------------------------------------------- every bound, every check
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", available_bounds())
def test_bound_contract(name, check):
    check(get_bound(name))


@pytest.mark.parametrize("name", [n for n in available_bounds() if get_bound(n).sound])
def test_sound_bound_contract(name):
    check_sound_on_randomized_response(get_bound(name))


def test_the_soundness_check_catches_an_unsound_bound():
    """Twice Steinke et al.'s bound claims too much: the check must see it."""
    spec = get_bound("one_run")
    doubled = type(spec)(spec.name, spec.family, True, spec.paper, spec.arxiv, lambda **kw: 2 * spec.fn(**kw))
    with pytest.raises(AssertionError, match="above epsilon"):
        check_sound_on_randomized_response(doubled)


# --------------------------------------------------- adding a bound: this file only
def test_a_bound_added_here_is_dispatched_and_meets_the_contract():
    before = available_bounds()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_REGISTRY", dict(registry.registered()))  # undone when the block ends

        @register_bound("toy_half_one_run", family="one_run", sound=True, paper="dpaudit tests 2025", arxiv=None)
        def toy_half_one_run(*, num_canaries, num_guesses, num_correct, delta, significance):
            """Half of Steinke et al.'s bound (arXiv 2305.08846): weaker, so still sound."""
            return 0.5 * epsilon_one_run(num_canaries=num_canaries, num_guesses=num_guesses,
                                         num_correct=num_correct, delta=delta, significance=significance)

        assert available_bounds() == sorted([*before, "toy_half_one_run"])
        scores = CanaryScores(in_scores=np.arange(50) + 10.0, out_scores=-np.arange(50) - 1.0)
        res = scores.bound("toy_half_one_run", delta=DELTA)
        assert res.method == "toy_half_one_run" and res.sound is True and res.paper == "dpaudit tests 2025"
        assert res.epsilon == 0.5 * scores.bound("one_run", delta=DELTA).epsilon > 0
        spec = get_bound("toy_half_one_run")
        for check in [*CHECKS, check_sound_on_randomized_response]:
            check(spec)
    assert available_bounds() == before
