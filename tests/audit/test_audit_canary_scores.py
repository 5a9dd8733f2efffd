"""CanaryScores: strategies are applied as documented, results are frozen and JSON-ready."""

import dataclasses
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from dpaudit.audit import (
    DEFAULT_FPR_GRID,
    DEFAULT_GUESS_FRACTIONS,
    BonferroniStrategy,
    BoundResult,
    CanaryScores,
    SplitStrategy,
    epsilon_clopper_pearson,
    epsilon_from_gdp,
    epsilon_one_run,
    epsilon_one_run_fdp,
)
from dpaudit.audit.strategy import one_run_guess_counts
from dpaudit.errors import InputError

DELTA = 1e-5


def gaussian(seed=0, m=600, mu=1.5):
    rng = np.random.default_rng(seed)
    member = rng.random(m) < 0.5
    return CanaryScores.from_labels(scores=rng.normal(mu * member, 1.0), is_member=member, seed=seed)


# ------------------------------------------------------------------ naive references
def naive_one_run_counts(cs, k_plus, k_minus):
    """Rank with the same seeded tie keys (one per canary, in canary order), by a Python sort;
    count correct guesses."""
    scores, member, keys = cs.pooled()
    assert np.array_equal(keys, np.random.default_rng(np.random.SeedSequence(cs.seed, spawn_key=(0x74696573,)))
                          .random(len(scores)))
    order = sorted(range(len(scores)), key=lambda i: (scores[i], keys[i]))
    top, bottom = order[len(order) - k_plus :], order[:k_minus]
    return sum(member[i] for i in top) + sum(not member[i] for i in bottom)


