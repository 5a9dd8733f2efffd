"""Per-group statistics (issue 29) against naive loops, and the coverage of their bootstrap
intervals over units in a simulation of clustered records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpaudit.audit import metrics
from dpaudit.audit.groups import (
    UnitClipping,
    by_unit,
    clipping,
    membership,
    perplexity_ratio,
    ratio_estimate,
)
from dpaudit.errors import InputError


def _records(rng, num_units: int, *, mean_nll: float, unit_sd: float = 0.3):
    """Clustered records: each unit has 1-5 records sharing a unit effect; per-record NLL sum
    and token count."""
    units, nll, tokens = [], [], []
    for u in range(num_units):
        effect = rng.normal(0, unit_sd)
        for _ in range(rng.integers(1, 6)):
            t = int(rng.integers(20, 60))
            units.append(f"u{u}")
            tokens.append(t)
            nll.append(t * (mean_nll + effect + rng.normal(0, 0.2)))
    return units, np.array(nll), np.array(tokens, dtype=float)


def test_by_unit_and_perplexity_match_a_naive_loop():
    rng = np.random.default_rng(1)
    units, nll, tokens = _records(rng, 12, mean_nll=1.5)
    keys, (a, b) = by_unit(units, nll, tokens)
    naive = {}
    for u, x, t in zip(units, nll, tokens):
        s = naive.setdefault(u, [0.0, 0.0])
        s[0] += x
        s[1] += t
    assert keys == list(naive)
    assert a == pytest.approx([v[0] for v in naive.values()])
    assert b == pytest.approx([v[1] for v in naive.values()])
    est = ratio_estimate(a, b, transform=np.exp, num_samples=200)
    assert est.value == pytest.approx(math.exp(sum(nll) / sum(tokens)))
    assert est.low < est.value < est.high and est.units == 12


def test_membership_per_group_matches_the_metrics_of_its_records():
    rng = np.random.default_rng(2)
    n = 400
    units = [f"p{i // 3}" for i in range(n)]
    member = np.array([(i // 3) % 2 == 0 for i in range(n)])
    scores = rng.normal(0, 1, n) + 0.8 * member
    group = np.array(["rare" if (i // 3) % 10 == 0 else "common" for i in range(n)])
    for g in ("rare", "common"):
        rows = group == g
        m = membership(scores[rows], member[rows], [u for u, r in zip(units, rows) if r], num_samples=100)
        # the naive loop: the group's records alone, through the toolkit's one AUC
        ins = [s for s, r, k in zip(scores, rows, member) if r and k]
        outs = [s for s, r, k in zip(scores, rows, member) if r and not k]
        assert m["num_in"] == len(ins) and m["num_out"] == len(outs)
        assert m["units_in"] == len({u for u, r, k in zip(units, rows, member) if r and k})
        if g == "rare":  # 14 units: 7 a side, fewer than MIN_UNITS
            assert m["auc"].value is None and "not enough units" in m["auc"].note
            assert m["tpr_at_fpr"][0.01].value is None
        else:
            assert m["auc"].value == pytest.approx(metrics.auc(in_scores=ins, out_scores=outs))
            assert m["auc"].low < m["auc"].value < m["auc"].high
            tpr = m["tpr_at_fpr"][0.01]
            if len(outs) < metrics.required_nonmembers(0.01):
                assert tpr.value is None and "not enough non-members" in tpr.note
            else:
                assert tpr.value == metrics.tpr_at_fpr(in_scores=ins, out_scores=outs, fpr=0.01).value


def test_clipping_matches_a_naive_loop():
    rng = np.random.default_rng(3)
    ids = np.array([f"p{i % 7}" for i in range(30)])  # notes of 7 patients
    sampled = rng.integers(0, 6, 30)
    clipped = np.array([rng.integers(0, s + 1) for s in sampled])
    norms = sampled * rng.uniform(0.2, 3.0, 30)
    rec = UnitClipping(unit_ids=ids, sampled=sampled, clipped=clipped, norm_sum=norms, max_grad_norm=1.0)
    keep = {"p0", "p3", "p5"}
    c = clipping(rec, lambda u: u in keep, num_samples=50)
    rows = [i for i in range(30) if ids[i] in keep and sampled[i] > 0]
    assert c["sampled"] == sum(sampled[i] for i in rows)
    assert c["units"] == len({ids[i] for i in rows})
    assert c["clipped_share"].value == pytest.approx(sum(clipped[i] for i in rows) / c["sampled"])
    assert c["mean_norm"].value == pytest.approx(sum(norms[i] for i in rows) / c["sampled"])


def test_unit_clipping_refuses_impossible_counts():
    with pytest.raises(InputError, match="clipped more often"):
        UnitClipping(unit_ids=["a"], sampled=[1], clipped=[2], norm_sum=[1.0], max_grad_norm=1.0)


def test_cluster_bootstrap_needs_both_sides_and_one_unit_per_score():
    with pytest.raises(InputError, match="go together"):
        metrics.bootstrap_ci(in_scores=[1.0, 2.0], out_scores=[0.0], in_units=["a", "b"])
    with pytest.raises(InputError, match="one unit per score"):
        metrics.bootstrap_ci(in_scores=[1.0, 2.0], out_scores=[0.0], in_units=["a"], out_units=["b"])


# --------------------------------------------------------------------------- coverage


def _coverage(hits: list[bool], nominal: float, trials: int) -> None:
    """The observed coverage is within three binomial standard errors of the nominal one,
    minus a small allowance for the percentile bootstrap's known undercoverage at small n."""
    rate = float(np.mean(hits))
    se = math.sqrt(nominal * (1 - nominal) / trials)
    assert nominal - 3 * se - 0.03 <= rate <= nominal + 3 * se, rate


