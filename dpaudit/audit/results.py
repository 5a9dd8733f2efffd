"""What a bound computation returns: :class:`BoundResult`, and :class:`AuditReport` (metrics
and every registered bound of one set of canary scores), frozen, with ``summary()`` and
``to_dict()``. The method's paper, arXiv id and soundness come from the registry
(:mod:`dpaudit.audit.catalog`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from dpaudit.audit.catalog import available_bounds, get_bound
from dpaudit.audit.metrics import TprAtFpr
from dpaudit.audit.registry import BoundSpec
from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable

__all__ = ["AuditReport", "BoundResult", "UNREGISTERED_METHODS"]

#: Sound tests that are not functions of counts alone (so not in the registry): method -> (paper, arXiv id).
UNREGISTERED_METHODS: dict[str, tuple[str, str]] = {
    # the epsilon of the smallest-noise member of the claimed DP-SGD family (same q, T) that is rejected
    "claimed_curve": ("Mahloujifar et al. 2024, claimed DP-SGD family", "2410.22235"),
}


def _spec_or_none(method: str) -> BoundSpec | None:
    return get_bound(method) if method in available_bounds() else None


@dataclass(frozen=True)
class BoundResult:
    """An epsilon lower bound with everything needed to read (and reproduce) it.

    ``num_canaries`` is the m the bound was evaluated on (the evaluating part for a
    split). ``num_guesses`` / ``num_correct`` are set for one-run bounds;
    ``details`` holds k+ / k-, or the threshold and confusion counts, mu where it
    applies, the per-test significance and the candidates tried.

    ``sound`` (from the registry unless given) says whether ``epsilon`` is a lower bound
    that holds for any (epsilon, delta)-DP mechanism; when False it is an estimate under
    the method's assumption (a Gaussian trade-off curve for "one_run_fdp" and "gdp"),
    and :meth:`summary` says so instead of "epsilon >=".
    """

    method: str
    epsilon: float
    delta: float
    significance: float
    num_canaries: int
    num_guesses: int | None
    num_correct: int | None
    strategy: dict
    details: dict = field(default_factory=dict)
    sound: bool | None = None

    def __post_init__(self):
        if self.sound is None:
            spec = _spec_or_none(self.method)
            object.__setattr__(self, "sound", bool(spec.sound) if spec is not None else False)
        elif not isinstance(self.sound, bool | np.bool_):
            raise InputError(f"sound must be True or False, got {self.sound!r}")
        else:
            object.__setattr__(self, "sound", bool(self.sound))

    @property
    def confidence(self) -> float:
        return 1.0 - self.significance

    @property
    def paper(self) -> str:
        spec = _spec_or_none(self.method)
        return spec.paper if spec is not None else UNREGISTERED_METHODS.get(self.method, ("", None))[0]

    @property
    def arxiv(self) -> str | None:
        spec = _spec_or_none(self.method)
        return spec.arxiv if spec is not None else UNREGISTERED_METHODS.get(self.method, ("", None))[1]

    def summary(self) -> str:
        if self.sound:
            head = (
                f"{self.method} ({self.paper}): epsilon >= {self.epsilon:.3f} at delta={self.delta:g}, "
                f"{self.confidence:.0%} confidence"
            )
        else:
            spec = _spec_or_none(self.method)
            assumes = (spec.assumes if spec is not None else None) or "the method's assumptions"
            head = (
                f"{self.method} ({self.paper}): epsilon estimate {self.epsilon:.3f} at delta={self.delta:g} "
                f"under {assumes} (not a sound lower bound)"
            )
        d = self.details
        if self.num_guesses is not None:
            body = (
                f"m={self.num_canaries}, {self.num_guesses} guesses "
                f"(k+={d.get('k_plus')}, k-={d.get('k_minus')}), {self.num_correct} correct"
            )
        else:
            thr = d.get("threshold")
            body = (
                f"n={self.num_canaries}, threshold "
                f"{'-inf' if thr is None else format(thr, '.4g')}: "
                f"TP={d.get('tp')} FP={d.get('fp')} TN={d.get('tn')} FN={d.get('fn')}"
            )
        if "mu" in d:
            body += f", mu >= {d['mu']:.3f}"
            if not self.sound:
                body += f" ({self.confidence:.0%} confidence)"
        strat = self.strategy.get("name")
        if strat == "bonferroni":
            body += f"; Bonferroni over {d.get('num_candidates')} candidates"
        elif strat == "split":
            body += f"; chosen on a {self.strategy.get('fraction'):g} split (seed {self.strategy.get('seed')})"
        return f"{head}; {body}"

    __str__ = summary

    @classmethod
    def from_dict(cls, d) -> BoundResult:
        """Inverse of :meth:`to_dict` (its extra keys, paper and arXiv id, are the registry's;
        a missing ``sound`` is the registry's too)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        kwargs.setdefault("strategy", {})
        kwargs.setdefault("details", {})
        for k in ("num_guesses", "num_correct"):
            kwargs.setdefault(k, None)
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return jsonable(
            {
                "method": self.method,
                "paper": self.paper,
                "arxiv": self.arxiv,
                "sound": self.sound,
                "epsilon": self.epsilon,
                "delta": self.delta,
                "significance": self.significance,
                "num_canaries": self.num_canaries,
                "num_guesses": self.num_guesses,
                "num_correct": self.num_correct,
                "strategy": self.strategy,
                "details": self.details,
            }
        )


@dataclass(frozen=True)
class AuditReport:
    """Metrics and every registered bound of one :class:`CanaryScores`, frozen."""

    num_members: int
    num_nonmembers: int
    auc: float
    balanced_accuracy: float
    tpr_at_fpr: tuple[TprAtFpr, ...]
    bounds: tuple[BoundResult, ...]
    delta: float
    significance: float
    seed: int

    def bound(self, method: str) -> BoundResult:
        for b in self.bounds:
            if b.method == method:
                return b
        raise KeyError(method)

    def summary(self) -> str:
        lines = [
            f"canaries: {self.num_members} members, {self.num_nonmembers} non-members "
            "(scores: higher = member)",
            f"AUC: {self.auc:.4f}   best balanced accuracy: {self.balanced_accuracy:.4f}",
        ]
        lines += [f"  {t.summary()}" for t in self.tpr_at_fpr]
        lines.append(
            f"epsilon at delta={self.delta:g}, {1 - self.significance:.0%} confidence "
            "(lower bounds, except the estimates marked as such):"
        )
        lines += [f"  {b.summary()}" for b in self.bounds]
        return "\n".join(lines)

    __str__ = summary

    def to_dict(self) -> dict:
        return jsonable(
            {
                "num_members": self.num_members,
                "num_nonmembers": self.num_nonmembers,
                "score_convention": "higher = member",
                "auc": self.auc,
                "balanced_accuracy": self.balanced_accuracy,
                "tpr_at_fpr": [t.to_dict() for t in self.tpr_at_fpr],
                "bounds": [b.to_dict() for b in self.bounds],
                "delta": self.delta,
                "significance": self.significance,
                "seed": self.seed,
            }
        )

    def to_dataframe(self):
        """The bounds as a pandas DataFrame (pandas is imported only here)."""
        import pandas as pd  # lazy: dpaudit.audit itself needs only NumPy and SciPy

        rows = []
        for b in self.bounds:
            rows.append(
                {
                    "method": b.method,
                    "sound": b.sound,
                    "epsilon": b.epsilon,
                    "mu": b.details.get("mu"),
                    "delta": b.delta,
                    "significance": b.significance,
                    "num_canaries": b.num_canaries,
                    "num_guesses": b.num_guesses,
                    "num_correct": b.num_correct,
                    "strategy": b.strategy.get("name"),
                }
            )
        return pd.DataFrame(rows)
