"""Who pays for the privacy: per-group statistics with intervals over units, in NumPy only.

DP-SGD clips every unit's gradient to one norm C, and clipping shrinks the atypical units
most: their gradients are the largest. So a rare group gets less of its signal into the
model, and pays more utility for the same epsilon (Bagdasaryan, Poursaeed, Shmatikov 2019,
"Differential privacy has disparate impact on model accuracy", arXiv 1905.12101), while a
model trained without DP memorizes rare examples the most (Feldman 2020, "Does learning
require memorization? A short tale about a long tail", arXiv 1906.05271), and removing the
most exposed records exposes the next layer (Carlini et al. 2022, "The privacy onion
effect", arXiv 2206.10469). Li et al. 2021 (arXiv 2110.05679) show DP fine-tuning of a
pretrained base works with large batches and few steps; whether it works for every group
is what these statistics ask.

Every statistic is an estimate with a percentile-bootstrap interval over *units*: the
records of one unit (a patient's notes) are not independent, so a unit is resampled with
all its records (a cluster bootstrap), and the interval covers its stated ``confidence``
when the units are independent draws of their group (checked in a simulation by the tests).

- :func:`ratio_estimate`: a ratio of sums over units, ``sum(numerator) / sum(denominator)``
  (tokens' negative log-likelihood per token, clipped unit-steps per sampled unit-step,
  pre-clipping norm per sampled unit-step, extracted notes per note), optionally through a
  monotone ``transform`` (``exp``: perplexity).
- :func:`perplexity_ratio`: one group's perplexity over another's, the two resampled
  independently.
- :func:`membership`: AUC and TPR at FPR of a membership attack on one group's members
  against its held-out records, units resampled on each side; TPR at FPR a only with at least
  ``ceil(10 / a)`` non-member records (:func:`~dpaudit.audit.metrics.required_nonmembers`),
  any of them only with at least :data:`MIN_UNITS` units on each side.
- :class:`UnitClipping`: what one DP-SGD run saw of each training unit (how often it was
  sampled, how often clipped, the sum of its pre-clipping gradient norms), one codec
  (``unit_clipping.npz``); :func:`clipping` turns it into a group's shares.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpaudit.audit.metrics import required_nonmembers
from dpaudit.errors import InputError

__all__ = ["MIN_UNITS", "NUM_SAMPLES", "Estimate", "UnitClipping", "by_unit", "clipping", "membership",
           "perplexity_ratio", "ratio_estimate", "resample_counts"]

#: A group's membership metrics need this many units on each side (members, held-out): a
#: bootstrap over fewer units says little about the group.
MIN_UNITS = 10
#: Bootstrap replicates of every interval.
NUM_SAMPLES = 1000


@dataclass(frozen=True)
class Estimate:
    """A statistic of a group: ``value`` with its percentile-bootstrap interval [``low``,
    ``high``] at ``confidence`` over ``units`` resampled units; all None with a ``note`` when
    it cannot be estimated."""

    value: float | None
    low: float | None
    high: float | None
    units: int
    confidence: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "units": self.units,
                "confidence": self.confidence, "note": self.note}

    @classmethod
    def missing(cls, note: str, *, units: int = 0, confidence: float = 0.95) -> Estimate:
        return cls(None, None, None, units, confidence, note)


def _check(confidence: float, num_samples: int) -> None:
    if not 0.0 < float(confidence) < 1.0:
        raise InputError(f"confidence must be in (0, 1), got {confidence}")
    if isinstance(num_samples, bool) or int(num_samples) != num_samples or num_samples < 2:
        raise InputError(f"num_samples must be an integer >= 2, got {num_samples!r}")


def resample_counts(num_units: int, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """``(num_samples, num_units)`` counts: how often each unit is drawn in each bootstrap
    replicate (``num_units`` draws with replacement)."""
    if num_units == 0:
        return np.zeros((num_samples, 0), dtype=np.int64)
    return rng.multinomial(num_units, np.full(num_units, 1.0 / num_units), size=num_samples)


def _interval(values: np.ndarray, confidence: float) -> tuple[float | None, float | None]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def by_unit(units: Sequence[Any], *columns: Sequence[float]) -> tuple[list, list[np.ndarray]]:
    """``(unit keys in first-seen order, [each column summed per unit])``: the records of a
    unit folded into one row, the input of the bootstraps over units."""
    keys: dict[Any, int] = {}
    index = np.fromiter((keys.setdefault(u, len(keys)) for u in units), dtype=np.int64, count=len(units))
    sums = [np.bincount(index, weights=np.asarray(c, dtype=np.float64), minlength=len(keys)) for c in columns]
    return list(keys), sums


def ratio_estimate(numerator, denominator, *, confidence: float = 0.95, num_samples: int = NUM_SAMPLES,
                   seed: int = 0, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> Estimate:
    """``transform(sum(numerator) / sum(denominator))`` over units (one entry of each per
    unit), with the percentile interval of ``num_samples`` bootstrap replicates that resample
    the units with replacement (``numpy.random.default_rng(seed)``). ``transform`` must be
    increasing (``numpy.exp``: a perplexity from NLL per token). No estimate without units or
    with a zero denominator."""
    _check(confidence, num_samples)
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    if num.shape != den.shape or num.ndim != 1:
        raise InputError(f"numerator and denominator must be 1-D of one length, got {num.shape} and {den.shape}")
    n = num.size
    if n == 0 or den.sum() <= 0:
        return Estimate.missing("no units" if n == 0 else "nothing to divide by", units=n, confidence=confidence)
    f = transform if transform is not None else (lambda x: x)
    value = float(f(np.asarray(num.sum() / den.sum())))
    counts = resample_counts(n, int(num_samples), np.random.default_rng(seed)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        replicates = f((counts @ num) / (counts @ den))
    low, high = _interval(np.asarray(replicates, dtype=np.float64), confidence)
    return Estimate(value, low, high, n, float(confidence))


def perplexity_ratio(nll_a, tokens_a, nll_b, tokens_b, *, confidence: float = 0.95,
                     num_samples: int = NUM_SAMPLES, seed: int = 0) -> Estimate:
    """Group a's perplexity over group b's, ``exp(nll_a / tokens_a - nll_b / tokens_b)``
    (sums over each group's units, one entry per unit), with a percentile interval from
    independent bootstraps of the two groups' units. ``units``: a's."""
    _check(confidence, num_samples)
    parts = [np.asarray(x, dtype=np.float64) for x in (nll_a, tokens_a, nll_b, tokens_b)]
    if parts[0].size == 0 or parts[2].size == 0 or parts[1].sum() <= 0 or parts[3].sum() <= 0:
        return Estimate.missing("a group without units", units=int(parts[0].size), confidence=confidence)
    rng = np.random.default_rng(seed)
    ca = resample_counts(parts[0].size, int(num_samples), rng).astype(np.float64)
    cb = resample_counts(parts[2].size, int(num_samples), rng).astype(np.float64)
    value = math.exp(parts[0].sum() / parts[1].sum() - parts[2].sum() / parts[3].sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        replicates = np.exp((ca @ parts[0]) / (ca @ parts[1]) - (cb @ parts[2]) / (cb @ parts[3]))
    low, high = _interval(replicates, confidence)
    return Estimate(value, low, high, int(parts[0].size), float(confidence))


# --------------------------------------------------------------------------- membership


def _from_ci(ci, units: int) -> Estimate:
    """An :class:`Estimate` of a :class:`~dpaudit.audit.metrics.ConfidenceInterval`."""
    if ci.estimate is None:
        return Estimate.missing(ci.note, units=units, confidence=ci.confidence)
    return Estimate(ci.estimate, ci.low, ci.high, units, ci.confidence, ci.note)


def membership(scores, is_member, units, *, fprs: Sequence[float] = (0.01,), confidence: float = 0.95,
               num_samples: int = 200, seed: int = 0, min_units: int = MIN_UNITS) -> dict[str, Any]:
    """A membership attack on one group: its ``scores`` (higher = member) of the group's
    records, ``is_member`` of each and the ``units`` they belong to (a unit is a member or
    held out with all its records). ``{"auc": Estimate, "tpr_at_fpr": {fpr: Estimate},
    "num_in", "num_out", "units_in", "units_out"}`` (record and unit counts), each interval the
    cluster bootstrap of :func:`dpaudit.audit.metrics.bootstrap_ci` over the units of each
    side. "not enough" estimates, never a number, with fewer than ``min_units`` units on a
    side, and for TPR at FPR a with fewer than ``ceil(10 / a)`` non-member records."""
    from dpaudit.audit.metrics import bootstrap_ci

    _check(confidence, num_samples)
    s = np.asarray(scores, dtype=np.float64)
    m = np.asarray(is_member, dtype=bool)
    u = np.asarray([str(x) for x in units], dtype=object)
    if s.ndim != 1 or s.shape != m.shape or u.size != s.size:
        raise InputError("scores, is_member and units must be 1-D of one length")
    if not np.all(np.isfinite(s)):
        raise InputError("membership scores must be finite")
    units_in, units_out = len(set(u[m])), len(set(u[~m]))
    out: dict[str, Any] = {"num_in": int(m.sum()), "num_out": int((~m).sum()), "units_in": units_in,
                           "units_out": units_out}
    total = units_in + units_out
    if min(units_in, units_out) < min_units:
        note = f"not enough units: {units_in} member and {units_out} held-out, {min_units} needed on each side"
        out["auc"] = Estimate.missing(note, units=total, confidence=confidence)
        out["tpr_at_fpr"] = {float(a): Estimate.missing(note, units=total, confidence=confidence) for a in fprs}
        return out
    kw = dict(in_scores=s[m], out_scores=s[~m], in_units=list(u[m]), out_units=list(u[~m]),
              num_samples=int(num_samples), confidence=float(confidence), seed=seed)
    out["auc"] = _from_ci(bootstrap_ci(metric="auc", **kw), total)
    out["tpr_at_fpr"] = {}
    for a in fprs:
        need = required_nonmembers(a)
        if out["num_out"] < need:
            out["tpr_at_fpr"][float(a)] = Estimate.missing(
                f"not enough non-members: {out['num_out']} held-out records, {need} needed", units=total,
                confidence=confidence)
            continue
        out["tpr_at_fpr"][float(a)] = _from_ci(bootstrap_ci(metric="tpr_at_fpr", fpr=a, **kw), total)
    return out


# --------------------------------------------------------------------------- clipping


@dataclass(frozen=True, eq=False)
class UnitClipping:
    """What one DP-SGD run saw of each of its training units (one row per protected unit the
    trainer sampled from: a note at example level, a patient at user level, a canary).

    Attributes:
      unit_ids: str[U], each training unit's ``unit_id`` (at example level the notes of one
        patient share it; a canary's is its id).
      sampled: int64[U], the steps whose batch held the unit.
      clipped: int64[U], the steps at which its pre-clipping gradient norm exceeded the bound.
      norm_sum: float64[U], the sum over those sampled steps of its pre-clipping norm.
      max_grad_norm: C (with adaptive clipping, the bound at the run's start; each step's
        ``clipped`` is against that step's bound).

    The arrays are read-only copies. One codec: :meth:`to_arrays` / :meth:`from_arrays`.
    """

    unit_ids: np.ndarray
    sampled: np.ndarray
    clipped: np.ndarray
    norm_sum: np.ndarray
    max_grad_norm: float

    def __post_init__(self) -> None:
        ids = np.asarray(self.unit_ids).astype(str)
        arrays = {"sampled": np.asarray(self.sampled), "clipped": np.asarray(self.clipped),
                  "norm_sum": np.asarray(self.norm_sum, dtype=np.float64)}
        if ids.ndim != 1 or any(a.shape != ids.shape for a in arrays.values()):
            raise InputError("unit clipping: unit_ids, sampled, clipped and norm_sum must be 1-D of one length")
        for name in ("sampled", "clipped"):
            a = arrays[name]
            if a.size and (not np.issubdtype(a.dtype, np.integer) or a.min() < 0):
                raise InputError(f"unit clipping: {name} must be counts (integers >= 0)")
            arrays[name] = a.astype(np.int64)
        if np.any(arrays["clipped"] > arrays["sampled"]):
            raise InputError("unit clipping: a unit was clipped more often than it was sampled")
        if not np.all(np.isfinite(arrays["norm_sum"])) or np.any(arrays["norm_sum"] < 0):
            raise InputError("unit clipping: norm_sum must be finite and >= 0")
        if not (isinstance(self.max_grad_norm, (int, float)) and self.max_grad_norm > 0):
            raise InputError(f"unit clipping: max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        for name, a in {"unit_ids": ids, **arrays}.items():
            a = np.array(a, copy=True)
            a.setflags(write=False)
            object.__setattr__(self, name, a)
        object.__setattr__(self, "max_grad_norm", float(self.max_grad_norm))

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"unit_ids": self.unit_ids, "sampled": self.sampled, "clipped": self.clipped,
                "norm_sum": self.norm_sum, "max_grad_norm": np.asarray(self.max_grad_norm)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> UnitClipping:
        try:
            return cls(unit_ids=arrays["unit_ids"], sampled=arrays["sampled"], clipped=arrays["clipped"],
                       norm_sum=arrays["norm_sum"], max_grad_norm=float(arrays["max_grad_norm"]))
        except KeyError as err:
            raise InputError(f"unit clipping: missing array {err}") from None


def clipping(record: UnitClipping, keep: Callable[[str], bool], *, confidence: float = 0.95,
             num_samples: int = NUM_SAMPLES, seed: int = 0) -> dict[str, Any]:
    """A group's clipping in one run: its training units are those whose ``unit_id`` passes
    ``keep``; their rows are folded per ``unit_id`` (a patient's notes are one cluster), then
    ``clipped_share`` (clipped unit-steps per sampled unit-step) and ``mean_norm`` (the mean
    pre-clipping gradient norm of a sampled unit-step), each with a bootstrap over units;
    ``sampled`` (unit-steps) and ``units`` (unit ids sampled at least once)."""
    rows = np.fromiter((bool(keep(u)) for u in record.unit_ids), dtype=bool, count=record.unit_ids.size)
    rows &= record.sampled > 0
    keys, (sampled, clipped, norms) = by_unit(record.unit_ids[rows], record.sampled[rows], record.clipped[rows],
                                             record.norm_sum[rows])
    kw = dict(confidence=confidence, num_samples=num_samples, seed=seed)
    return {"units": len(keys), "sampled": int(sampled.sum()),
            "clipped_share": ratio_estimate(clipped, sampled, **kw),
            "mean_norm": ratio_estimate(norms, sampled, **kw)}
