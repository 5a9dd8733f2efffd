"""The ceilings table and one_run_ceiling: reproducible, consistent with the bounds, in sync with the docs."""

from pathlib import Path

import numpy as np
import pytest

from dpaudit.audit import (
    DEFAULT_GUESS_FRACTIONS,
    BonferroniStrategy,
    CanaryScores,
    SplitStrategy,
    ceiling_table,
    epsilon_one_run,
    epsilon_one_run_fdp,
    format_ceiling_table,
    one_run_ceiling,
)
from dpaudit.audit.strategy import DEFAULT_SPLIT_GUESS_FRACTIONS
from dpaudit.errors import InputError

DOC = Path(__file__).resolve().parents[2] / "docs" / "ceilings.md"


@pytest.fixture(scope="module")
def rows():
    return ceiling_table(ms=(100, 1000, 10_000), delta=1e-5, significance=0.05)


def test_ceilings_grow_with_m_and_default_strategy_costs_a_little(rows):
    for a, b in zip(rows, rows[1:]):
        for field in ("one_run", "one_run_fdp", "clopper_pearson", "gdp"):
            assert getattr(a, field) < getattr(b, field)
    for r in rows:
        assert r.one_run_default < r.one_run < r.one_run_fdp
        assert r.one_run_fdp_default < r.one_run_fdp
        assert r.clopper_pearson_default < r.clopper_pearson
        assert r.gdp_default < r.gdp


def test_ceiling_matches_known_value(rows):
    # All m guesses right is the best case; the 3.47 check is r = 100 at m = 1000.
    assert rows[1].one_run_best_guesses == 1000
    assert rows[1].one_run >= epsilon_one_run(num_canaries=1000, num_guesses=100, num_correct=100, delta=1e-5)
    assert rows[0].one_run == pytest.approx(3.49, abs=0.01)


def test_docs_table_is_generated_by_this_code(rows):
    assert format_ceiling_table(rows) in DOC.read_text()


