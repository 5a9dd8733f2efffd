"""Applying a strategy: the pairs and thresholds each strategy says to test, the chooser,
the ranking (against a naive count), and the ceilings' list of possible pairs."""

import numpy as np
import pytest

from dpaudit.audit import DEFAULT_FPR_GRID, DEFAULT_GUESS_FRACTIONS, BonferroniStrategy, SplitStrategy
from dpaudit.audit.selection import Ranking, possible_guess_pairs, select_guesses, select_threshold
from dpaudit.audit.strategy import (
    DEFAULT_SPLIT_GUESS_FRACTIONS,
    distinct_guess_pairs,
    fpr_level_count,
    one_run_guess_counts,
)
from dpaudit.errors import InputError

SIG = 0.05


def scores(m=300, mu=1.5, seed=0, ties=True):
    """(scores, is_member) in canary order; rounded to 0.1 (many ties) unless ``ties`` is False."""
    rng = np.random.default_rng(seed)
    member = rng.random(m) < 0.5
    s = rng.normal(mu * member, 1.0)
    return (np.round(s, 1) if ties else s), member


def never_called(*args):
    raise AssertionError(f"the chooser was called with {args}")


@pytest.mark.parametrize("ties", ["across", "within", "none"])
def test_ranking_counts_match_a_naive_count(ties):
    """Ties between members and non-members (broken by the key), ties within one side only
    (perfect scores: any order counts the same), no ties."""
    rng = np.random.default_rng(1)
    member = rng.random(60) < 0.5
    s = {"across": rng.integers(0, 5, 60).astype(float), "within": member + rng.integers(0, 2, 60) * 2.0,
         "none": rng.normal(size=60)}[ties]
    keys = rng.random(60)
    ranking = Ranking(s, member, keys)
    order = sorted(range(60), key=lambda i: (s[i], keys[i]))  # ascending; ties by the key
    for kp, km in [(0, 0), (5, 0), (0, 7), (13, 20), (30, 30), (60, 0)]:
        top, bottom = order[60 - kp :], order[:km]
        assert ranking.correct(kp, km) == sum(member[i] for i in top) + sum(not member[i] for i in bottom)
    with pytest.raises(InputError):
        ranking.correct(31, 30)


def test_ranking_without_keys_counts_ties_against_the_guesser():
    """Without keys (the canaries' order unknown) a tie between a member and a non-member
    counts as few correct guesses as any order could: never more than with keys."""
    rng = np.random.default_rng(2)
    member = rng.random(80) < 0.5
    s = rng.integers(0, 4, 80).astype(float)
    worst = Ranking(s, member)
    order = sorted(range(80), key=lambda i: (s[i], not member[i]))  # members lowest within a tie
    for kp, km in [(0, 0), (5, 0), (0, 7), (13, 20), (30, 30), (80, 0), (0, 80)]:
        top, bottom = order[80 - kp :], order[:km]
        assert worst.correct(kp, km) == sum(member[i] for i in top) + sum(not member[i] for i in bottom)
        assert all(worst.correct(kp, km) <= Ranking(s, member, rng.random(80)).correct(kp, km) for _ in range(20))
    everyone_tied = Ranking(np.zeros(80), member)
    assert everyone_tied.correct(40, 0) == max(0, 40 - int((~member).sum()))


def test_a_split_needs_the_canaries_order():
    """Without the canaries' own order (the two arrays: members first) a split of positions
    would follow membership, so it is refused; with it, the parts depend on the seed alone."""
    s, member = scores(m=200)
    kwargs = dict(scores=s, member=member, significance=SIG, chooser=lambda *a: 0.0, chooser_name="x")
    with pytest.raises(InputError, match="own order"):
        select_guesses(SplitStrategy(seed=1), tie_keys=None, **kwargs)
    keys = np.random.default_rng(0).random(200)
    a = select_guesses(SplitStrategy(seed=1), tie_keys=keys, **kwargs)
    b = select_guesses(SplitStrategy(seed=1), tie_keys=keys, **{**kwargs, "member": ~member})
    assert a.ranking.m == b.ranking.m == 100
    assert a.ranking.correct(50, 0) + b.ranking.correct(50, 0) == 50  # the same canaries, labels flipped


def test_bonferroni_tests_every_distinct_pair_and_never_chooses():
    s, member = scores()
    sel = select_guesses(BonferroniStrategy(), scores=s, member=member, tie_keys=None,
                         significance=SIG, chooser=never_called, chooser_name="epsilon")
    pairs = distinct_guess_pairs(DEFAULT_GUESS_FRACTIONS, 300)
    assert list(sel.pairs) == pairs and sel.ranking.m == 300
    assert sel.significance_per_test == SIG / len(pairs)
    assert sel.details == {"num_candidates": len(pairs)} and sel.lists_candidates


