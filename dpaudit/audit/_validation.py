"""Input checks shared by the audit modules (one place that says: higher score = member)."""

from __future__ import annotations

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