def naive_threshold_counts(cs, a):
    """Threshold = the out score that lets floor(a * n_out) non-members strictly above it."""
    outs = sorted(cs.out_scores)
    j = int(a * len(outs) + 1e-9)
    thr = -np.inf if j >= len(outs) else outs[len(outs) - 1 - j]
    tp = sum(1 for s in cs.in_scores if s > thr)
    return dict(tp=tp, fp=j, tn=len(outs) - j, fn=cs.num_members - tp)


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("method,fn", [("one_run", epsilon_one_run), ("one_run_fdp", epsilon_one_run_fdp)])
def test_bonferroni_one_run_is_max_over_grid_at_corrected_level(method, fn):
    cs = gaussian()
    m = cs.num_canaries
    pairs = []
    for g in DEFAULT_GUESS_FRACTIONS:
        k = max(1, round(g * m))
        if ((k + 1) // 2, k // 2) not in pairs:
            pairs.append(((k + 1) // 2, k // 2))
    sig = 0.05 / len(pairs)
    want = max(
        fn(num_canaries=m, num_guesses=kp + km, num_correct=naive_one_run_counts(cs, kp, km), delta=DELTA,
           significance=sig)
        for kp, km in pairs
    )
    res = cs.bound(method, delta=DELTA)
    assert res.epsilon == pytest.approx(want)
    assert res.details["num_candidates"] == len(pairs)
    assert res.details["significance_per_test"] == pytest.approx(sig)
    assert res.num_guesses == res.details["k_plus"] + res.details["k_minus"]
    assert res.num_correct == naive_one_run_counts(cs, res.details["k_plus"], res.details["k_minus"])
    assert res.strategy["name"] == "bonferroni"
    # Strictly below the uncorrected maximum whenever the grid has more than one candidate.
    uncorrected = max(
        fn(num_canaries=m, num_guesses=kp + km, num_correct=naive_one_run_counts(cs, kp, km), delta=DELTA)
        for kp, km in pairs
    )
    assert res.epsilon < uncorrected


@pytest.mark.parametrize("method,fn", [("clopper_pearson", epsilon_clopper_pearson), ("gdp", epsilon_from_gdp)])
def test_bonferroni_threshold_is_max_over_grid_at_corrected_level(method, fn):
    cs = gaussian(seed=1)
    js = {int(a * cs.num_nonmembers + 1e-9) for a in DEFAULT_FPR_GRID}
    sig = 0.05 / len(js)
    want = max(fn(**naive_threshold_counts(cs, a), delta=DELTA, significance=sig) for a in DEFAULT_FPR_GRID)
    res = cs.bound(method, delta=DELTA)
    assert res.epsilon == pytest.approx(want)
    assert res.details["num_candidates"] == len(js)
    assert res.details["significance_per_test"] == pytest.approx(sig)
    assert {"threshold", "tp", "fp", "tn", "fn"} <= set(res.details)


def test_custom_grid_and_pairs():
    cs = gaussian(seed=2)
    res = cs.epsilon_one_run(delta=DELTA, strategy=BonferroniStrategy(grid=[(0.05, 0.0), (0.0, 0.05)]))
    assert res.details["num_candidates"] == 2
    assert (res.details["k_plus"], res.details["k_minus"]) in [(30, 0), (0, 30)]
    single = cs.epsilon_one_run(delta=DELTA, strategy=BonferroniStrategy(grid=np.array([0.1])))
    kp, km = single.details["k_plus"], single.details["k_minus"]
    assert (kp, km) == (30, 30)
    assert single.epsilon == pytest.approx(
        epsilon_one_run(num_canaries=600, num_guesses=60, num_correct=naive_one_run_counts(cs, 30, 30), delta=DELTA)
    )
    # a pair that the grid accepts (sum <= 1) never asks for more than m guesses, m odd
    assert one_run_guess_counts((0.5, 0.5), 7) == (4, 3) and one_run_guess_counts((0.25, 0.75), 6) == (2, 4)
    seven = CanaryScores(in_scores=np.arange(4) + 10.0, out_scores=np.arange(3) * 1.0)
    assert seven.epsilon_one_run(delta=DELTA, strategy=BonferroniStrategy(grid=((0.5, 0.5),))).num_correct == 7


def test_split_strategy_records_choice_and_is_seeded():
    cs = gaussian(seed=3, m=1000)
    for method in ("clopper_pearson", "gdp", "one_run", "one_run_fdp"):
        a = cs.bound(method, delta=DELTA, strategy=SplitStrategy(fraction=0.5, seed=7))
        b = cs.bound(method, delta=DELTA, strategy=SplitStrategy(fraction=0.5, seed=7))
        assert a == b
        assert a.strategy == {"name": "split", "fraction": 0.5, "seed": 7, "grid": None}
        assert a.num_canaries == 500 and a.details["selection_num_canaries"] == 500
        assert a.significance == a.details["significance_per_test"] == 0.05
        if method.startswith("one_run"):
            assert a.num_guesses == a.details["k_plus"] + a.details["k_minus"] > 0
        else:
            assert "threshold" in a.details
    # The evaluating part is scored at its own size, with the fractions chosen elsewhere.
    r = cs.epsilon_one_run(delta=DELTA, strategy=SplitStrategy(fraction=0.3, seed=1))
    assert r.num_canaries == 700 and r.details["selection_num_canaries"] == 300


def test_split_threshold_bound_uses_fixed_threshold_on_held_out_part():
    cs = gaussian(seed=4, m=800)
    res = cs.epsilon_clopper_pearson(delta=DELTA, strategy=SplitStrategy(seed=5))
    d = res.details
    assert d["tp"] + d["fn"] + d["fp"] + d["tn"] == res.num_canaries
    assert res.epsilon == pytest.approx(
        epsilon_clopper_pearson(tp=d["tp"], fp=d["fp"], tn=d["tn"], fn=d["fn"], delta=DELTA)
    )


def test_results_are_frozen_and_json_ready():
    cs = gaussian(seed=5)
    report = cs.audit(delta=DELTA)
    blob = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert [b["method"] for b in blob["bounds"]] == ["clopper_pearson", "gdp", "one_run", "one_run_fdp", "order_statistics"]
    assert blob["score_convention"] == "higher = member"
    assert [t["fpr"] for t in blob["tpr_at_fpr"]] == [0.1, 0.01, 0.001]
    assert blob["tpr_at_fpr"][2]["value"] is None  # 600 canaries: too few for FPR 0.001
    res = report.bound("one_run")
    assert isinstance(res, BoundResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.epsilon = 99.0
    assert json.loads(json.dumps(res.to_dict()))["epsilon"] == pytest.approx(res.epsilon)
    text = cs.summary(delta=DELTA)
    for phrase in ("AUC", "not enough non-members", "Steinke et al. 2023", "Mahloujifar et al. 2025",
                   "Jagielski et al. 2020", "Nasr et al. 2023", "Bonferroni over"):
        assert phrase in text
    assert cs.to_dict(delta=DELTA) == report.to_dict()


def test_dataframe_view_is_lazy():
    pytest.importorskip("pandas")
    df = gaussian(seed=6).audit(delta=DELTA).to_dataframe()
    assert list(df["method"]) == ["clopper_pearson", "gdp", "one_run", "one_run_fdp", "order_statistics"]


def test_package_imports_neither_torch_nor_pandas():
    code = "import sys, dpaudit.audit; print('torch' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_from_labels_and_validation():
    cs = CanaryScores.from_labels(scores=[1.0, 2.0, 3.0, 4.0], is_member=[0, 1, 0, 1])
    np.testing.assert_array_equal(cs.in_scores, [2.0, 4.0])
    np.testing.assert_array_equal(cs.out_scores, [1.0, 3.0])
    with pytest.raises(ValueError):
        cs.in_scores[0] = 5.0  # read-only
    with pytest.raises(InputError):
        CanaryScores.from_labels(scores=[1.0, 2.0], is_member=[1, 1])
    with pytest.raises(InputError):
        CanaryScores.from_labels(scores=[1.0, 2.0], is_member=[1, 2])
    with pytest.raises(InputError):
        CanaryScores.from_labels(scores=[1.0, 2.0], is_member=[True])
    with pytest.raises(TypeError):
        CanaryScores([1.0], [2.0])  # noqa: keyword-only
    with pytest.raises(InputError):
        CanaryScores(in_scores=[1.0], out_scores=[2.0], seed=1.5)


def test_bad_strategy_and_arguments():
    cs = gaussian(seed=7, m=100)
    with pytest.raises(InputError):
        cs.epsilon_one_run(delta=DELTA, strategy="bonferroni")
    with pytest.raises(InputError):
        cs.bound("nope", delta=DELTA)
    with pytest.raises(ValueError):
        cs.epsilon_gdp(delta=2.0)
    with pytest.raises(InputError):
        cs.epsilon_clopper_pearson(delta=DELTA, strategy=BonferroniStrategy(grid=[1.0]))  # FPR level must be < 1
    for bad in (dict(fraction=0.0), dict(fraction=1.0), dict(seed=None), dict(grid=[])):
        with pytest.raises(InputError):
            SplitStrategy(**bad)
    for bad in ([], [1.5], [(0.1,)], [(0.6, 0.6)], ["a"], 0.1):
        with pytest.raises(InputError):
            BonferroniStrategy(grid=bad)
    tiny = CanaryScores(in_scores=[1.0], out_scores=[0.0])
    with pytest.raises(InputError):
        tiny.epsilon_clopper_pearson(delta=DELTA, strategy=SplitStrategy())


def test_reversed_scores_warn():
    rng = np.random.default_rng(0)
    with pytest.warns(UserWarning, match="higher scores for members"):
        CanaryScores(in_scores=rng.normal(-2, 1, 100), out_scores=rng.normal(0, 1, 100))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CanaryScores(in_scores=rng.normal(0, 1, 100), out_scores=rng.normal(0, 1, 100))


def test_ties_never_follow_the_order_of_the_arrays():
    """Ties between members and non-members: keys per canary break them when the canaries'
    order is known (about half of 200 guesses right whatever the seed, sd 7); with the two
    arrays, whose order says who is a member, they count against the guesser."""
    member = np.random.default_rng(0).random(400) < 0.5
    for seed in range(5):
        cs = CanaryScores.from_labels(scores=np.zeros(400), is_member=member, seed=seed)
        res = cs.epsilon_one_run(delta=DELTA, strategy=BonferroniStrategy(grid=[0.5]))
        assert res.num_guesses == 200 and 70 <= res.num_correct <= 130
        assert res.details["tie_break_seed"] == seed
        cs = CanaryScores(in_scores=np.zeros(200), out_scores=np.zeros(200), seed=seed)
        res = cs.epsilon_one_run(delta=DELTA, strategy=BonferroniStrategy(grid=[0.5]))
        assert res.num_guesses == 200 and res.num_correct == 0 and res.details["tie_break_seed"] is None
