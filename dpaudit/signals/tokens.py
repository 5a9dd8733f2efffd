"""Per-token signals of many texts under one model, as NumPy arrays (no torch here).

See :mod:`dpaudit.signals` for what they are and how they are computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dpaudit.errors import InputError

#: Version of the ``.npz`` layout of :meth:`TokenSignals.to_arrays`.
FORMAT_VERSION = 1


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view: the caller's array stays writeable, ours cannot be mutated."""
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass(frozen=True, eq=False)
class TokenSignals:
    """Per-token signals of ``n`` texts under one model, padded to a common width.

    Attributes:
        logprob: float32 ``[n, L-1]``; ``logprob[i, t]`` = log p(token t+1 | tokens 0..t)
            of text ``i`` (shifted labels). 0 where ``mask`` is False.
        mask: bool ``[n, L-1]``; True where the predicted token is a real token of the text.
        mean: float32 ``[n, L-1]`` or None; sum_z p(z) log p(z) of the next-token
            distribution at that position (0 where masked).
        std: float32 ``[n, L-1]`` or None; the standard deviation of log p(z) under p.

    ``mean`` and ``std`` are optional so that signals from sources that only expose the
    chosen token's log-probability can still feed every attack but ``min_k_pp``.
    Arrays are stored as read-only views; the dataclass is frozen.
    """

    logprob: np.ndarray
    mask: np.ndarray
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    def __post_init__(self) -> None:
        lp = np.asarray(self.logprob, dtype=np.float32)
        if lp.ndim != 2:
            raise InputError(f"TokenSignals.logprob must be 2-D [n, L-1], got shape {lp.shape}")
        mask = np.asarray(self.mask)
        if mask.dtype != np.bool_:
            if not np.issubdtype(mask.dtype, np.integer):
                raise InputError(f"TokenSignals.mask must be boolean, got dtype {mask.dtype}")
            mask = mask.astype(bool)
        if mask.shape != lp.shape:
            raise InputError(
                f"TokenSignals.mask shape {mask.shape} differs from logprob shape {lp.shape}"
            )
        if (self.mean is None) != (self.std is None):
            raise InputError("TokenSignals.mean and TokenSignals.std must be given together")
        object.__setattr__(self, "logprob", _readonly(lp))
        object.__setattr__(self, "mask", _readonly(mask))
        for field in ("mean", "std"):
            value = getattr(self, field)
            if value is None:
                continue
            arr = np.asarray(value, dtype=np.float32)
            if arr.shape != lp.shape:
                raise InputError(
                    f"TokenSignals.{field} shape {arr.shape} differs from logprob shape {lp.shape}"
                )
            object.__setattr__(self, field, _readonly(arr))

    # -- shape -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of texts."""
        return int(self.logprob.shape[0])

    def __len__(self) -> int:
        return self.n

    @property
    def has_distribution_stats(self) -> bool:
        """True when ``mean`` and ``std`` are present (Min-K%++ needs them)."""
        return self.mean is not None

    def __repr__(self) -> str:
        stats = ", with mean/std" if self.has_distribution_stats else ""
        return f"TokenSignals(n={self.n}, width={self.logprob.shape[1]}{stats})"

    # -- per-text summaries --------------------------------------------------------------
    def token_count(self) -> np.ndarray:
        """int64 ``[n]``: number of scored tokens of each text."""
        return self.mask.sum(axis=1, dtype=np.int64)

    def sum_logprob(self) -> np.ndarray:
        """float64 ``[n]``: total log-probability of each text's scored tokens."""
        return np.where(self.mask, self.logprob, np.float32(0)).sum(axis=1, dtype=np.float64)

    def mean_logprob(self) -> np.ndarray:
        """float64 ``[n]``: mean scored-token log-probability, i.e. minus the LM loss.

        NaN for a text with no scored token (fewer than two tokens).
        """
        count = self.token_count()
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum_logprob() / count

    # -- subsets and persistence -----------------------------------------------------------
    def select(self, indices: np.ndarray | Sequence[int]) -> "TokenSignals":
        """The signals of a subset of texts (integer indices or a boolean mask), in order."""
        idx = np.asarray(indices)
        if idx.dtype != np.bool_ and not np.issubdtype(idx.dtype, np.integer):
            if idx.size:  # an empty list arrives as float64
                raise InputError(f"select() takes integer indices or a boolean mask, got {idx.dtype}")
            idx = idx.astype(np.int64)
        if idx.dtype == np.bool_ and idx.shape != (self.n,):
            raise InputError(f"boolean mask of shape {idx.shape} for {self.n} texts")

        def pick(a):
            return None if a is None else a[idx]

        return TokenSignals(
            logprob=pick(self.logprob), mask=pick(self.mask), mean=pick(self.mean), std=pick(self.std)
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays of an ``.npz`` file (:meth:`from_arrays` reads them back)."""
        out = {
            "format_version": np.asarray(FORMAT_VERSION, dtype=np.int64),
            "logprob": self.logprob,
            "mask": self.mask,
        }
        if self.mean is not None:
            out["mean"] = self.mean
            out["std"] = self.std
        return out

    @classmethod
    def from_arrays(cls, arrays, *, origin: str = "signals") -> "TokenSignals":
        """Inverse of :meth:`to_arrays` (``arrays``: a mapping such as an open ``np.load``);
        an :class:`InputError` names ``origin`` when they are not signals of this format."""
        keys = set(arrays.keys())
        missing = {"logprob", "mask"} - keys
        if missing:
            raise InputError(f"{origin}: not a signals file (missing {', '.join(sorted(missing))})")
        version = int(arrays["format_version"]) if "format_version" in keys else FORMAT_VERSION
        if version != FORMAT_VERSION:
            raise InputError(f"{origin}: signals format version {version}, expected {FORMAT_VERSION}")
        has_stats = "mean" in keys and "std" in keys
        return cls(logprob=arrays["logprob"], mask=arrays["mask"], mean=arrays["mean"] if has_stats else None,
                   std=arrays["std"] if has_stats else None)
