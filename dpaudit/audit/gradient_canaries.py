"""White-box gradient canaries: what one DP-SGD run with canaries leaves, and its sampler check.

A run with ``train.dp.gradient_canaries: M`` (:mod:`dpaudit.train.gradient_canaries`) adds M
Dirac canary gradients of norm C, each on one coordinate of its own that no data example
reaches, to the clipped sum of every step before the noise (Steinke, Nasr, Jagielski 2023,
"Privacy Auditing with One (1) Training Run", arXiv 2305.08846, Sect. 6: white-box canaries
in the all-iterates setting). Each canary is a member with probability 1/2 (drawn once), and
a member is in each step's sum independently with the run's Poisson rate q, like a protected
unit. The score of canary i is the sum over the T steps of the released noisy sum's
coordinate i (its projection on the canary's direction): for a correct engine

    score_i = C k_i + N(0, T sigma^2 C^2),     k_i ~ Binomial(T, q) for a member, 0 otherwise,

so the M canaries are M independent, exact copies of the claimed Poisson-subsampled Gaussian
mechanism, and the one-run bounds on the members' against the non-members' scores
(:class:`~dpaudit.audit.CanaryScores`, :func:`~dpaudit.audit.claimed_curve_bound`) test the
claim. That holds only if the inclusions follow the claimed sampler: a canary included more
often than a protected unit would be is not the claimed mechanism, and a bound from it is
unsound. :func:`inclusion_check` tests this, and a white-box bound must be refused when it
fails.

:class:`GradientCanaryRecord` is the frozen result (one codec: :meth:`~GradientCanaryRecord.to_arrays`
/ :meth:`~GradientCanaryRecord.from_arrays`, the model directory's ``gradient_canaries.npz``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpaudit.audit.canary_scores import CanaryScores
from dpaudit.errors import InputError

__all__ = ["P_VALUE_THRESHOLD", "SCHEMA_VERSION", "GradientCanaryRecord", "inclusion_check"]

SCHEMA_VERSION = 1
P_VALUE_THRESHOLD = 1e-3  # per test, two-sided, as the training run's batch-size check


@dataclass(frozen=True, eq=False)
class GradientCanaryRecord:
    """The gradient canaries of one training run.

    Attributes:
      included: bool[M], canary i was a member (drawn once, probability 1/2).
      scores: float64[M], the sum over steps of the released noisy sum's coordinate i.
      inclusions: int64[M], the number of steps whose sum canary i was in.
      steps: T, the number of steps the scores sum over.
      sample_rate: q, the claimed Poisson rate the inclusions were drawn with.
      max_grad_norm: C, the norm of every canary gradient.

    The arrays are read-only copies.
    """

    included: np.ndarray
    scores: np.ndarray
    inclusions: np.ndarray
    steps: int
    sample_rate: float
    max_grad_norm: float

    def __post_init__(self):
        included = np.array(self.included, dtype=bool, copy=True).reshape(-1)
        scores = np.array(self.scores, dtype=np.float64, copy=True).reshape(-1)
        raw = np.asarray(self.inclusions)
        if raw.size and not np.issubdtype(raw.dtype, np.integer):
            raise InputError(f"gradient canary inclusions must be integers, got {raw.dtype}")
        inclusions = np.array(raw, dtype=np.int64, copy=True).reshape(-1)
        if not (included.size == scores.size == inclusions.size) or included.size == 0:
            raise InputError("gradient canaries: included, scores and inclusions must be non-empty and of one "
                             f"length, got {included.size}, {scores.size}, {inclusions.size}")
        if not np.isfinite(scores).all():
            raise InputError("gradient canary scores must be finite")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int | np.integer) or self.steps < 0:
            raise InputError(f"gradient canaries: steps must be an integer >= 0, got {self.steps!r}")
        if not 0 < float(self.sample_rate) <= 1:
            raise InputError(f"gradient canaries: sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if not 0 < float(self.max_grad_norm) < math.inf:
            raise InputError(f"gradient canaries: max_grad_norm must be finite and > 0, got {self.max_grad_norm!r}")
        for name, array in (("included", included), ("scores", scores), ("inclusions", inclusions)):
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        object.__setattr__(self, "steps", int(self.steps))
        object.__setattr__(self, "sample_rate", float(self.sample_rate))
        object.__setattr__(self, "max_grad_norm", float(self.max_grad_norm))

    @property
    def num_canaries(self) -> int:
        return int(self.included.size)

    @property
    def num_members(self) -> int:
        return int(self.included.sum())

    def canary_scores(self, *, seed: int = 0) -> CanaryScores:
        """The members' and the non-members' scores, for the one-run bounds (higher = member).
        Check :func:`inclusion_check` before reporting a bound from them."""
        return CanaryScores.from_labels(scores=self.scores, is_member=self.included, seed=seed)

    def __repr__(self) -> str:
        return (f"GradientCanaryRecord(num_canaries={self.num_canaries}, num_members={self.num_members}, "
                f"steps={self.steps}, sample_rate={self.sample_rate:.6g}, max_grad_norm={self.max_grad_norm:g})")

    # -- the codec: the arrays of ``gradient_canaries.npz`` ---------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays (no object dtype), for ``numpy.savez``."""
        return {
            "schema_version": np.asarray(SCHEMA_VERSION, dtype=np.int64),
            "included": self.included,
            "scores": self.scores,
            "inclusions": self.inclusions,
            "steps": np.asarray(self.steps, dtype=np.int64),
            "sample_rate": np.asarray(self.sample_rate, dtype=np.float64),
            "max_grad_norm": np.asarray(self.max_grad_norm, dtype=np.float64),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> GradientCanaryRecord:
        """The record of :meth:`to_arrays` (or of an ``np.load`` of its file); an
        :class:`~dpaudit.errors.InputError` for a missing key or another schema version."""
        missing = [k for k in ("schema_version", "included", "scores", "inclusions", "steps", "sample_rate",
                               "max_grad_norm") if k not in arrays]
        if missing:
            raise InputError(f"gradient canaries: missing {', '.join(missing)}")
        version = int(np.asarray(arrays["schema_version"]))
        if version != SCHEMA_VERSION:
            raise InputError(f"gradient canaries: schema version {version}, this dpaudit reads {SCHEMA_VERSION}")
        return cls(included=np.asarray(arrays["included"]), scores=np.asarray(arrays["scores"]),
                   inclusions=np.asarray(arrays["inclusions"]), steps=int(np.asarray(arrays["steps"])),
                   sample_rate=float(np.asarray(arrays["sample_rate"])),
                   max_grad_norm=float(np.asarray(arrays["max_grad_norm"])))


def _two_sided_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2.0)) if math.isfinite(z) else 0.0


