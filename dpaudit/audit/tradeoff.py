"""Trade-off curves (f-DP, Dong, Roth, Su 2019, "Gaussian Differential Privacy",
arXiv 1905.02383) built from a privacy profile, and the claimed curve of a DpEvent.

A mechanism that is (eps, delta(eps))-DP for every eps is f-DP with
f = sup_eps f_{eps, delta(eps)}, f_{eps, delta}(x) = max(0, 1 - delta - e^eps x,
e^-eps (1 - delta - x)) (Prop. 2.12). The accountant's DpEvent knows a whole privacy
profile, so it gives a whole curve, which the one-run f-DP test of Mahloujifar, Melis,
Chaudhuri 2025 (arXiv 2410.22235) can test guesses against
(:mod:`dpaudit.audit.claimed_curve`).

* :class:`TradeOffCurve` -- the upper envelope of finitely many (eps_i, delta_i) curves.
* :class:`GaussianCurve` -- the exact curve G_mu, that of full-batch DP-SGD.
* :func:`tradeoff_curve_from_profile` -- the curve of any finite privacy profile.
* :func:`claimed_tradeoff_curve` -- the curve of a DpEvent from ``dp_accounting``'s PLD
  (pessimistic estimate, add-or-remove adjacency).

``dp_accounting`` is imported only when a curve is built from an event: importing
:mod:`dpaudit.audit` stays NumPy and SciPy only.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable
from numbers import Real

import numpy as np

from dpaudit.errors import InputError

__all__ = ["CURVE_DISCRETIZATION", "GaussianCurve", "TradeOffCurve", "claimed_tradeoff_curve", "tradeoff_curve_from_profile"]

#: PLD value discretisation used for the curves (coarser than the accountant's 1e-4
#: default: about 8x faster, and the curve moves by less than 1e-6; still pessimistic).
CURVE_DISCRETIZATION = 1e-3

# The epsilon grid of a curve: step 0.0025 up to 5, 0.01 up to 30, then coarser (the
# curve's gap to the true one is second order in the step).
_EPS_GRID = np.unique(
    np.concatenate(
        [
            np.arange(0.0, 5.0, 0.0025),
            np.arange(5.0, 30.0, 0.01),
            np.arange(30.0, 60.0, 0.02),
            np.arange(60.0, 200.0, 0.05),
            np.arange(200.0, 700.0, 0.25),
            [700.0],
        ]
    )
)
_COARSE_EPS_GRID = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 700.0])
# Added to every delta: covers rounding in dp_accounting's sums of ~1e5 probabilities,
# so that floating point cannot lift a line above the true curve.
_DELTA_SLACK = 1e-14
# e^eps overflows past ~709 (here and inside dp_accounting): the grid stops at 700.
_MAX_STEEP_EPS = 700.0
# Taken off every value of the exact Gaussian curve (float error of Phi is ~1e-16).
_GAUSSIAN_SLACK = 1e-12
_NORMAL = statistics.NormalDist()

# ------------------------------------------------------------------------ the curve
class TradeOffCurve:
    """A symmetric trade-off function f, the upper envelope of (eps_i, delta_i) curves.

    f(x) = max(0, max_i max(1 - delta_i - e^eps_i x, e^-eps_i (1 - delta_i - x))),

    a convex, non-increasing, piecewise-linear function on [0, 1] with f(x) <= 1 - x
    (Dong, Roth, Su 2019, Prop. 2.12 with a finite set of eps). A mechanism that is
    (eps_i, delta_i)-DP for every i is f-DP. The envelope is kept as its upper hull, so
    one evaluation is a binary search; every value returned is the value of one of the
    lines (each a valid lower bound), computed in a cancellation-free form.

    ``curve(x)`` is f(x) (vectorised); :meth:`blow_up_inverse` is
    B^-1(y) = f(1 - y), the function of the recursion of Mahloujifar et al. 2025.
    """

    def __init__(self, epsilons: np.ndarray, deltas: np.ndarray):
        eps = np.asarray(epsilons, dtype=float)
        dl = np.asarray(deltas, dtype=float)
        self._epsilons = eps.copy()
        self._deltas = dl.copy()
        self._epsilons.setflags(write=False)
        self._deltas.setflags(write=False)
        # Lines in y = 1 - x:  value = p + s * (y - t)
        #   steep (slope e^eps):   p = 1 - delta, t = 1       ( = 1 - delta - e^eps x )
        #   flat  (slope e^-eps):  p = 0,         t = delta   ( = e^-eps (1 - delta - x) )
        #   zero:                  p = 0, s = 0, t = 0
        keep = dl < 1.0
        eps, dl = eps[keep], dl[keep]
        steep = eps <= _MAX_STEEP_EPS
        with np.errstate(over="ignore", under="ignore"):
            s = np.concatenate([np.exp(eps[steep]), np.exp(-eps), [0.0]])
        p = np.concatenate([1.0 - dl[steep], np.zeros(eps.size), [0.0]])
        t = np.concatenate([np.ones(int(steep.sum())), dl, [0.0]])
        intercept = p - s * t
        self._p, self._s, self._t, self._breaks = _upper_hull(s, intercept, p, t)
        self._p_list, self._s_list, self._t_list = self._p.tolist(), self._s.tolist(), self._t.tolist()
        self._breaks_list = self._breaks.tolist()

    @property
    def epsilons(self) -> np.ndarray:
        return self._epsilons

    @property
    def deltas(self) -> np.ndarray:
        """The deltas the lines were built from (the profile, plus any slack added)."""
        return self._deltas

    @property
    def num_segments(self) -> int:
        return int(self._s.size)

    def blow_up_inverse(self, y):
        """B^-1(y) = f(1 - y), non-decreasing and convex in y in [0, 1] (vectorised)."""
        y = np.clip(np.asarray(y, dtype=float), 0.0, 1.0)
        k = np.searchsorted(self._breaks, y, side="right")
        out = np.maximum(self._p[k] + self._s[k] * (y - self._t[k]), 0.0)
        return float(out) if out.ndim == 0 else out

    def __call__(self, x):
        """f(x) for x in [0, 1] (vectorised); each line evaluated in its x form."""
        x = np.clip(np.asarray(x, dtype=float), 0.0, 1.0)
        k = np.searchsorted(self._breaks, 1.0 - x, side="right")
        p, s, t = self._p[k], self._s[k], self._t[k]
        # p + s (1 - x - t): steep lines (t = 1) as p - s x, the others as s ((1 - t) - x)
        out = np.where(t == 1.0, p - s * x, p + s * ((1.0 - t) - x))
        out = np.maximum(out, 0.0)
        return float(out) if out.ndim == 0 else out

    def _blow_up_inverse_scalar(self, y: float) -> float:
        """:meth:`blow_up_inverse` for one float, in plain Python (the recursion's hot path)."""
        k = bisect.bisect_right(self._breaks_list, y)
        v = self._p_list[k] + self._s_list[k] * (y - self._t_list[k])
        return max(v, 0.0)

    def __repr__(self) -> str:
        return f"TradeOffCurve({self._epsilons.size} (eps, delta) pairs, {self.num_segments} segments)"


def _upper_hull(slope, intercept, p, t):
    """Upper envelope on [0, 1] of the lines intercept + slope * y (convex-hull trick).

    Returns the kept lines' (p, s, t), in order of increasing slope, and the breakpoints
    between consecutive ones (one fewer): line k is on top on [breaks[k-1], breaks[k]].
    Rounding in a breakpoint can only pick a slightly lower line near it, never a value
    above the envelope: every line is a lower bound on its own.
    """
    order = np.lexsort((intercept, slope))  # by slope, then intercept
    slope, intercept, p, t = slope[order], intercept[order], p[order], t[order]
    last = np.r_[slope[1:] != slope[:-1], True]  # on equal slopes keep the largest intercept
    slope, intercept, p, t = slope[last], intercept[last], p[last], t[last]
    sl, ic, pl, steep = slope.tolist(), intercept.tolist(), p.tolist(), (t == 1.0).tolist()

    def overtakes(i: int, j: int) -> float:
        """Where line j (steeper) overtakes line i; steep pairs in the y - 1 coordinate."""
        if steep[i] and steep[j]:  # p + s (y - 1): no cancellation of the large s
            return 1.0 + (pl[i] - pl[j]) / (sl[j] - sl[i])
        return (ic[i] - ic[j]) / (sl[j] - sl[i])

    hull: list[int] = []
    breaks: list[float] = []
    for j in range(len(sl)):
        x = 0.0
        while hull:
            x = overtakes(hull[-1], j)
            if breaks and x <= breaks[-1]:  # before the top line is ever on top: it is useless
                hull.pop()
                breaks.pop()
                continue
            break
        if hull:
            breaks.append(x)
        hull.append(j)
    b = np.asarray(breaks, dtype=float)
    first = int(np.searchsorted(b, 0.0, side="right"))  # lines on top only left of 0 go
    stop = int(np.searchsorted(b, 1.0, side="right"))  # ... and those only right of 1
    idx = np.asarray(hull[first : stop + 1], dtype=int)
    return p[idx], slope[idx], t[idx], b[first:stop]


def tradeoff_curve_from_profile(*, epsilons, deltas) -> TradeOffCurve:
    """The trade-off curve of a finite privacy profile {(eps_i, delta_i)}.

    Dong, Roth, Su 2019 (arXiv 1905.02383), Prop. 2.12: a mechanism that is
    (eps_i, delta_i)-DP for every i is f-DP with
    f = max_i f_{eps_i, delta_i}, f_{eps, delta}(x) = max(0, 1 - delta - e^eps x,
    e^-eps (1 - delta - x)). With a finite set of eps the curve lies below the one of
    the full profile, so a test against it stays sound.
    """
    eps = np.asarray(epsilons, dtype=float)
    dl = np.asarray(deltas, dtype=float)
    if eps.ndim != 1 or eps.size == 0 or eps.shape != dl.shape:
        raise InputError(
            f"epsilons and deltas must be non-empty 1-D arrays of one length, got shapes {eps.shape}, {dl.shape}"
        )
    if not np.all(np.isfinite(eps)) or np.any(eps < 0):
        raise InputError("epsilons must be finite and >= 0")
    if not np.all(np.isfinite(dl)) or np.any(dl < 0) or np.any(dl > 1):
        raise InputError("deltas must be in [0, 1]")
    return TradeOffCurve(eps, dl)


def claimed_tradeoff_curve(event, *, value_discretization_interval: float = CURVE_DISCRETIZATION) -> TradeOffCurve:
    """The claimed trade-off curve of a DpEvent (or its dict form), from ``dp_accounting``'s PLD.

    The event is composed by ``dp_accounting.pld.PLDAccountant`` (add-or-remove-one
    adjacency; every mechanism's PLD is built with ``pessimistic_estimate=True``, so its
    hockey-stick divergences are upper bounds on the true deltas, for both the remove
    and the add direction). Then, following Dong, Roth, Su 2019 (arXiv 1905.02383,
    Prop. 2.12),

        f(x) = max_i max(0, 1 - delta(eps_i) - e^eps_i x, e^-eps_i (1 - delta(eps_i) - x))

    over a fixed grid of eps_i >= 0 (step 0.0025 up to 5, 0.01 up to 30, coarser beyond; the grid stops
    where the PLD's support does). Using only finitely many eps, and pessimistic deltas
    (plus 1e-14 for rounding), puts this curve BELOW the true trade-off curve of the
    mechanism: the mechanism is f-DP for this f, and a test of the one-run guesses
    against it (Mahloujifar, Melis, Chaudhuri 2025, arXiv 2410.22235) is sound. For one
    Gaussian the curve is within about 5e-6 of the exact f_mu. The curve is symmetric
    (each f_{eps, delta} is, and so is their envelope), as the recursion needs.

    A non-private event gives f = 0 (it rejects nothing).
    """
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from dpaudit import accounting

    if isinstance(event, dict):
        event = accounting.event_from_dict(event)
    if not isinstance(event, dp_accounting.DpEvent):
        raise InputError(f"event must be a dp_accounting DpEvent or its dict form, got {event!r}")
    vdi = value_discretization_interval
    if isinstance(vdi, bool) or not isinstance(vdi, Real) or not 0.0 < float(vdi) <= 0.1:
        raise InputError(f"value_discretization_interval must be in (0, 0.1], got {vdi!r}")
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=float(vdi))
    if not accountant.supports(event):
        raise InputError(f"the pld accountant cannot account for {event!r}")
    with accounting.quiet_absl(), np.errstate(over="ignore", invalid="ignore"):
        accountant.compose(event)
        # Past the PLD's largest finite loss, delta stays at its last value (the mass at
        # infinity) and every later line is dominated by the first of them: find where
        # that happens on a coarse grid, then ask only for the fine grid below it
        # (dp_accounting's vectorised delta costs ~10 us per epsilon).
        coarse = _profile(accountant, _COARSE_EPS_GRID)
        top = _COARSE_EPS_GRID[int(np.argmax(coarse <= coarse[-1]))] if coarse[-1] < 1.0 else _EPS_GRID[-1]
        grid = _EPS_GRID[_EPS_GRID <= top]
        deltas = _profile(accountant, grid)
    stop = int(np.argmax(deltas <= deltas[-1])) + 1
    return TradeOffCurve(grid[:stop], deltas[:stop])


