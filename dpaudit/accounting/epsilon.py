"""Epsilon of an event at a delta (``dp_accounting``'s PLD or RDP accountant), the noise
multiplier that reaches a target epsilon, and the default delta of a run."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import warnings

import dp_accounting
from dp_accounting import pld, rdp
from scipy.optimize import brentq

from dpaudit.accounting.events import check_delta_range
from dpaudit.accounting.events import check_method, check_sample_rate, check_steps, make_event
from dpaudit.errors import InputError

# noise_multiplier() searches sigma in [MIN_NOISE, MAX_NOISE]; a target epsilon that needs
# more noise than MAX_NOISE "cannot be reached" (training with it would learn nothing).
MIN_NOISE = 1e-2
MAX_NOISE = 1e3
_RELATIVE_TOLERANCE = 1e-4  # on sigma, when calibrating


def default_delta(num_units: int) -> float:
    """The delta used when the config leaves ``train.dp.delta`` unset: ``1 / (10 N)`` rounded
    down to a power of ten, N = number of protected units (examples or users). For N = 60000
    that is 1e-6; for N = 40 it is 1e-3. Always at most ``1/(10 N)``, well below ``1/N``."""
    if isinstance(num_units, bool) or not isinstance(num_units, int) or num_units < 1:
        raise InputError(f"number of protected units must be a positive integer, got {num_units!r}")
    return 10.0 ** math.floor(math.log10(1.0 / (10 * num_units)) + 1e-12)


def check_delta(delta: float, num_units: int) -> float:
    """Validate a user's delta; warn (not fail) when it is 1/N or more, which would allow
    the mechanism to release one whole unit outright."""
    delta = check_delta_range(delta)
    if delta >= 1.0 / num_units:
        warnings.warn(
            f"delta={delta:g} is not below 1/N = {1.0 / num_units:g} (N = {num_units} protected units): "
            "such a guarantee allows publishing a unit's data outright; use delta well below 1/N",
            UserWarning,
            stacklevel=2,
        )
    return delta



@contextlib.contextmanager
def quiet_absl():
    """dp_accounting's RDP code logs a warning through absl for every fractional order whose
    series does not converge; those orders are simply skipped. Keep stderr readable."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _composed(event: dp_accounting.DpEvent, method: str, *, coarse: bool = False):
    """The accountant of ``method`` with ``event`` composed (the costly part: a PLD's convolutions)."""
    if method == "pld":
        accountant = pld.PLDAccountant(value_discretization_interval=1e-3) if coarse else pld.PLDAccountant()
    else:
        accountant = rdp.RdpAccountant()
    if not accountant.supports(event):
        raise InputError(f"the {method} accountant cannot account for {event!r}")
    with quiet_absl():
        accountant.compose(event)
    return accountant


# A run's few events are asked for their epsilon at several deltas (each bound's, the
# report's, a ladder's): composed once each. DpEvents are frozen and compare by value.
_composed_once = functools.lru_cache(maxsize=16)(_composed)


def _epsilon(event: dp_accounting.DpEvent, delta: float, method: str, *, coarse: bool = False,
             cached: bool = False) -> float:
    accountant = (_composed_once if cached else _composed)(event, method, coarse=coarse)
    with quiet_absl():
        return float(accountant.get_epsilon(delta))


def epsilon_from_event(event: dp_accounting.DpEvent, *, delta: float, method: str = "pld") -> float:
    """Epsilon of any ``DpEvent`` at ``delta`` with the default ``dp_accounting`` accountant
    settings; ``inf`` for a non-private event."""
    return _epsilon(event, check_delta_range(delta), check_method(method), cached=True)


