"""How the threshold (or the guess counts k+, k-) of a bound is chosen: explicit strategies,
frozen objects applied by :mod:`dpaudit.audit.selection`.

A bound computed at a threshold that was picked on the very scores it is reported on
is optimistic. dpaudit never reports the uncorrected maximum over thresholds; one of
two strategies must be used (the default is :class:`BonferroniStrategy`):

* :class:`SplitStrategy` -- the canaries are split at random (``fraction`` of them
  choose, the rest evaluate). The candidate with the best bound on the choosing part is
  evaluated once, at the full significance, on the evaluating part (whose size is the m
  of the reported bound).
* :class:`BonferroniStrategy` -- every candidate of a fixed grid is evaluated on all
  canaries at ``significance / G`` (G = number of distinct candidates); the maximum is
  reported. Valid by the union bound.

Candidates, per family of bound:

* One-run bounds (Steinke et al. 2023; Mahloujifar et al. 2025) -- a candidate is a
  *guess fraction* g in (0, 1]: k = max(1, round(g * m)) guesses, k+ = ceil(k / 2)
  highest scores guessed "in" and k- = floor(k / 2) lowest guessed "out"; or a pair
  (g+, g-): k+ = round(g+ * m), k- = round(g- * m).
* Threshold bounds (Clopper-Pearson; GDP) -- a candidate is an FPR level a in [0, 1):
  the threshold is the out-score order statistic that lets j = floor(a * n_out)
  non-members through ("member" iff score > threshold). Because the threshold is an
  order statistic of the out scores, the Clopper-Pearson bound on its FPR uses j
  (exact, Beta(j + 1, n_out - j) coverage) and the FN count of the independent in
  scores is binomial given the threshold; so the grid may be fixed without looking at
  the scores' scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable

__all__ = [
    "DEFAULT_GUESS_FRACTIONS",
    "DEFAULT_FPR_GRID",
    "DEFAULT_SPLIT_GUESS_FRACTIONS",
    "DEFAULT_SPLIT_FPR_GRID",
    "Strategy",
    "BonferroniStrategy",
    "SplitStrategy",
    "DEFAULT_STRATEGY",
    "strategy_from_dict",
]

#: Default one-run candidates for Bonferroni: fraction of all canaries guessed, half
#: "in" (highest scores) and half "out" (lowest scores). 7 candidates.
DEFAULT_GUESS_FRACTIONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

#: Default threshold candidates for Bonferroni: FPR levels. Low levels serve the
#: Clopper-Pearson bound, the middle ones the GDP bound and the FNR side. 10 candidates.
DEFAULT_FPR_GRID: tuple[float, ...] = (0.0, 0.001, 0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)

#: Finer grids used only on the choosing part of a split (no correction needed there).
DEFAULT_SPLIT_GUESS_FRACTIONS: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0,
)
DEFAULT_SPLIT_FPR_GRID: tuple[float, ...] = (
    0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9,
)

Candidate = float | tuple[float, float]


def _check_grid(grid) -> tuple[Candidate, ...] | None:
    if grid is None:
        return None
    if isinstance(grid, np.ndarray):
        grid = grid.tolist()
    if isinstance(grid, str | bytes) or not isinstance(grid, Sequence):
        raise InputError(f"grid must be a sequence of candidates, got {grid!r}")
    if len(grid) == 0:
        raise InputError("grid must not be empty")
    out: list[Candidate] = []
    for c in grid:
        if isinstance(c, Sequence) and not isinstance(c, str | bytes):
            if len(c) != 2 or not all(_is_fraction(x) for x in c) or float(c[0]) + float(c[1]) > 1.0:
                raise InputError(f"a pair candidate must be (g_plus, g_minus), each in [0, 1], sum <= 1, got {c!r}")
            out.append((float(c[0]), float(c[1])))
        elif _is_fraction(c):
            out.append(float(c))
        else:
            raise InputError(f"a grid candidate must be a fraction in [0, 1] or a pair of them, got {c!r}")
    return tuple(out)


def _is_fraction(x) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool) and 0.0 <= float(x) <= 1.0


def one_run_guess_counts(candidate: Candidate, m: int) -> tuple[int, int]:
    """(k+, k-) for a one-run candidate and m canaries (see module docstring)."""
    if isinstance(candidate, tuple):  # g+ + g- <= 1 (checked), so only rounding can ask for more than m
        k_plus = round(candidate[0] * m)
        return int(k_plus), int(min(round(candidate[1] * m), m - k_plus))
    if candidate <= 0.0:
        raise InputError(f"a guess fraction must be > 0, got {candidate}")
    k = max(1, round(candidate * m))
    return int((k + 1) // 2), int(k // 2)


def distinct_guess_pairs(grid, m: int) -> list[tuple[int, int]]:
    """Distinct (k+, k-) of a one-run grid at m canaries, in grid order, skipping
    candidates that make no guess: what Bonferroni evaluates (G = the list's length)."""
    pairs: list[tuple[int, int]] = []
    for cand in grid:
        kp, km = one_run_guess_counts(cand, m)
        if kp + km > 0 and (kp, km) not in pairs:
            pairs.append((kp, km))
    if not pairs:
        raise InputError("no grid candidate makes at least one guess")
    return pairs


def fpr_level_count(candidate: Candidate, n_out: int) -> int:
    """j = floor(a * n_out) non-members let through for an FPR-level candidate a."""
    if isinstance(candidate, tuple) or candidate >= 1.0:
        raise InputError(f"a threshold candidate must be an FPR level in [0, 1), got {candidate!r}")
    return int(candidate * n_out + 1e-9)


class Strategy:
    """Base class of threshold / guess-count selection strategies."""

    name: str = "strategy"

    def describe(self) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class BonferroniStrategy(Strategy):
    """Evaluate every grid candidate at significance / G and report the maximum.

    ``grid=None`` uses :data:`DEFAULT_GUESS_FRACTIONS` for one-run bounds and
    :data:`DEFAULT_FPR_GRID` for threshold bounds. Candidates that map to the same
    (k+, k-) or the same j are evaluated (and counted in G) once.
    """

    grid: tuple[Candidate, ...] | None = None
    name: str = field(default="bonferroni", init=False)

    def __post_init__(self):
        object.__setattr__(self, "grid", _check_grid(self.grid))

    def describe(self) -> dict:
        return {"name": self.name, "grid": None if self.grid is None else jsonable(self.grid)}


@dataclass(frozen=True)
class SplitStrategy(Strategy):
    """Choose on a random ``fraction`` of the canaries, evaluate on the rest.

    ``seed`` feeds ``numpy.random.default_rng`` for the split. ``grid`` is searched on
    the choosing part only (defaults: :data:`DEFAULT_SPLIT_GUESS_FRACTIONS`,
    :data:`DEFAULT_SPLIT_FPR_GRID`). One-run bounds split the pooled canaries (so each
    stays "in" with probability 1/2) and carry the chosen guess *fractions* over;
    threshold bounds split members and non-members separately and carry the chosen
    threshold *value* over.
    """

    fraction: float = 0.5
    seed: int = 0
    grid: tuple[Candidate, ...] | None = None
    name: str = field(default="split", init=False)

    def __post_init__(self):
        if not isinstance(self.fraction, Real) or not 0.0 < float(self.fraction) < 1.0:
            raise InputError(f"fraction must be in (0, 1), got {self.fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InputError(f"seed must be an int, got {self.seed!r}")
        object.__setattr__(self, "fraction", float(self.fraction))
        object.__setattr__(self, "grid", _check_grid(self.grid))

    def describe(self) -> dict:
        return {
            "name": self.name,
            "fraction": self.fraction,
            "seed": self.seed,
            "grid": None if self.grid is None else jsonable(self.grid),
        }


#: The strategy used when none is given.
DEFAULT_STRATEGY = BonferroniStrategy()


def strategy_from_dict(d: Any) -> Strategy | None:
    """The strategy of :meth:`Strategy.describe`'s dict (None when it is not one)."""
    if not isinstance(d, Mapping):
        return None
    grid = d.get("grid")
    grid = tuple(tuple(g) if isinstance(g, list) else g for g in grid) if isinstance(grid, list) else None
    if d.get("name") == "split":
        return SplitStrategy(fraction=float(d.get("fraction", 0.5)), seed=int(d.get("seed", 0)), grid=grid)
    if d.get("name") == "bonferroni":
        return BonferroniStrategy(grid=grid)
    return None
