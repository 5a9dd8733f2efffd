"""Membership-attack metrics: ROC curve, AUC, TPR at low FPR, balanced accuracy, bootstrap.

Convention (checked at construction of every input): scores are 1-D, finite and
non-empty, and a *higher* score means "member". A threshold t predicts "member" for
every score >= t.

TPR at FPR a is the largest TPR among ROC points whose FPR is <= a (no interpolation).
It is only reported when there are at least ``ceil(10 / a)`` non-members, so that the
FPR a corresponds to ten or more false positives; otherwise the result is a
:class:`TprAtFpr` whose ``value`` is ``None`` (JSON ``null``) and whose text says
"not enough non-members". It is never silently reported as 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpaudit.audit._validation import as_fpr, as_scores
from dpaudit.errors import InputError

__all__ = [
    "RocCurve",
    "TprAtFpr",
    "ConfidenceInterval",
    "MIN_FALSE_POSITIVES",
    "required_nonmembers",
    "roc_curve",
    "auc",
    "tpr_at_fpr",
    "balanced_accuracy",
    "bootstrap_ci",
]

#: TPR at FPR a needs at least MIN_FALSE_POSITIVES / a non-members.
MIN_FALSE_POSITIVES = 10


def required_nonmembers(fpr: float) -> int:
    """Number of non-members needed to report TPR at ``fpr``: ceil(10 / fpr)."""
    fpr = as_fpr(fpr)
    # Round first so that 10 / 0.001 = 10000.000000000002 does not become 10001.
    return int(math.ceil(round(MIN_FALSE_POSITIVES / fpr, 9)))


@dataclass(frozen=True)
class RocCurve:
    """ROC points, from (0, 0) at threshold +inf to (1, 1) at the lowest score.

    ``thresholds[i]`` predicts "member" for scores >= thresholds[i]; ``fpr[i]`` and
    ``tpr[i]`` are the resulting rates. Tied scores move together.
    """

    fpr: np.ndarray
    tpr: np.ndarray
    thresholds: np.ndarray
    num_members: int
    num_nonmembers: int

    def to_dict(self) -> dict:
        return {
            "fpr": self.fpr.tolist(),
            "tpr": self.tpr.tolist(),
            # JSON has no infinity: the first threshold (+inf) is written as null.
            "thresholds": [None if not math.isfinite(t) else float(t) for t in self.thresholds],
            "num_members": self.num_members,
            "num_nonmembers": self.num_nonmembers,
        }


@dataclass(frozen=True)
class TprAtFpr:
    """TPR at a target FPR, or an explicit "not enough non-members".

    ``value`` is the largest TPR whose FPR <= ``fpr``, or ``None`` when fewer than
    ``required_nonmembers`` non-members were given (``enough`` is then False).
    ``threshold`` is the score threshold achieving it (None if not reported).
    """

    fpr: float
    value: float | None
    threshold: float | None
    num_nonmembers: int
    required_nonmembers: int

    @property
    def enough(self) -> bool:
        return self.value is not None

    def summary(self) -> str:
        if self.value is None:
            return (
                f"TPR@FPR={self.fpr:g}: not enough non-members "
                f"(have {self.num_nonmembers}, need {self.required_nonmembers})"
            )
        return f"TPR@FPR={self.fpr:g}: {self.value:.4f}"

    __str__ = summary

    def to_dict(self) -> dict:
        return {
            "fpr": self.fpr,
            "value": self.value,
            "threshold": self.threshold,
            "enough_nonmembers": self.enough,
            "num_nonmembers": self.num_nonmembers,
            "required_nonmembers": self.required_nonmembers,
        }


@dataclass(frozen=True)
class ConfidenceInterval:
    """A seeded percentile-bootstrap confidence interval for a metric.

    Members and non-members are resampled separately, with replacement. ``low`` and
    ``high`` are None when the metric is undefined (e.g. TPR at an FPR with too few
    non-members); ``note`` then says why.
    """

    metric: str
    estimate: float | None
    low: float | None
    high: float | None
    confidence: float
    num_samples: int
    seed: int | None
    note: str = ""

    def summary(self) -> str:
        if self.low is None:
            return f"{self.metric}: {self.note or 'undefined'}"
        return (
            f"{self.metric}: {self.estimate:.4f} "
            f"[{self.low:.4f}, {self.high:.4f}] ({self.confidence:.0%} bootstrap, n={self.num_samples})"
        )

    __str__ = summary

    def to_dict(self) -> dict:
        return {
            "metric": self.metric,
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "num_samples": self.num_samples,
            "seed": self.seed,
            "note": self.note,
        }


# ------------------------------------------------------------------------ core math
def _counts(in_scores: np.ndarray, out_scores: np.ndarray):
    """Distinct thresholds (descending) and cumulative TP / FP counts at each (>= t)."""
    scores = np.concatenate([in_scores, out_scores])
    is_in = np.concatenate([np.ones(in_scores.size, bool), np.zeros(out_scores.size, bool)])
    order = np.argsort(-scores, kind="stable")
    scores, is_in = scores[order], is_in[order]
    tp = np.cumsum(is_in)
    fp = np.cumsum(~is_in)
    # Keep the last index of every run of equal scores so that ties move together.
    last = np.r_[scores[1:] != scores[:-1], True]
    return scores[last], tp[last], fp[last]


def roc_curve(*, in_scores, out_scores) -> RocCurve:
    """The ROC curve of the test "member iff score >= t" over all distinct t."""
    ins, outs = as_scores("in_scores", in_scores), as_scores("out_scores", out_scores)
    return _roc(ins, outs)


def _roc(ins: np.ndarray, outs: np.ndarray) -> RocCurve:
    thresholds, tp, fp = _counts(ins, outs)
    return RocCurve(
        fpr=np.r_[0.0, fp / outs.size],
        tpr=np.r_[0.0, tp / ins.size],
        thresholds=np.r_[np.inf, thresholds],
        num_members=int(ins.size),
        num_nonmembers=int(outs.size),
    )


def auc(*, in_scores, out_scores) -> float:
    """Area under the ROC curve: P[in > out] + P[in == out] / 2 (Mann-Whitney U / n_in n_out)."""
    return _auc(as_scores("in_scores", in_scores), as_scores("out_scores", out_scores))


def _auc(ins: np.ndarray, outs: np.ndarray) -> float:
    # U counts, for each member, the non-members below it, ties as one half (both sorted: the
    # searches then walk memory in order, twice as fast as average ranks at 10^6 scores)
    outs, ins = np.sort(outs), np.sort(ins)
    below, up_to = np.searchsorted(outs, ins, side="left"), np.searchsorted(outs, ins, side="right")
    u = below.sum() + 0.5 * (up_to - below).sum()
    return float(u / (ins.size * outs.size))


def tpr_at_fpr(*, in_scores, out_scores, fpr: float) -> TprAtFpr:
    """Largest TPR whose FPR <= ``fpr``; "not enough non-members" below ceil(10/fpr)."""
    ins, outs = as_scores("in_scores", in_scores), as_scores("out_scores", out_scores)
    return _tpr_at_fpr(_roc(ins, outs), as_fpr(fpr))


def _tpr_at_fpr(roc: RocCurve, fpr: float) -> TprAtFpr:
    need = required_nonmembers(fpr)
    if roc.num_nonmembers < need:
        return TprAtFpr(fpr, None, None, roc.num_nonmembers, need)
    # fpr counts are integers / n: compare counts to avoid float round-off.
    ok = np.flatnonzero(np.rint(roc.fpr * roc.num_nonmembers) <= math.floor(fpr * roc.num_nonmembers + 1e-9))
    best = ok[np.argmax(roc.tpr[ok])]  # tpr is non-decreasing, so this is the last ok point
    thr = float(roc.thresholds[best])
    return TprAtFpr(fpr, float(roc.tpr[best]), thr if math.isfinite(thr) else None, roc.num_nonmembers, need)


def balanced_accuracy(*, in_scores, out_scores) -> float:
    """Best balanced accuracy over thresholds: max_t (TPR(t) + 1 - FPR(t)) / 2.

    A descriptive metric (the threshold is chosen on the same scores); it is not used
    for any epsilon bound.
    """
    ins, outs = as_scores("in_scores", in_scores), as_scores("out_scores", out_scores)
    return _balanced_accuracy(_roc(ins, outs))


def _balanced_accuracy(roc: RocCurve) -> float:
    return float(np.max((roc.tpr + 1.0 - roc.fpr) / 2.0))


_NAMED_METRICS = ("auc", "balanced_accuracy", "tpr_at_fpr")


def _metric_fn(metric, fpr) -> tuple[str, Callable[[np.ndarray, np.ndarray], float | None]]:
    if callable(metric):
        return getattr(metric, "__name__", "metric"), metric
    if metric == "auc":
        return "auc", _auc
    if metric == "balanced_accuracy":
        return "balanced_accuracy", lambda i, o: _balanced_accuracy(_roc(i, o))
    if metric == "tpr_at_fpr":
        if fpr is None:
            raise InputError("metric 'tpr_at_fpr' needs fpr=")
        fpr = as_fpr(fpr)
        return f"tpr_at_fpr({fpr:g})", lambda i, o: _tpr_at_fpr(_roc(i, o), fpr).value
    raise InputError(f"unknown metric {metric!r}; use one of {_NAMED_METRICS} or a callable")


def bootstrap_ci(
    *,
    in_scores,
    out_scores,
    metric="auc",
    fpr: float | None = None,
    num_samples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
    in_units=None,
    out_units=None,
) -> ConfidenceInterval:
    """Percentile-bootstrap confidence interval of a metric, seeded.

    ``metric`` is "auc", "balanced_accuracy", "tpr_at_fpr" (with ``fpr=``) or a
    callable ``f(in_scores, out_scores) -> float``. Members and non-members are
    resampled separately with replacement, ``num_samples`` times, from
    ``numpy.random.default_rng(seed)``. The interval covers the central ``confidence``
    mass of the resampled metric.

    ``in_units`` / ``out_units`` (one key per score, both or neither): a cluster bootstrap,
    which resamples whole units (a patient with all their notes) rather than scores, since
    the records of one unit are not independent (Field and Welsh 2007, "Bootstrapping
    clustered data", doi 10.1111/j.1467-9868.2007.00593.x).
    """
    ins, outs = as_scores("in_scores", in_scores), as_scores("out_scores", out_scores)
    if (in_units is None) != (out_units is None):
        raise InputError("in_units and out_units go together (a cluster bootstrap of both sides)")
    clusters = None
    if in_units is not None:
        clusters = [_clusters(units, n, side) for units, n, side in ((in_units, ins.size, "in_units"),
                                                                     (out_units, outs.size, "out_units"))]
    name, fn = _metric_fn(metric, fpr)
    if isinstance(num_samples, bool) or int(num_samples) != num_samples or num_samples < 2:
        raise InputError(f"num_samples must be an integer >= 2, got {num_samples!r}")
    num_samples = int(num_samples)
    if not 0.0 < float(confidence) < 1.0:
        raise InputError(f"confidence must be in (0, 1), got {confidence}")
    estimate = fn(ins, outs)
    if estimate is None:
        note = "not enough non-members" if metric == "tpr_at_fpr" else "metric undefined on these scores"
        return ConfidenceInterval(name, None, None, None, float(confidence), num_samples, seed, note)
    rng = np.random.default_rng(seed)
    values = np.empty(num_samples)
    for b in range(num_samples):
        if clusters is None:
            i_b = ins[rng.integers(0, ins.size, ins.size)]
            o_b = outs[rng.integers(0, outs.size, outs.size)]
        else:
            i_b, o_b = (scores[_resample_clusters(members, rng)] for scores, members in zip((ins, outs), clusters))
        value = fn(i_b, o_b)
        values[b] = np.nan if value is None else value
    values = values[np.isfinite(values)]
    if values.size == 0:
        return ConfidenceInterval(name, float(estimate), None, None, float(confidence), num_samples, seed,
                                  "metric undefined on every resample")
    tail = (1.0 - float(confidence)) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return ConfidenceInterval(
        name, float(estimate), float(low), float(high), float(confidence), num_samples, seed
    )


def _clusters(units, n: int, what: str) -> list[np.ndarray]:
    """The score indices of each distinct unit of ``units`` (first-seen order)."""
    units = list(units)
    if len(units) != n:
        raise InputError(f"{what} must give one unit per score: {len(units)} for {n} scores")
    index: dict = {}
    for i, u in enumerate(units):
        index.setdefault(u, []).append(i)
    return [np.asarray(ix, dtype=np.int64) for ix in index.values()]


def _resample_clusters(clusters: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """The score indices of ``len(clusters)`` units drawn with replacement, all records of each."""
    if not clusters:
        return np.zeros(0, dtype=np.int64)
    drawn = rng.integers(0, len(clusters), len(clusters))
    return np.concatenate([clusters[j] for j in drawn])
