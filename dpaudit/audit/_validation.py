"""Input checks shared by the audit modules: scores (one place that says: higher score = member),
FPR levels, counts, delta and significance."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np

from dpaudit.errors import InputError


def as_scores(name: str, values) -> np.ndarray:
    """A read-only, finite, non-empty 1-D float array of attack scores.

    dpaudit's convention, everywhere: a *higher* score means "more likely a member".
    """
    if isinstance(values, str | bytes):
        raise InputError(f"{name} must be a 1-D array of numbers, got a string")
    try:
        arr = np.array(values, dtype=float, copy=True)
    except (TypeError, ValueError) as err:
        raise InputError(f"{name} must be a 1-D array of numbers: {err}") from None
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise InputError(f"{name} is empty; need at least one score")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise InputError(
            f"{name} has {int(bad.sum())} non-finite value(s) (NaN or inf), first at index {int(np.argmax(bad))}"
        )
    arr.setflags(write=False)
    return arr


def as_fpr(fpr) -> float:
    try:
        value = float(fpr)
    except (TypeError, ValueError):
        raise InputError(f"fpr must be a number in (0, 1], got {fpr!r}") from None
    if not 0.0 < value <= 1.0:
        raise InputError(f"fpr must be in (0, 1], got {value}")
    return value


# ------------------------------------------------------------ counts and levels
def _check_count(name: str, value) -> int:
    if isinstance(value, bool | np.bool_):
        raise InputError(f"{name} must be a non-negative integer, got {value!r}")
    if not isinstance(value, Integral | np.integer):
        if isinstance(value, Real | np.floating) and float(value).is_integer():
            value = int(value)
        else:
            raise InputError(f"{name} must be a non-negative integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise InputError(f"{name} must be a non-negative integer, got {value}")
    return value


def _check_delta(delta) -> float:
    if delta is None or isinstance(delta, bool) or not isinstance(delta, Real | np.floating):
        raise InputError(f"delta must be a number in [0, 1), got {delta!r}")
    delta = float(delta)
    if not 0.0 <= delta < 1.0:
        raise InputError(f"delta must be in [0, 1), got {delta}")
    return delta


def _check_significance(significance) -> float:
    if isinstance(significance, bool) or not isinstance(significance, Real | np.floating):
        raise InputError(f"significance must be a number in (0, 1), got {significance!r}")
    significance = float(significance)
    if not 0.0 < significance < 1.0:
        raise InputError(f"significance must be in (0, 1), got {significance}")
    return significance


def _check_one_run_counts(num_canaries, num_guesses, num_correct) -> tuple[int, int, int]:
    m = _check_count("num_canaries", num_canaries)
    r = _check_count("num_guesses", num_guesses)
    v = _check_count("num_correct", num_correct)
    if m < 1:
        raise InputError("num_canaries must be at least 1")
    if r > m:
        raise InputError(f"num_guesses ({r}) cannot exceed num_canaries ({m})")
    if v > r:
        raise InputError(f"num_correct ({v}) cannot exceed num_guesses ({r})")
    return m, r, v


def _check_confusion(tp, fp, tn, fn) -> tuple[int, int, int, int]:
    tp, fp, tn, fn = (_check_count(n, x) for n, x in (("tp", tp), ("fp", fp), ("tn", tn), ("fn", fn)))
    if tp + fn < 1:
        raise InputError("need at least one member (tp + fn >= 1)")
    if fp + tn < 1:
        raise InputError("need at least one non-member (fp + tn >= 1)")
    return tp, fp, tn, fn