def test_default_ceiling_is_what_canary_scores_reports_on_separated_scores(rows):
    import numpy as np

    from dpaudit.audit import CanaryScores

    m = 100
    one_run = CanaryScores(in_scores=np.arange(m // 2) + 10.0, out_scores=-np.arange(m // 2) - 1.0)
    multi = CanaryScores(in_scores=np.arange(m) + 10.0, out_scores=-np.arange(m) - 1.0)
    assert one_run.epsilon_one_run(delta=1e-5).epsilon == pytest.approx(rows[0].one_run_default)
    assert one_run.epsilon_one_run_fdp(delta=1e-5).epsilon == pytest.approx(rows[0].one_run_fdp_default)
    assert multi.epsilon_clopper_pearson(delta=1e-5).epsilon == pytest.approx(rows[0].clopper_pearson_default)
    assert multi.epsilon_gdp(delta=1e-5).epsilon == pytest.approx(rows[0].gdp_default)


# ------------------------------------------------------------ one_run_ceiling

NAIVE = {"one_run": epsilon_one_run, "one_run_fdp": epsilon_one_run_fdp}


def naive_counts(candidate, m):
    if isinstance(candidate, tuple):
        return round(candidate[0] * m), round(candidate[1] * m)
    k = max(1, round(candidate * m))
    return (k + 1) // 2, k // 2


def naive_ceiling(method, m, delta, significance, strategy):
    """Written from the docstrings: all guesses right, Bonferroni over distinct pairs, or split."""
    fn = NAIVE[method]
    if isinstance(strategy, SplitStrategy):
        m_sel = round(strategy.fraction * m)
        m_ev = m - m_sel
        best = 0.0
        for cand in strategy.grid or DEFAULT_SPLIT_GUESS_FRACTIONS:
            if sum(naive_counts(cand, m_sel)) == 0:
                continue
            r = max(1, sum(naive_counts(cand, m_ev)))
            best = max(best, fn(num_canaries=m_ev, num_guesses=r, num_correct=r, delta=delta,
                                significance=significance))
        return best
    pairs = []
    for cand in strategy.grid or DEFAULT_GUESS_FRACTIONS:
        p = naive_counts(cand, m)
        if sum(p) > 0 and p not in pairs:
            pairs.append(p)
    best = 0.0
    for kp, km in pairs:
        best = max(best, fn(num_canaries=m, num_guesses=kp + km, num_correct=kp + km, delta=delta,
                            significance=significance / len(pairs)))
    return best


STRATEGIES = [
    BonferroniStrategy(),
    BonferroniStrategy(grid=(0.01, 0.05, (0.1, 0.0), (0.02, 0.02))),
    SplitStrategy(),
    SplitStrategy(fraction=0.3, seed=2, grid=(0.05, 0.2, (0.1, 0.05))),
]


@pytest.mark.parametrize("method", ["one_run", "one_run_fdp"])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=["bonf", "bonf-grid", "split", "split-grid"])
@pytest.mark.parametrize("m, delta, significance", [(100, 1e-5, 0.05), (333, 1e-6, 0.01), (1000, 1e-5, 0.05)])
def test_one_run_ceiling_matches_a_naive_loop(method, strategy, m, delta, significance):
    got = one_run_ceiling(method=method, num_canaries=m, delta=delta, significance=significance, strategy=strategy)
    assert got == naive_ceiling(method, m, delta, significance, strategy)


def test_default_ceiling_is_the_table_default_column(rows):
    for r in rows[:2]:
        assert one_run_ceiling(method="one_run", num_canaries=r.m, delta=1e-5, significance=0.05) == r.one_run_default
        assert one_run_ceiling(method="one_run_fdp", num_canaries=r.m, delta=1e-5, significance=0.05) == (
            r.one_run_fdp_default
        )


def separated_with_balanced_split(m, fraction, n_in=None):
    """Perfectly separated scores (members above non-members) whose SplitStrategy split is
    balanced on both parts, so that every guess of every candidate is right; and that strategy."""
    n_in = (m + 1) // 2 if n_in is None else n_in
    n_sel = round(fraction * m)
    for seed in range(10_000):
        sel = np.random.default_rng(seed).permutation(m)[:n_sel]
        members_sel = int(np.sum(sel < n_in))  # canary order: the members first
        if members_sel == (n_sel + 1) // 2 and n_in - members_sel == (m - n_sel + 1) // 2:
            break
    else:  # pragma: no cover
        raise AssertionError("no balanced split found")
    scores = np.r_[np.arange(n_in) + 10.0, -np.arange(m - n_in) - 1.0]
    return CanaryScores.from_labels(scores=scores, is_member=scores > 0), SplitStrategy(fraction=fraction, seed=seed)


@pytest.mark.parametrize("method", ["one_run", "one_run_fdp"])
@pytest.mark.parametrize("m", [100, 57, 1000])
def test_one_run_ceiling_is_what_separated_scores_report(method, m):
    # Bonferroni: balanced separated scores get every guess right at every candidate.
    scores = np.r_[np.arange((m + 1) // 2) + 10.0, -np.arange(m // 2) - 1.0]
    cs = CanaryScores.from_labels(scores=scores, is_member=scores > 0)
    for strategy in (None, BonferroniStrategy(grid=(0.02, (0.1, 0.3), 0.5))):
        want = cs.bound(method, delta=1e-5, significance=0.05, strategy=strategy).epsilon
        assert one_run_ceiling(method=method, num_canaries=m, delta=1e-5, significance=0.05,
                               strategy=strategy) == want
    # Split: the evaluating part only, at the full significance.
    for fraction in (0.5, 0.3):
        cs, strategy = separated_with_balanced_split(m, fraction)
        res = cs.bound(method, delta=1e-5, significance=0.05, strategy=strategy)
        assert res.num_correct == res.num_guesses  # the premise: all guesses right
        got = one_run_ceiling(method=method, num_canaries=m, delta=1e-5, significance=0.05, strategy=strategy)
        assert got == res.epsilon
        assert res.num_canaries == m - round(fraction * m)


def test_split_ceiling_bounds_what_any_split_reports():
    # With the default split grid an unbalanced split loses some guesses; never above the ceiling.
    scores = np.r_[np.arange(50) + 10.0, -np.arange(50) - 1.0]
    cs = CanaryScores.from_labels(scores=scores, is_member=scores > 0)
    for seed in range(5):
        s = SplitStrategy(seed=seed)
        ceiling = one_run_ceiling(method="one_run", num_canaries=100, delta=1e-5, significance=0.05, strategy=s)
        assert cs.bound("one_run", delta=1e-5, strategy=s).epsilon <= ceiling


def test_one_run_ceiling_validation():
    with pytest.raises(InputError, match="threshold"):
        one_run_ceiling(method="clopper_pearson", num_canaries=100, delta=1e-5, significance=0.05)
    with pytest.raises(InputError, match="unknown bound"):
        one_run_ceiling(method="nope", num_canaries=100, delta=1e-5, significance=0.05)
    with pytest.raises(InputError):
        one_run_ceiling(method="one_run", num_canaries=0, delta=1e-5, significance=0.05)
    with pytest.raises(InputError):
        one_run_ceiling(method="one_run", num_canaries=100, delta=1e-5, significance=1.5)
    with pytest.raises(InputError, match="leaves a part empty"):
        one_run_ceiling(method="one_run", num_canaries=1, delta=1e-5, significance=0.05, strategy=SplitStrategy())
    with pytest.raises(InputError, match="strategy"):
        one_run_ceiling(method="one_run", num_canaries=100, delta=1e-5, significance=0.05, strategy="bonferroni")
