"""The one JSON sanitiser: plain JSON types from numpy scalars, arrays, tuples and paths.

Non-finite floats become ``null`` (the toolkit's convention: an epsilon of null is
infinity, a metric of null could not be computed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """``obj`` with every value made a plain JSON type (see the module docstring)."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, PurePath):
        return str(obj)
    return obj
