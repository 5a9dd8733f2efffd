"""decide(): every branch, the order of the rules, and a plain-JSON Verdict."""

import dataclasses
import json
import math

import numpy as np
import pytest

from dpaudit.audit import BoundResult, CanaryScores, Verdict, decide, one_run_ceiling
from dpaudit.errors import InputError

DELTA = 1e-5


def bound(method="one_run", eps=2.0, delta=DELTA, significance=0.05, m=1000, r=100, v=95):
    one_run = method.startswith("one_run")
    return BoundResult(
        method, eps, delta, significance, m, r if one_run else None, v if one_run else None,
        {"name": "bonferroni", "grid": None}, {},
    )


def run(bounds, claimed=3.0, accountant=None, ceiling=5.0, learned=True):
    return decide(bounds=bounds, claimed_epsilon=claimed, accountant_epsilon=accountant, ceiling=ceiling,
                  learned=learned)


# ------------------------------------------------------------------------ no claim
@pytest.mark.parametrize("claimed", [None, math.inf])
def test_no_claim_has_nothing_to_violate(claimed):
    v = run([("loss", bound(eps=50.0))], claimed=claimed, learned=False, ceiling=0.1)
    assert v.status == "no_claim" and v.exit_code == 0
    assert "nothing to violate" in v.reason
    assert ("unknown" in v.reason) if claimed is None else ("non-private" in v.reason)
    assert v.claimed_epsilon is None
    assert v.epsilon_lower_bound == 50.0 and v.attack == "loss" and v.method == "one_run"


def test_no_claim_without_bounds():
    v = run([], claimed=None)
    assert v.status == "no_claim" and v.epsilon_lower_bound is None and v.method is None and v.delta is None


# ------------------------------------------------------------------------ violated
def test_a_sound_bound_above_the_claim_is_a_violation():
    v = run([("loss", bound(eps=2.0)), ("zlib", bound("clopper_pearson", eps=3.5, m=2000))], claimed=3.0)
    assert v.status == "violated" and v.exit_code == 1
    assert (v.attack, v.method, v.epsilon_lower_bound, v.claimed_epsilon) == ("zlib", "clopper_pearson", 3.5, 3.0)
    assert v.num_canaries == 2000 and v.num_guesses is None
    for phrase in ("'zlib'", "clopper_pearson", "3.500", "3.000", "Jagielski et al. 2020"):
        assert phrase in v.reason
    assert "joint confidence 90% over 2 sound bounds" in v.reason
    assert v.significance == pytest.approx(0.1)


def test_equal_to_the_claim_is_not_a_violation():
    assert run([("loss", bound(eps=3.0))], claimed=3.0).status == "consistent"


@pytest.mark.parametrize("learned, ceiling", [(False, 5.0), (True, 1.0), (False, 1.0), (None, 0.0)])
def test_violated_wins_over_inconclusive(learned, ceiling):
    v = run([("loss", bound(eps=3.2))], claimed=3.0, learned=learned, ceiling=ceiling)
    assert v.status == "violated" and v.exit_code == 1


def test_the_reported_violation_is_the_largest_violating_sound_bound():
    bounds = [("a", bound(eps=3.1)), ("b", bound(eps=4.0)), ("c", bound("one_run_fdp", eps=9.0))]
    v = run(bounds, claimed=3.0)
    assert (v.attack, v.epsilon_lower_bound) == ("b", 4.0)


def test_a_claimed_curve_violation_says_what_it_shows():
    """The family test rejects the claimed trade-off curve; its epsilon is the claimed
    family's at delta, so the reason does not say the run fails (epsilon, delta)-DP there."""
    family = dataclasses.replace(bound("one_run", eps=3.4), method="claimed_curve", sound=True)
    v = run([("loss", family)], claimed=3.0)
    assert v.status == "violated" and "trade-off curve its accountant claims" in v.reason
    assert "-DP as claimed" not in v.reason
    assert "is not (3.000, 1e-05)-DP as claimed" in run([("loss", bound(eps=3.4))], claimed=3.0).reason


# ------------------------------------------------------------- non-sound bounds
def test_non_sound_bounds_never_decide():
    estimates = [("loss", bound("one_run_fdp", eps=9.0)), ("loss", bound("gdp", eps=12.0))]
    v = run(estimates, claimed=3.0)
    assert v.status == "inconclusive" and v.epsilon_lower_bound is None and v.method is None
    assert "no sound bound" in v.reason.lower()
    v = run([*estimates, ("zlib", bound(eps=1.0))], claimed=3.0)
    assert v.status == "consistent"
    assert (v.method, v.attack, v.epsilon_lower_bound) == ("one_run", "zlib", 1.0)
    assert v.significance == pytest.approx(0.05)  # only sound bounds enter the union bound


def test_a_bound_marked_sound_decides_whatever_its_name():
    b = dataclasses.replace(bound("one_run_fdp", eps=9.0), sound=True)
    assert run([("loss", b)], claimed=3.0).status == "violated"


# ----------------------------------------------------------------- accountant
def test_the_accountant_is_asked_at_each_bound_own_delta():
    calls = []

    def accountant(delta):
        calls.append(delta)
        return {1e-5: 3.0, 1e-3: 1.0}[delta]

    bounds = [("loss", bound(eps=2.0, delta=1e-5)), ("zlib", bound(eps=1.5, delta=1e-3))]
    # The claimed epsilon (3.0, at 1e-5) alone is not violated ...
    assert run(bounds, claimed=3.0).status == "consistent"
    # ... but the accountant's epsilon at 1e-3 (1.0) is.
    v = run(bounds, claimed=3.0, accountant=accountant)
    assert sorted(calls) == [1e-5, 1e-3]
    assert v.status == "violated" and (v.attack, v.delta, v.claimed_epsilon) == ("zlib", 1e-3, 1.0)
    assert "accountant's epsilon 1.000" in v.reason and "delta=0.001" in v.reason


