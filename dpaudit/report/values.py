"""Tolerant readers of numbers in artifacts written by other code: a finite number or None."""

from __future__ import annotations

import math
from typing import Any


def num(x: Any) -> float | None:
    """A finite float, or None for anything else (null, NaN, a string, a bool)."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def integer(x: Any) -> int | None:
    v = num(x)
    return int(v) if v is not None else None


def rate(k: Any, n: Any) -> float | None:
    k, n = integer(k), integer(n)
    return k / n if k is not None and n else None