def _profile(accountant, grid: np.ndarray) -> np.ndarray:
    """Pessimistic deltas on ``grid``, plus the rounding slack; NaN (overflow) -> 1."""
    deltas = np.broadcast_to(np.asarray(accountant.get_delta(grid), dtype=float), grid.shape)
    return np.where(np.isfinite(deltas), np.minimum(np.maximum(deltas, 0.0) + _DELTA_SLACK, 1.0), 1.0)


class GaussianCurve:
    """G_mu(x) = Phi(Phi^-1(1 - x) - mu), the trade-off curve of the Gaussian mechanism with
    sensitivity 1 and noise 1 / mu (Dong, Roth, Su 2019, arXiv 1905.02383, Def. 2.7), minus
    :data:`_GAUSSIAN_SLACK` so that floating point cannot lift it above the true curve.

    T full-batch steps (q = 1) of DP-SGD at noise multiplier sigma are exactly this curve with
    mu = sqrt(T) / sigma (the composition of Gaussians, their Cor. 3.3): no PLD is needed, and
    no discretisation stands between the test and the claim."""

    def __init__(self, mu: float):
        if not math.isfinite(mu) or mu <= 0.0:
            raise InputError(f"mu must be finite and > 0, got {mu!r}")
        self.mu = float(mu)

    def _blow_up_inverse_scalar(self, y: float) -> float:
        """B^-1(y) = f(1 - y) = Phi(Phi^-1(y) - mu)."""
        if y <= 0.0:
            return 0.0
        if y >= 1.0:
            return 1.0
        return max(_NORMAL.cdf(_NORMAL.inv_cdf(y) - self.mu) - _GAUSSIAN_SLACK, 0.0)

    def blow_up_inverse(self, y):
        from scipy.stats import norm

        y = np.clip(np.asarray(y, dtype=float), 0.0, 1.0)
        with np.errstate(divide="ignore"):
            out = np.where(y >= 1.0, 1.0, np.maximum(norm.cdf(norm.ppf(y) - self.mu) - _GAUSSIAN_SLACK, 0.0))
        return float(out) if out.ndim == 0 else out

    def __call__(self, x):
        return self.blow_up_inverse(1.0 - np.asarray(x, dtype=float))

    def delta(self, epsilon: float) -> float:
        """delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2) (their Cor. 2.13)."""
        mu = self.mu
        return _NORMAL.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * _NORMAL.cdf(-epsilon / mu - mu / 2)

    def epsilon(self, delta: float) -> float:
        """The smallest eps with delta(eps) <= ``delta`` (bisection; delta(eps) falls with eps)."""
        lo, hi = 0.0, 1.0
        while self.delta(hi) > delta:
            lo, hi = hi, 2.0 * hi
            if hi > 1e4:
                return math.inf
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.delta(mid) > delta else (lo, mid)
        return hi

    def __repr__(self) -> str:
        return f"GaussianCurve(mu={self.mu:.6g})"


@functools.lru_cache(maxsize=64)
def _dpsgd_curve(noise_multiplier: float, sample_rate: float, steps: int, vdi: float) -> TradeOffCurve | GaussianCurve:
    """The curve of T steps of DP-SGD at (sigma, q): exact at q = 1, else the PLD's."""
    from dpaudit import accounting

    if sample_rate == 1.0:
        return GaussianCurve(math.sqrt(steps) / noise_multiplier)
    event = accounting.make_event(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    return claimed_tradeoff_curve(event, value_discretization_interval=vdi)


def _as_blow_up_inverse(curve) -> Callable[[float], float]:
    if isinstance(curve, TradeOffCurve | GaussianCurve):
        return curve._blow_up_inverse_scalar
    if callable(curve):
        f = curve

        def blow_up_inverse(y: float) -> float:
            return float(f(1.0 - y))

        return blow_up_inverse
    try:  # a DpEvent or its dict
        return claimed_tradeoff_curve(curve)._blow_up_inverse_scalar
    except InputError:
        raise InputError(
            f"curve must be a TradeOffCurve, a DpEvent (or its dict form) or a symmetric trade-off function, "
            f"got {curve!r}"
        ) from None