def epsilon(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float, method: str = "pld") -> float:
    """Epsilon after ``steps`` steps of DP-SGD with Poisson rate ``sample_rate`` and noise
    multiplier ``noise_multiplier`` (noise std / clipping norm), at ``delta``."""
    check_method(method)
    event = make_event(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    return epsilon_from_event(event, delta=delta, method=method)


def noise_multiplier(
    *, target_epsilon: float, sample_rate: float, steps: int, delta: float, method: str = "pld"
) -> float:
    """The smallest noise multiplier, to a relative tolerance of about 1e-4, whose epsilon is
    at or below ``target_epsilon``: the returned sigma always satisfies
    ``epsilon(noise_multiplier=sigma, ...) <= target_epsilon`` (same method and settings),
    and a sigma 1e-3 smaller does not. Searched within [1e-2, 1e3] on log sigma: Brent's
    method on a coarse PLD grid, then Newton steps on the accountant's own grid. A target
    that needs more noise than 1e3 is an :class:`InputError` (it cannot be reached in the
    given steps at this q and delta)."""
    check_method(method)
    q = check_sample_rate(sample_rate)
    steps = check_steps(steps)
    delta = check_delta_range(delta)
    if (
        not isinstance(target_epsilon, (int, float))
        or isinstance(target_epsilon, bool)
        or not math.isfinite(target_epsilon)
        or target_epsilon <= 0
    ):
        raise InputError(f"target epsilon must be a positive number, got {target_epsilon!r}")

    # 1. Search with a 10x coarser PLD grid (about 8x faster). Bracket [lo, hi] with
    #    eps(lo) > target >= eps(hi) by doubling or halving from sigma = 1.
    eps = _epsilon_of_sigma(q, steps, delta, method, coarse=True)
    hi = 1.0
    while eps(hi) > target_epsilon:
        if hi >= MAX_NOISE:
            raise InputError(
                f"target epsilon {target_epsilon:g} cannot be reached in {steps} steps at q={q:g}, "
                f"delta={delta:g}: even noise multiplier {MAX_NOISE:g} gives epsilon {eps(hi):.4g}"
            )
        hi = min(hi * 2.0, MAX_NOISE)
    lo = hi / 2.0
    while eps(lo) <= target_epsilon:
        hi = lo
        if lo <= MIN_NOISE:
            return _safe_side(hi, target_epsilon, q, steps, delta, method)
        lo = max(lo / 2.0, MIN_NOISE)
    sigma = _solve(eps, lo, hi, target_epsilon)
    if method == "rdp":
        return _safe_side(sigma, target_epsilon, q, steps, delta, method)
    fine = _epsilon_of_sigma(q, steps, delta, method, coarse=False)
    sigma = _refine(sigma, target_epsilon, coarse=eps, fine=fine)
    return _safe_side(sigma, target_epsilon, q, steps, delta, method, fine)


def _epsilon_of_sigma(q: float, steps: int, delta: float, method: str, *, coarse: bool):
    """sigma -> epsilon of DP-SGD at (q, steps, delta), memoised; on a 10x coarser PLD grid
    when ``coarse``."""
    cache: dict[float, float] = {}

    def eps(sigma: float) -> float:
        if sigma not in cache:
            event = make_event(noise_multiplier=sigma, sample_rate=q, steps=steps)
            cache[sigma] = _epsilon(event, delta, method, coarse=coarse)
        return cache[sigma]

    return eps


def _solve(eps, lo: float, hi: float, target: float) -> float:
    """Brent's method on log epsilon against log sigma (smooth, nearly linear) in [lo, hi]."""

    def gap(log_sigma: float) -> float:
        return math.log(max(eps(math.exp(log_sigma)), 1e-300)) - math.log(target)

    root = math.exp(brentq(gap, math.log(lo), math.log(hi), xtol=_RELATIVE_TOLERANCE / 4, rtol=1e-12))
    return min(max(root, lo), hi)


def _refine(sigma: float, target: float, *, coarse, fine) -> float:
    """Refine ``sigma`` on the accountant's own grid (``fine``): Newton steps on log epsilon
    against log sigma, with the slope taken from the ``coarse`` grid (a fine evaluation can
    take seconds); when they do not converge, bracket and solve on the fine grid."""
    step = 1e-3
    slope = (math.log(max(coarse(sigma * (1 + step)), 1e-300)) - math.log(max(coarse(sigma), 1e-300))) / math.log1p(step)
    if slope < 0:
        for _ in range(4):
            miss = math.log(max(fine(sigma), 1e-300)) - math.log(target)
            if abs(miss) < _RELATIVE_TOLERANCE / 10:
                return sigma
            sigma = min(max(sigma * math.exp(-miss / slope), MIN_NOISE), MAX_NOISE)
    # the coarse grid misled us (tiny epsilons): bracket and solve on the fine grid
    hi = sigma
    while fine(hi) > target:
        if hi >= MAX_NOISE:
            return MAX_NOISE  # _safe_side then raises: not reachable
        hi = min(hi * 1.25, MAX_NOISE)
    lo = hi / 1.25
    while fine(lo) <= target and lo > MIN_NOISE:
        lo, hi = max(lo / 1.25, MIN_NOISE), lo
    return _solve(fine, lo, hi, target) if fine(lo) > target else lo


def _safe_side(sigma: float, target: float, q: float, steps: int, delta: float, method: str, eps=None) -> float:
    """Step sigma up by the tolerance until epsilon (default grid) is at or below target."""
    if eps is None:

        def eps(s: float) -> float:
            return epsilon(noise_multiplier=s, sample_rate=q, steps=steps, delta=delta, method=method)

    while eps(sigma) > target:
        if sigma >= MAX_NOISE:
            raise InputError(
                f"target epsilon {target:g} cannot be reached in {steps} steps at q={q:g}, delta={delta:g}: "
                f"even noise multiplier {MAX_NOISE:g} gives epsilon {eps(sigma):.4g}"
            )
        sigma = min(sigma * (1 + _RELATIVE_TOLERANCE / 2), MAX_NOISE)
    return sigma
