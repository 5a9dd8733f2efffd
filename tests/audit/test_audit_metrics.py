"""Metrics: fast code against naive loops, ties, the "not enough non-members" rule."""

import json
import math

import numpy as np
import pytest

from dpaudit.audit import (
    CanaryScores,
    auc,
    balanced_accuracy,
    bootstrap_ci,
    required_nonmembers,
    roc_curve,
    tpr_at_fpr,
)
from dpaudit.errors import InputError


# ------------------------------------------------------------------ naive references
def naive_auc(ins, outs):
    total = 0.0
    for a in ins:
        for b in outs:
            total += 1.0 if a > b else 0.5 if a == b else 0.0
    return total / (len(ins) * len(outs))


def naive_points(ins, outs):
    """(fpr, tpr, threshold) for every threshold t in {+inf} U scores, rule score >= t."""
    pts = [(0.0, 0.0, math.inf)]
    for t in sorted(set(ins) | set(outs), reverse=True):
        tpr = sum(1 for a in ins if a >= t) / len(ins)
        fpr = sum(1 for b in outs if b >= t) / len(outs)
        pts.append((fpr, tpr, t))
    return pts


def naive_tpr_at_fpr(ins, outs, a):
    return max(tpr for fpr, tpr, _ in naive_points(ins, outs) if fpr <= a + 1e-12)


def naive_balanced_accuracy(ins, outs):
    return max((tpr + 1 - fpr) / 2 for fpr, tpr, _ in naive_points(ins, outs))


def _scores(seed, n_in, n_out, mu=1.0, rounding=None):
    rng = np.random.default_rng(seed)
    ins, outs = rng.normal(mu, 1, n_in), rng.normal(0, 1, n_out)
    if rounding is not None:  # create many ties
        ins, outs = np.round(ins, rounding), np.round(outs, rounding)
    return ins, outs


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("seed,rounding", [(0, None), (1, 1), (2, 0)])
def test_roc_and_auc_match_naive(seed, rounding):
    ins, outs = _scores(seed, 37, 53, rounding=rounding)
    roc = roc_curve(in_scores=ins, out_scores=outs)
    naive = naive_points(list(ins), list(outs))
    assert len(roc.fpr) == len(naive)
    np.testing.assert_allclose(roc.fpr, [p[0] for p in naive])
    np.testing.assert_allclose(roc.tpr, [p[1] for p in naive])
    np.testing.assert_array_equal(roc.thresholds, [p[2] for p in naive])
    assert auc(in_scores=ins, out_scores=outs) == pytest.approx(naive_auc(ins, outs), abs=1e-12)
    # AUC is also the trapezoid area under the ROC points.
    assert auc(in_scores=ins, out_scores=outs) == pytest.approx(np.trapezoid(roc.tpr, roc.fpr), abs=1e-12)
    assert balanced_accuracy(in_scores=ins, out_scores=outs) == pytest.approx(naive_balanced_accuracy(ins, outs))


def test_auc_agrees_with_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    ins, outs = _scores(3, 200, 300, rounding=1)
    y = np.r_[np.ones(ins.size), np.zeros(outs.size)]
    assert auc(in_scores=ins, out_scores=outs) == pytest.approx(sk.roc_auc_score(y, np.r_[ins, outs]), abs=1e-12)


def test_perfectly_separable_scores():
    cs = CanaryScores(in_scores=[5.0, 6.0, 7.0], out_scores=[1.0, 2.0, 3.0])
    assert cs.auc() == 1.0
    assert cs.balanced_accuracy() == 1.0
    assert roc_curve(in_scores=[1, 2], out_scores=[-1, 0]).tpr[1] == 0.5


def test_all_ties_give_chance():
    cs = CanaryScores(in_scores=np.zeros(50), out_scores=np.zeros(70))
    assert cs.auc() == 0.5
    assert cs.balanced_accuracy() == 0.5
    roc = cs.roc()
    np.testing.assert_array_equal(roc.fpr, [0.0, 1.0])
    np.testing.assert_array_equal(roc.tpr, [0.0, 1.0])


