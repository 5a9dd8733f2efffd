"""Applying a strategy: which guesses (one-run) or thresholds (threshold family) are tested.

One function per family of bound, each taking a frozen strategy object
(:class:`~dpaudit.audit.strategy.BonferroniStrategy` or
:class:`~dpaudit.audit.strategy.SplitStrategy`) and the canaries' scores:

* :func:`select_guesses` -- one-run bounds (Steinke et al. 2023, arXiv 2305.08846;
  Mahloujifar et al. 2025, arXiv 2410.22235) and the claimed-curve test. The canaries are
  ranked by score (:class:`Ranking`: ties by keys drawn per canary, or against the guesser);
  a guess pair (k+, k-) guesses "in" for the k+ highest and "out" for the k- lowest.
* :func:`select_threshold` -- threshold bounds (Jagielski et al. 2020, arXiv 2006.07709;
  Nasr et al. 2023, arXiv 2302.07956): "member" iff score > threshold.

Bonferroni returns every distinct candidate of the grid, to be tested on all canaries at
``significance / G``. Split chooses one candidate on a random part of the canaries with
the caller's ``chooser`` (the bound itself, or a fast proxy of it) and returns it, to be
tested once at the full significance on the rest. Either way the caller tests what is
returned and reports the best: the selection is corrected for, never the uncorrected
maximum over thresholds.

:func:`possible_guess_pairs` gives every pair a one-run strategy might test with m
canaries, whatever the scores (what the ceilings take the best of).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpaudit.audit.strategy import (
    DEFAULT_FPR_GRID,
    DEFAULT_GUESS_FRACTIONS,
    DEFAULT_SPLIT_FPR_GRID,
    DEFAULT_SPLIT_GUESS_FRACTIONS,
    BonferroniStrategy,
    Candidate,
    SplitStrategy,
    Strategy,
    distinct_guess_pairs,
    fpr_level_count,
    one_run_guess_counts,
)
from dpaudit.errors import InputError

__all__ = [
    "GuessSelection",
    "Ranking",
    "ThresholdSelection",
    "possible_guess_pairs",
    "select_guesses",
    "select_threshold",
]


class Ranking:
    """Canaries sorted by score; O(1) correct-guess counts for any (k+, k-).

    A tie between a member and a non-member is broken by ``keys`` (random numbers drawn per
    canary, in an order fixed before membership was drawn: its identity), or, without keys,
    against the guesser: within a block of equal scores the members rank lowest, so that the
    k+ highest take its non-members first and the k- lowest its members first. Either way
    the count is no larger than that of a guesser who sees the scores alone (Steinke et al.
    2023, arXiv 2305.08846, need guesses that depend on the output and on randomness
    independent of membership), whatever order the scores came in."""

    def __init__(self, scores: np.ndarray, member: np.ndarray, keys: np.ndarray | None = None):
        order = np.argsort(scores)  # ascending score (3x faster than lexsort)
        ranked, ranked_member = scores[order], member[order]
        if ((ranked[1:] == ranked[:-1]) & (ranked_member[1:] != ranked_member[:-1])).any():
            # ties within one side leave the counts as they are, whatever their order
            order = np.lexsort((~member, scores) if keys is None else (keys, scores))
        self.m = int(scores.size)
        self._cum_in = np.r_[0, np.cumsum(member[order])]  # members among the i lowest

    def correct(self, k_plus: int, k_minus: int) -> int:
        """Correct guesses among "in" for the k+ highest and "out" for the k- lowest."""
        if k_plus + k_minus > self.m:
            raise InputError(f"{k_plus} + {k_minus} guesses exceed m={self.m}")
        total_in = self._cum_in[-1]
        in_top = total_in - self._cum_in[self.m - k_plus]  # members among the k+ highest
        out_bottom = k_minus - self._cum_in[k_minus]  # non-members among the k- lowest
        return int(in_top + out_bottom)


@dataclass(frozen=True)
class GuessSelection:
    """What a one-run strategy says to test.

    ``pairs``: the (k+, k-) to test on ``ranking``, each at ``significance_per_test``.
    ``details``: how they were chosen (Bonferroni: ``num_candidates``; split:
    ``chosen_candidate``, ``selection_<chooser_name>``, ``selection_num_canaries``).
    ``lists_candidates``: whether the report lists every pair tested (Bonferroni).
    """

    ranking: Ranking
    pairs: tuple[tuple[int, int], ...]
    significance_per_test: float
    details: dict
    lists_candidates: bool


@dataclass(frozen=True)
class ThresholdSelection:
    """What a threshold strategy says to test.

    ``candidates``: the confusion counts (``threshold``, ``tp``, ``fp``, ``tn``, ``fn``; with
    Bonferroni also ``j``, the non-members let through, and ``fp_observed``) on the
    ``num_canaries`` scores evaluated, each to be tested at ``significance_per_test``.
    ``details`` and ``lists_candidates`` as in :class:`GuessSelection`.
    """

    candidates: tuple[dict, ...]
    num_canaries: int
    significance_per_test: float
    details: dict
    lists_candidates: bool


#: A one-run chooser: (m, r, v, significance) -> the value a split maximises.
GuessChooser = Callable[[int, int, int, float], float]
#: A threshold chooser: (tp, fp, tn, fn, significance) -> the value a split maximises.
ThresholdChooser = Callable[[int, int, int, int, float], float]


def _unknown(strategy) -> InputError:
    return InputError(f"strategy must be a BonferroniStrategy or a SplitStrategy, got {strategy!r}")


# ------------------------------------------------------------------------ one run
def _choosing_size(strategy: SplitStrategy, m: int) -> int:
    """Canaries in the choosing part of a split of m (both parts non-empty, or InputError)."""
    n_sel = int(round(strategy.fraction * m))
    if not 1 <= n_sel <= m - 1:
        raise InputError(f"a {strategy.fraction} split of {m} canaries leaves a part empty")
    return n_sel


def _evaluating_pair(candidate: Candidate, m: int) -> tuple[int, int]:
    """(k+, k-) of a chosen candidate on the evaluating part: at least one guess."""
    kp, km = one_run_guess_counts(candidate, m)
    return (kp, km) if kp + km > 0 else (1, 0)


def select_guesses(
    strategy: Strategy,
    *,
    scores: np.ndarray,
    member: np.ndarray,
    tie_keys: np.ndarray | None,
    significance: float,
    chooser: GuessChooser,
    chooser_name: str,
) -> GuessSelection:
    """The (k+, k-) guess pairs ``strategy`` says to test on these canaries (one-run family).

    The m canaries (``scores``, ``member``) are ranked by :class:`Ranking`, ties broken by
    ``tie_keys`` or, without them, against the guesser.

    * Bonferroni: every distinct pair of the grid (default
      :data:`~dpaudit.audit.strategy.DEFAULT_GUESS_FRACTIONS`) on all m, at
      ``significance / G``.
    * Split: the canaries are split at random (so each stays "in" with probability 1/2),
      by a permutation of the canaries themselves: only when their order is known
      (``tie_keys`` given), since the order of the two arrays would reveal who is a member;
      on the choosing part every candidate of the grid (default
      :data:`~dpaudit.audit.strategy.DEFAULT_SPLIT_GUESS_FRACTIONS`) that makes a guess is
      scored by ``chooser(m_sel, r, v, significance)``; the best (ties: the higher accuracy
      v / r, then the first) is carried over as guess fractions to the evaluating part,
      tested at the full ``significance``. Its score lands in
      ``details["selection_<chooser_name>"]``.
    """
    if isinstance(strategy, BonferroniStrategy):
        ranking = Ranking(scores, member, tie_keys)
        pairs = distinct_guess_pairs(strategy.grid or DEFAULT_GUESS_FRACTIONS, ranking.m)
        return GuessSelection(ranking, tuple(pairs), significance / len(pairs), {"num_candidates": len(pairs)}, True)
    if not isinstance(strategy, SplitStrategy):
        raise _unknown(strategy)
    if tie_keys is None:
        raise InputError("a split needs the canaries in their own order (CanaryScores.from_labels): the order of "
                         "the two score arrays reveals which canaries are members")
    m_all = scores.size
    n_sel = _choosing_size(strategy, m_all)
    perm = np.random.default_rng(strategy.seed).permutation(m_all)
    sel, ev = perm[:n_sel], perm[n_sel:]
    ranking_sel = Ranking(scores[sel], member[sel], tie_keys[sel])
    ranking_ev = Ranking(scores[ev], member[ev], tie_keys[ev])
    tried = []
    for cand in strategy.grid or DEFAULT_SPLIT_GUESS_FRACTIONS:
        kp, km = one_run_guess_counts(cand, ranking_sel.m)
        if kp + km == 0:
            continue
        v = ranking_sel.correct(kp, km)
        tried.append((chooser(ranking_sel.m, kp + km, v, significance), v / (kp + km), cand))
    if not tried:
        raise InputError("no split candidate makes at least one guess")
    value, _, cand = max(tried, key=lambda t: (t[0], t[1]))
    details = {
        "chosen_candidate": list(cand) if isinstance(cand, tuple) else cand,
        f"selection_{chooser_name}": value,
        "selection_num_canaries": ranking_sel.m,
    }
    return GuessSelection(ranking_ev, (_evaluating_pair(cand, ranking_ev.m),), significance, details, False)


def possible_guess_pairs(
    strategy: Strategy, *, num_canaries: int, significance: float
) -> tuple[int, list[tuple[int, int]], float]:
    """(m tested on, every pair ``strategy`` might test, per-test significance) for m canaries.

    Bonferroni: the pairs :func:`select_guesses` tests, on all m. Split: the pair each
    candidate that makes a guess on the choosing part would become on the evaluating part
    (m_ev = m - round(fraction * m)), whichever the scores make the chooser pick.
    """
    m = num_canaries
    if isinstance(strategy, BonferroniStrategy):
        pairs = distinct_guess_pairs(strategy.grid or DEFAULT_GUESS_FRACTIONS, m)
        return m, pairs, significance / len(pairs)
    if not isinstance(strategy, SplitStrategy):
        raise _unknown(strategy)
    m_sel = _choosing_size(strategy, m)
    m_ev = m - m_sel
    pairs = [
        _evaluating_pair(cand, m_ev)
        for cand in strategy.grid or DEFAULT_SPLIT_GUESS_FRACTIONS
        if sum(one_run_guess_counts(cand, m_sel)) > 0  # never chosen if it makes no guess there
    ]
    if not pairs:
        raise InputError("no split candidate makes at least one guess")
    return m_ev, pairs, significance


# ---------------------------------------------------------------------- threshold
def _order_stat_counts(ins: np.ndarray, outs_sorted: np.ndarray, j: int) -> dict:
    """Counts at the threshold letting j non-members through: t = (n-j)-th smallest out score.

    "Member" iff score > t. FP is reported as the nominal j (the exact Clopper-Pearson
    coverage argument uses the order statistic's rank; ties only lower the true FPR).
    """
    n_out = outs_sorted.size
    if j >= n_out:
        thr = -math.inf
    else:
        thr = float(outs_sorted[n_out - 1 - j])
    tp = int(np.sum(ins > thr))
    return {
        "j": j,
        "threshold": None if not math.isfinite(thr) else thr,
        "tp": tp,
        "fp": j,
        "tn": int(n_out - j),
        "fn": int(ins.size - tp),
        "fp_observed": int(np.sum(outs_sorted > thr)),
    }


def _split(rng: np.random.Generator, arr: np.ndarray, fraction: float, name: str):
    n_sel = int(round(fraction * arr.size))
    if not 1 <= n_sel <= arr.size - 1:
        raise InputError(f"a {fraction} split of {arr.size} {name} leaves a part empty; need more scores")
    perm = rng.permutation(arr.size)
    return arr[perm[:n_sel]], arr[perm[n_sel:]]


def select_threshold(
    strategy: Strategy,
    *,
    in_scores: np.ndarray,
    out_scores: np.ndarray,
    significance: float,
    chooser: ThresholdChooser,
    chooser_name: str,
) -> ThresholdSelection:
    """The thresholds ``strategy`` says to test on these scores (threshold family).

    A candidate is an FPR level a; its threshold is the out-score order statistic that
    lets j = floor(a * n_out) non-members through.

    * Bonferroni: every distinct j of the grid (default
      :data:`~dpaudit.audit.strategy.DEFAULT_FPR_GRID`) on all scores, at
      ``significance / G``.
    * Split: members and non-members are split separately; on the choosing part every
      distinct j of the grid (default :data:`~dpaudit.audit.strategy.DEFAULT_SPLIT_FPR_GRID`)
      is scored by ``chooser(tp, fp, tn, fn, significance)``; the best (ties: the largest
      TPR - FPR there, then the first) carries its threshold *value* to the evaluating
      part, tested at the full ``significance``. Its score lands in
      ``details["selection_<chooser_name>"]``.
    """
    if isinstance(strategy, BonferroniStrategy):
        grid = strategy.grid or DEFAULT_FPR_GRID
        js = sorted({fpr_level_count(a, out_scores.size) for a in grid})
        out_sorted = np.sort(out_scores)
        candidates = tuple(_order_stat_counts(in_scores, out_sorted, j) for j in js)
        n = int(in_scores.size + out_scores.size)
        return ThresholdSelection(candidates, n, significance / len(js), {"num_candidates": len(js)}, True)
    if not isinstance(strategy, SplitStrategy):
        raise _unknown(strategy)
    rng = np.random.default_rng(strategy.seed)
    in_sel, in_ev = _split(rng, in_scores, strategy.fraction, "in_scores")
    out_sel, out_ev = _split(rng, out_scores, strategy.fraction, "out_scores")
    out_sel_sorted = np.sort(out_sel)
    js = sorted({fpr_level_count(a, out_sel.size) for a in strategy.grid or DEFAULT_SPLIT_FPR_GRID})
    tried = []
    for j in js:
        c = _order_stat_counts(in_sel, out_sel_sorted, j)
        value = chooser(c["tp"], c["fp"], c["tn"], c["fn"], significance)
        # Ties (often all 0 on weak signals) go to the largest TPR - FPR on the choosing part.
        tried.append((value, c["tp"] / in_sel.size - c["fp"] / out_sel.size, c["threshold"]))
    value, _, thr = max(tried, key=lambda t: (t[0], t[1]))
    thr_val = -math.inf if thr is None else thr
    tp = int(np.sum(in_ev > thr_val))
    fp = int(np.sum(out_ev > thr_val))
    counts = {"threshold": thr, "tp": tp, "fp": fp, "tn": int(out_ev.size - fp), "fn": int(in_ev.size - tp)}
    details = {f"selection_{chooser_name}": value, "selection_num_canaries": int(in_sel.size + out_sel.size)}
    return ThresholdSelection((counts,), int(in_ev.size + out_ev.size), significance, details, False)