def test_perplexity_intervals_have_their_stated_coverage():
    """Clustered records whose true perplexity is known (the population ratio of sums, computed
    on a very large draw): the 90% intervals over 40 units cover it about 90% of the time."""
    rng = np.random.default_rng(7)
    _, big_nll, big_tok = _records(np.random.default_rng(99), 40000, mean_nll=1.5)
    truth = math.exp(big_nll.sum() / big_tok.sum())
    trials, hits = 300, []
    for t in range(trials):
        units, nll, tokens = _records(rng, 40, mean_nll=1.5)
        _, (a, b) = by_unit(units, nll, tokens)
        est = ratio_estimate(a, b, transform=np.exp, confidence=0.9, num_samples=400, seed=t)
        hits.append(est.low <= truth <= est.high)
    print("coverage", np.mean(hits))
    _coverage(hits, 0.9, trials)


def test_perplexity_ratio_intervals_have_their_stated_coverage():
    rng = np.random.default_rng(8)
    truths = []
    for mean in (2.0, 1.5):
        _, n, k = _records(np.random.default_rng(98), 40000, mean_nll=mean)
        truths.append(n.sum() / k.sum())
    truth = math.exp(truths[0] - truths[1])
    trials, hits = 300, []
    for t in range(trials):
        a = by_unit(*_records(rng, 20, mean_nll=2.0))[1]
        b = by_unit(*_records(rng, 60, mean_nll=1.5))[1]
        est = perplexity_ratio(*a, *b, confidence=0.9, num_samples=400, seed=t)
        hits.append(est.low <= truth <= est.high)
    print("coverage", np.mean(hits))
    _coverage(hits, 0.9, trials)


def test_cluster_auc_intervals_have_their_stated_coverage():
    """Scores of 30 member and 30 held-out units (1-5 records each, a shared unit effect): the
    cluster bootstrap's 90% AUC interval covers the population AUC about 90% of the time; the
    record bootstrap, which treats a unit's records as independent, covers it less often."""
    def draw(rng, units, shift):
        out, ids = [], []
        for u in range(units):
            effect = rng.normal(shift, 1.0)
            for _ in range(rng.integers(1, 6)):
                out.append(effect + rng.normal(0, 0.5))
                ids.append(u)
        return np.array(out), ids

    big = np.random.default_rng(97)
    truth = metrics.auc(in_scores=draw(big, 4000, 0.5)[0], out_scores=draw(big, 4000, 0.0)[0])
    rng = np.random.default_rng(9)
    trials, cluster, plain = 150, [], []
    for t in range(trials):
        ins, iu = draw(rng, 30, 0.5)
        outs, ou = draw(rng, 30, 0.0)
        ci = metrics.bootstrap_ci(in_scores=ins, out_scores=outs, in_units=iu, out_units=ou, confidence=0.9,
                                  num_samples=150, seed=t)
        cluster.append(ci.low <= truth <= ci.high)
        ci = metrics.bootstrap_ci(in_scores=ins, out_scores=outs, confidence=0.9, num_samples=150, seed=t)
        plain.append(ci.low <= truth <= ci.high)
    print("coverage: cluster", np.mean(cluster), "records", np.mean(plain))
    _coverage(cluster, 0.9, trials)
    assert np.mean(plain) < np.mean(cluster)