def test_split_chooses_on_the_choosing_part_with_the_chooser_given():
    s, member = scores(ties=False)
    calls = []

    def chooser(m, r, v, significance):
        calls.append((m, r, v, significance))
        return -abs(r - 60)  # prefers 60 guesses: the 0.5 candidate on the 120 choosing canaries

    strategy = SplitStrategy(fraction=0.4, seed=5)
    sel = select_guesses(strategy, scores=s, member=member, tie_keys=np.random.default_rng(3).random(300),
                         significance=SIG, chooser=chooser, chooser_name="proxy")
    assert {c[0] for c in calls} == {120} and {c[3] for c in calls} == {SIG}
    assert [c[1] for c in calls] == [sum(one_run_guess_counts(g, 120)) for g in DEFAULT_SPLIT_GUESS_FRACTIONS]
    assert sel.details["chosen_candidate"] == 0.5 and sel.details["selection_proxy"] == 0
    assert sel.details["selection_num_canaries"] == 120 and not sel.lists_candidates
    assert sel.ranking.m == 180 and sel.pairs == (one_run_guess_counts(0.5, 180),)
    assert sel.significance_per_test == SIG


@pytest.mark.parametrize("strategy", [BonferroniStrategy(), SplitStrategy(fraction=0.3, seed=2),
                                      SplitStrategy(grid=(0.001, (0.2, 0.0), 0.9))])
def test_the_ceilings_consider_every_pair_the_strategy_might_test(strategy):
    s, member = scores(m=101, ties=False)
    keys = np.random.default_rng(0).random(101)
    grid = strategy.grid or (DEFAULT_GUESS_FRACTIONS if isinstance(strategy, BonferroniStrategy)
                             else DEFAULT_SPLIT_GUESS_FRACTIONS)
    m_ev, possible, per_test = possible_guess_pairs(strategy, num_canaries=101, significance=SIG)
    for favourite in grid:  # a chooser that picks each candidate in turn
        def chooser(m, r, v, significance, favourite=favourite):
            return float(r == sum(one_run_guess_counts(favourite, m)))

        sel = select_guesses(strategy, scores=s, member=member, tie_keys=keys, significance=SIG,
                             chooser=chooser, chooser_name="x")
        assert sel.ranking.m == m_ev and sel.significance_per_test == per_test
        assert set(sel.pairs) <= set(possible)


def test_threshold_strategies():
    s, member = scores()
    ins, outs = s[member], s[~member]
    sel = select_threshold(BonferroniStrategy(), in_scores=ins, out_scores=outs, significance=SIG,
                           chooser=never_called, chooser_name="epsilon")
    js = [c["j"] for c in sel.candidates]
    assert js == sorted({fpr_level_count(a, outs.size) for a in DEFAULT_FPR_GRID})
    assert all(c["fp"] == c["j"] for c in sel.candidates)
    assert sel.details["num_candidates"] == len(js)
    assert sel.num_canaries == 300 and sel.significance_per_test == SIG / len(js)

    seen = []

    def chooser(tp, fp, tn, fn, significance):
        seen.append(tp + fp + tn + fn)
        return tp - 2 * fp

    sel = select_threshold(SplitStrategy(seed=4), in_scores=ins, out_scores=outs, significance=SIG,
                           chooser=chooser, chooser_name="epsilon")
    (c,) = sel.candidates
    assert set(seen) == {sel.details["selection_num_canaries"]} and sel.num_canaries == 300 - seen[0]
    assert c["tp"] + c["fn"] + c["fp"] + c["tn"] == sel.num_canaries and not sel.lists_candidates


def test_unknown_strategies_are_refused():
    s, member = scores()
    ins, outs = s[member], s[~member]
    with pytest.raises(InputError, match="BonferroniStrategy or a SplitStrategy"):
        select_guesses("split", scores=s, member=member, tie_keys=None, significance=SIG,
                       chooser=never_called, chooser_name="x")
    with pytest.raises(InputError, match="BonferroniStrategy or a SplitStrategy"):
        select_threshold(None, in_scores=ins, out_scores=outs, significance=SIG, chooser=never_called,
                         chooser_name="x")
    with pytest.raises(InputError, match="BonferroniStrategy or a SplitStrategy"):
        possible_guess_pairs(0.5, num_canaries=10, significance=SIG)