@pytest.mark.parametrize("a", [0.1, 0.05, 0.3])
@pytest.mark.parametrize("rounding", [None, 1])
def test_tpr_at_fpr_matches_naive(a, rounding):
    ins, outs = _scores(4, 120, 200, rounding=rounding)
    got = tpr_at_fpr(in_scores=ins, out_scores=outs, fpr=a)
    assert got.enough
    assert got.value == pytest.approx(naive_tpr_at_fpr(list(ins), list(outs), a))
    # The reported threshold achieves it with FPR <= a.
    thr = -np.inf if got.threshold is None else got.threshold
    assert np.mean(outs >= thr) <= a + 1e-12
    assert np.mean(ins >= thr) == pytest.approx(got.value)


def test_tpr_at_fpr_not_enough_nonmembers_is_never_zero():
    ins, outs = _scores(5, 500, 999)
    got = tpr_at_fpr(in_scores=ins, out_scores=outs, fpr=0.01)
    assert got.value is None and not got.enough
    assert got.required_nonmembers == 1000 and got.num_nonmembers == 999
    assert "not enough non-members" in got.summary()
    assert json.loads(json.dumps(got.to_dict()))["value"] is None
    # Exactly enough: reported (and may legitimately be 0 with a perfect non-member outlier).
    got = tpr_at_fpr(in_scores=[0.0] * 5, out_scores=[10.0] * 11 + [-1.0] * 989, fpr=0.01)
    assert got.enough and got.value == 0.0


def test_required_nonmembers():
    assert required_nonmembers(0.1) == 100
    assert required_nonmembers(0.01) == 1000
    assert required_nonmembers(0.001) == 10000
    assert required_nonmembers(0.03) == 334


def test_summary_prints_not_enough():
    ins, outs = _scores(6, 300, 300)
    text = CanaryScores(in_scores=ins, out_scores=outs).summary()
    assert "TPR@FPR=0.1: " in text and "not enough non-members (have 300, need 1000)" in text
    assert "TPR@FPR=0.01: 0" not in text and "TPR@FPR=0.001: 0" not in text


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    ins, outs = _scores(7, 200, 200)
    a = bootstrap_ci(in_scores=ins, out_scores=outs, metric="auc", num_samples=300, seed=11)
    b = bootstrap_ci(in_scores=ins, out_scores=outs, metric="auc", num_samples=300, seed=11)
    c = bootstrap_ci(in_scores=ins, out_scores=outs, metric="auc", num_samples=300, seed=12)
    assert a == b and a != c
    assert a.low < a.estimate < a.high
    assert a.estimate == pytest.approx(auc(in_scores=ins, out_scores=outs))
    # Roughly the normal-theory width for AUC ~ 0.76 with 200 + 200 scores.
    assert 0.05 < a.high - a.low < 0.15
    cs = CanaryScores(in_scores=ins, out_scores=outs)
    assert cs.bootstrap_ci("balanced_accuracy", num_samples=100, seed=1).low <= cs.balanced_accuracy()
    t = cs.bootstrap_ci("tpr_at_fpr", fpr=0.1, num_samples=100, seed=1)
    assert t.low <= t.estimate <= t.high
    none = cs.bootstrap_ci("tpr_at_fpr", fpr=0.01, num_samples=100, seed=1)
    assert none.low is None and "not enough non-members" in none.summary()
    custom = cs.bootstrap_ci(lambda i, o: float(np.mean(i) - np.mean(o)), num_samples=100, seed=1)
    assert custom.low < custom.estimate < custom.high


@pytest.mark.parametrize(
    "bad",
    [[], [[1.0, 2.0]], [1.0, np.nan], [1.0, np.inf], "abc", ["a", "b"], None],
)
def test_input_validation(bad):
    with pytest.raises(ValueError):
        CanaryScores(in_scores=bad, out_scores=[1.0, 2.0])
    with pytest.raises(InputError):
        auc(in_scores=[1.0], out_scores=bad)


def test_bad_fpr_and_metric():
    cs = CanaryScores(in_scores=[1.0, 2.0], out_scores=[0.0])
    for bad in (0.0, -0.1, 1.5, "x"):
        with pytest.raises(InputError):
            cs.tpr_at_fpr(bad)
    with pytest.raises(InputError):
        cs.bootstrap_ci("nope")
    with pytest.raises(InputError):
        cs.bootstrap_ci("tpr_at_fpr")
    with pytest.raises(InputError):
        cs.bootstrap_ci("auc", num_samples=1)