def test_the_accountant_sets_the_claim_compared_with_the_ceiling():
    bounds = [("loss", bound(eps=1.0, delta=1e-3))]
    v = run(bounds, claimed=3.0, accountant=lambda d: 6.0, ceiling=5.0)
    assert v.status == "inconclusive" and v.claimed_epsilon == 6.0
    v = run(bounds, claimed=6.0, accountant=lambda d: 3.0, ceiling=5.0)
    assert v.status == "consistent" and v.claimed_epsilon == 3.0


# --------------------------------------------------------------- inconclusive
def test_a_model_that_learned_nothing_is_inconclusive():
    v = run([("loss", bound(eps=0.0))], claimed=3.0, learned=False, ceiling=10.0)
    assert v.status == "inconclusive" and v.exit_code == 3
    for phrase in ("learned nothing", "initialisation", "cannot see a violation", "train a model that learns"):
        assert phrase in v.reason
    # a sound bound above 0 shows that the canaries moved the model, whatever its loss did
    v = run([("loss", bound(eps=0.1))], claimed=3.0, learned=False, ceiling=10.0)
    assert v.status == "consistent" and v.epsilon_lower_bound == 0.1


@pytest.mark.parametrize("ceiling", [2.5, 3.0])
def test_a_ceiling_at_or_below_the_claim_is_inconclusive(ceiling):
    v = run([("loss", bound(eps=0.5, m=100))], claimed=3.0, ceiling=ceiling)
    assert v.status == "inconclusive" and v.exit_code == 3
    assert f"{ceiling:.3f} <= the claimed epsilon 3.000" in v.reason
    assert "every guess of its strongest test right" in v.reason and "add canaries" in v.reason
    assert v.ceiling == ceiling and v.epsilon_lower_bound == 0.5


def test_learned_unknown_and_no_ceiling_do_not_block_consistent():
    assert run([("loss", bound(eps=0.5))], claimed=3.0, learned=None, ceiling=None).status == "consistent"


# ----------------------------------------------------------------- consistent
def test_consistent_gives_the_bound_and_the_ceiling_and_is_not_a_proof():
    bounds = [("loss", bound(eps=0.7)), ("zlib", bound(eps=1.2)), ("ref", bound("one_run_fdp", eps=2.9))]
    v = run(bounds, claimed=3.0, ceiling=4.25)
    assert v.status == "consistent" and v.exit_code == 0
    assert (v.attack, v.method, v.epsilon_lower_bound) == ("zlib", "one_run", 1.2)  # largest sound one
    for phrase in ("1.200", "audit's ceiling of 4.250 (every guess of its strongest test right)", "3.000",
                   "not a proof of privacy"):
        assert phrase in v.reason
    assert (v.num_canaries, v.num_guesses, v.num_correct, v.delta) == (1000, 100, 95, DELTA)


# ------------------------------------------------------------------- the object
def test_verdict_is_frozen_plain_json_with_its_exit_code():
    v = run([("loss", bound(eps=0.7))], claimed=3.0, ceiling=math.inf)
    blob = json.loads(json.dumps(v.to_dict(), allow_nan=False))
    assert set(blob) == {f.name for f in dataclasses.fields(Verdict)} | {"exit_code"}
    assert blob["ceiling"] is None and blob["exit_code"] == 0 and blob["status"] == "consistent"
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.status = "violated"
    assert str(v).startswith("consistent: ")
    with pytest.raises(InputError):
        dataclasses.replace(v, status="fine")


def test_end_to_end_with_canary_scores_and_the_ceiling():
    m = 1000
    cs = CanaryScores(in_scores=np.arange(m // 2) + 10.0, out_scores=-np.arange(m // 2) - 1.0)
    ceiling = one_run_ceiling(method="one_run", num_canaries=m, delta=DELTA, significance=0.05)
    bounds = [("loss", cs.bound(name, delta=DELTA)) for name in ("one_run", "one_run_fdp")]
    assert run(bounds, claimed=8.0, ceiling=ceiling).status == "inconclusive"  # 5.23 < 8
    assert run(bounds, claimed=4.0, ceiling=ceiling).status == "violated"
    v = run(bounds, claimed=6.0, ceiling=ceiling)
    assert v.status == "inconclusive" and v.epsilon_lower_bound == pytest.approx(ceiling)  # fdp (9.4) ignored


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bounds": "loss"},
        {"bounds": [("loss",)]},
        {"bounds": [(1, bound())]},
        {"bounds": [("loss", 2.0)]},
        {"claimed_epsilon": -1.0},
        {"claimed_epsilon": math.nan},
        {"claimed_epsilon": "3"},
        {"accountant_epsilon": 3.0},
        {"accountant_epsilon": lambda d: math.nan},
        {"ceiling": math.nan},
        {"learned": 1},
    ],
)
def test_bad_inputs_are_input_errors(kwargs):
    base = dict(bounds=[("loss", bound())], claimed_epsilon=3.0, accountant_epsilon=None, ceiling=5.0, learned=True)
    with pytest.raises(InputError):
        decide(**{**base, **kwargs})