def inclusion_check(record: GradientCanaryRecord, *, p_value_threshold: float = P_VALUE_THRESHOLD) -> tuple[bool, str]:
    """Whether the canaries' inclusions follow the claimed sampler: ``(consistent, detail)``.

    Refused (False) when a non-member was ever included, a count is outside [0, T], or the
    members' counts k_1..k_n are not Binomial(T, q) each: their sample mean and sample
    variance, each as a z-score against Binomial(T, q) (variance T q (1 - q), fourth central
    moment T q (1 - q) (1 + 3 (T - 2) q (1 - q)); the variance of the sample variance is about
    (m4 - s^4 (n - 3) / (n - 1)) / n), two-sided normal p-value below ``p_value_threshold``.
    At q = 1 every member must be in every step. Too frequent inclusion (e.g. at rate 2q)
    moves the mean; shared draws (all members in or out together) shrink the variance.

    A white-box bound must be refused when this is False: the canaries are then not the
    claimed mechanism (Steinke et al. 2023, arXiv 2305.08846, need it to be)."""
    if not isinstance(record, GradientCanaryRecord):
        raise InputError(f"inclusion_check needs a GradientCanaryRecord, got {type(record).__name__}")
    if not 0 < p_value_threshold < 1:
        raise InputError(f"p_value_threshold must be in (0, 1), got {p_value_threshold!r}")
    T, q = record.steps, record.sample_rate
    counts = record.inclusions
    outside = int(((counts < 0) | (counts > T)).sum())
    if outside:
        return False, f"{outside} canaries have an inclusion count outside [0, T={T}]"
    leaked = int((counts[~record.included] > 0).sum())
    if leaked:
        return False, f"{leaked} non-member canaries were included (a non-member must never be)"
    members = counts[record.included].astype(np.float64)
    n = members.size
    reference = f"Binomial(T={T}, q={q:.6g})"
    if n == 0 or T == 0:
        return True, f"nothing to test ({n} members, {T} steps); no non-member included"
    var = T * q * (1 - q)
    mean = float(members.mean())
    if var == 0:  # q = 1: every member in every step
        short = int((members != T).sum())
        if short:
            return False, f"q = 1 but {short} of {n} members were left out of some step"
        return True, f"q = 1: all {n} members in all {T} steps; no non-member included"
    mean_z = (mean - T * q) / math.sqrt(var / n)
    tests = [("mean", mean, T * q, mean_z)]
    if n > 1:
        m4 = var * (1 + 3 * (T - 2) * q * (1 - q))
        var_of_var = (m4 - var**2 * (n - 3) / (n - 1)) / n
        sample_var = float(members.var(ddof=1))
        tests.append(("variance", sample_var, var, (sample_var - var) / math.sqrt(max(var_of_var, 1e-300))))
    parts, consistent = [], True
    for name, value, expected, z in tests:
        p = _two_sided_p(z)
        consistent &= p >= p_value_threshold
        parts.append(f"{name} {value:.6g} (expected {expected:.6g}, z {z:.3g}, p {p:.3g})")
    verdict = "consistent with" if consistent else f"refused (p < {p_value_threshold:g}) against"
    return bool(consistent), (f"inclusions of {n} members {verdict} {reference}: {', '.join(parts)}; "
                              "no non-member included")
