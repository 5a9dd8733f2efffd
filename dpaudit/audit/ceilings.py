"""The largest epsilon each bound can report with a given number of canaries.

A lower bound can never exceed what perfect evidence allows: with m canaries, even an
attack that is right every time proves at most the "ceiling". A bound of 0.9 from a
method whose ceiling is 3.5 says something very different from a bound of 0.9 from a
method whose ceiling is 1.0. ``python -m dpaudit.audit`` prints the table in
``docs/ceilings.md``; :func:`one_run_ceiling` gives the ceiling of one run's m, strategy
and significance (what :func:`dpaudit.audit.decide` compares with the claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

import dpaudit.audit.bounds as _b
from dpaudit.audit._validation import _check_count, _check_delta, _check_significance
from dpaudit.audit.canary_scores import CanaryScores
from dpaudit.audit.catalog import get_bound
from dpaudit.audit.claimed_curve import claimed_curve_bound, exceeds_claim
from dpaudit.audit.selection import possible_guess_pairs
from dpaudit.audit.strategy import DEFAULT_FPR_GRID, DEFAULT_STRATEGY, Strategy, fpr_level_count
from dpaudit.errors import InputError

__all__ = ["CeilingRow", "ceiling_table", "claimed_curve_can_violate", "claimed_curve_ceiling", "format_ceiling_table",
           "one_run_ceiling"]


@dataclass(frozen=True)
class CeilingRow:
    """Ceilings for m canaries (one-run) or m trials per side (multi-run).

    ``one_run`` / ``one_run_fdp``: all guesses correct at the best number of guesses
    (``*_best_guesses``), at the full significance. ``*_default``: what the default
    Bonferroni strategy reports on perfectly separated scores (every candidate of
    :data:`DEFAULT_GUESS_FRACTIONS` all correct, each at significance / G, G the number
    of distinct candidates, 7 for m >= 100). ``clopper_pearson`` / ``gdp``: m members and
    m non-members, zero errors, one threshold; ``*_default``: the default Bonferroni grid
    :data:`DEFAULT_FPR_GRID` (significance / G, G = 9 or 10 distinct thresholds).
    """

    m: int
    one_run: float
    one_run_best_guesses: int
    one_run_default: float
    one_run_fdp: float
    one_run_fdp_best_guesses: int
    one_run_fdp_default: float
    clopper_pearson: float
    clopper_pearson_default: float
    gdp: float
    gdp_default: float

    def to_dict(self) -> dict:
        return asdict(self)


def _best_all_correct(fn, m: int, delta: float, significance: float) -> tuple[float, int]:
    rs = np.unique(np.r_[np.round(np.geomspace(1, m, 40)).astype(int), m])
    best = max(
        ((fn(num_canaries=m, num_guesses=int(r), num_correct=int(r), delta=delta, significance=significance), int(r))
         for r in rs),
        key=lambda t: (t[0], -t[1]),
    )
    return best


def one_run_ceiling(
    *,
    method: str,
    num_canaries: int,
    delta: float,
    significance: float,
    strategy: Strategy | None = None,
) -> float:
    """The largest epsilon a one-run ``method`` can report for m canaries under ``strategy``.

    Every guess correct, with the selection correction the real computation
    (:meth:`dpaudit.audit.CanaryScores.bound`) uses:

    * :class:`~dpaudit.audit.BonferroniStrategy` (the default): every distinct (k+, k-) of
      the grid (default :data:`~dpaudit.audit.DEFAULT_GUESS_FRACTIONS`) at m canaries, all
      correct, each at ``significance / G`` (G distinct candidates); the best candidate.
    * :class:`~dpaudit.audit.SplitStrategy`: only the evaluating part counts,
      m_ev = m - round(fraction * m) canaries; every candidate of the grid (default
      :data:`~dpaudit.audit.DEFAULT_SPLIT_GUESS_FRACTIONS`) at m_ev, all correct, at the
      full significance; the best candidate (whichever the choosing part might pick).

    On perfectly separated, balanced scores (n_in = ceil(m / 2)) this is exactly what
    :meth:`~dpaudit.audit.CanaryScores.bound` returns. ``method`` must be a registered
    bound of the ``"one_run"`` family (threshold bounds need runs, not canaries: see
    :func:`ceiling_table`).
    """
    spec = get_bound(method)
    if spec.family != "one_run":
        raise InputError(f"{method!r} is a {spec.family} bound; one_run_ceiling needs a one-run bound")
    m = _check_count("num_canaries", num_canaries)
    if m < 1:
        raise InputError("num_canaries must be at least 1")
    delta = _check_delta(delta)
    significance = _check_significance(significance)
    strategy = DEFAULT_STRATEGY if strategy is None else strategy
    m, pairs, per_test = possible_guess_pairs(strategy, num_canaries=m, significance=significance)
    return max(
        spec.evaluate(num_canaries=m, num_guesses=kp + km, num_correct=kp + km, delta=delta, significance=per_test)[0]
        for kp, km in pairs
    )


def ceiling_table(
    *, ms: Sequence[int] = (100, 1000, 10000), delta: float = 1e-5, significance: float = 0.05
) -> list[CeilingRow]:
    """Ceilings of all four bounds for each m in ``ms`` (see :class:`CeilingRow`)."""
    rows = []
    for m in ms:
        m = int(m)
        # Number of distinct default thresholds (what the default Bonferroni divides by).
        g_thr = len({fpr_level_count(a, m) for a in DEFAULT_FPR_GRID})
        one, one_r = _best_all_correct(_b.epsilon_one_run, m, delta, significance)
        fdp, fdp_r = _best_all_correct(_b.epsilon_one_run_fdp, m, delta, significance)
        one_d = one_run_ceiling(method="one_run", num_canaries=m, delta=delta, significance=significance)
        fdp_d = one_run_ceiling(method="one_run_fdp", num_canaries=m, delta=delta, significance=significance)
        perfect = dict(tp=m, fp=0, tn=m, fn=0, delta=delta)
        rows.append(
            CeilingRow(
                m=m,
                one_run=one,
                one_run_best_guesses=one_r,
                one_run_default=one_d,
                one_run_fdp=fdp,
                one_run_fdp_best_guesses=fdp_r,
                one_run_fdp_default=fdp_d,
                clopper_pearson=_b.epsilon_clopper_pearson(**perfect, significance=significance),
                clopper_pearson_default=_b.epsilon_clopper_pearson(**perfect, significance=significance / g_thr),
                gdp=_b.epsilon_from_gdp(**perfect, significance=significance),
                gdp_default=_b.epsilon_from_gdp(**perfect, significance=significance / g_thr),
            )
        )
    return rows


def format_ceiling_table(rows: Sequence[CeilingRow]) -> str:
    """Markdown table: best-case bound (default-strategy bound in brackets)."""
    head = (
        "| m | one-run (Steinke et al. 2023) | one-run f-DP (Mahloujifar et al. 2025) "
        "| Clopper-Pearson (Jagielski et al. 2020), m runs per side | GDP (Nasr et al. 2023), m runs per side |\n"
        "| ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r.m:,} | {r.one_run:.2f} [{r.one_run_default:.2f}] "
            f"| {r.one_run_fdp:.2f} [{r.one_run_fdp_default:.2f}] "
            f"| {r.clopper_pearson:.2f} [{r.clopper_pearson_default:.2f}] | {r.gdp:.2f} [{r.gdp_default:.2f}] |"
        )
    return "\n".join(lines)


def claimed_curve_ceiling(
    *,
    num_canaries: int,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    significance: float,
    strategy: Strategy | None = None,
) -> float:
    """The largest epsilon-equivalent the claimed-curve test
    (:func:`dpaudit.audit.claimed_curve_bound`) can report for m canaries: its result on
    perfectly separated, balanced scores (every guess right), with the same strategy."""
    return claimed_curve_bound(_perfect(num_canaries), noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
                               delta=delta, significance=significance, strategy=strategy).epsilon


def claimed_curve_can_violate(*, num_canaries: int, noise_multiplier: float, sample_rate: float, steps: int,
                              delta: float, significance: float, strategy: Strategy | None = None) -> bool:
    """Whether :func:`claimed_curve_ceiling` is above the claim's epsilon, i.e. whether m
    canaries could ever show this claim violated (:func:`dpaudit.audit.claimed_curve.exceeds_claim`
    on perfectly separated scores; two curves, no search)."""
    return exceeds_claim(_perfect(num_canaries), noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
                         delta=delta, significance=significance, strategy=strategy)


def _perfect(num_canaries: int) -> CanaryScores:
    """Perfectly separated, balanced scores of m canaries: every guess right."""
    m = _check_count("num_canaries", num_canaries)
    if m < 2:
        raise InputError("num_canaries must be at least 2")
    member = np.arange(m) < (m + 1) // 2
    return CanaryScores.from_labels(scores=member.astype(float), is_member=member, seed=0)
