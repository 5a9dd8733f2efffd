"""One object that holds in-canary and out-canary scores and offers every metric and bound.

    >>> from dpaudit.audit import CanaryScores
    >>> scores = CanaryScores(in_scores=[3.1, 2.2, 0.4], out_scores=[0.1, -1.0, 0.3])
    >>> round(scores.auc(), 3)
    1.0

Scores: a *higher* score means "member" (checked: 1-D, finite, non-empty; a warning is
issued when the scores look reversed, i.e. the AUC is significantly below 1/2).

Two kinds of bound, two kinds of data (the caller knows which one they have):

* Threshold bounds -- :meth:`CanaryScores.epsilon_clopper_pearson` (Jagielski et al.
  2020) and :meth:`CanaryScores.epsilon_gdp` (Nasr et al. 2023) -- treat every score as
  the outcome of an independent training run (many runs, or one run whose canaries'
  scores are independent given the threshold).
* One-run bounds -- :meth:`CanaryScores.epsilon_one_run` (Steinke et al. 2023) and
  :meth:`CanaryScores.epsilon_one_run_fdp` (Mahloujifar et al. 2025) -- treat all
  m = n_in + n_out canaries as inserted into one run, each independently with
  probability 1/2. The guesses are the k+ highest scores ("in") and the k- lowest
  ("out"). A tie between a member and a non-member is broken by seeded random keys drawn per
  canary when the canaries' order is known (:meth:`CanaryScores.from_labels`, scores in canary
  order), and against the guesser otherwise: the two arrays of the constructor say which
  canary is a member by where its score sits, so no order of theirs may break a tie.

How the threshold or (k+, k-) is chosen is an explicit :mod:`~dpaudit.audit.strategy`
(default: :class:`~dpaudit.audit.strategy.BonferroniStrategy` over a small grid), applied
by :mod:`~dpaudit.audit.selection`; the uncorrected maximum over thresholds is never
reported. Results are :class:`~dpaudit.audit.results.BoundResult` and
:class:`~dpaudit.audit.results.AuditReport`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np

import dpaudit.audit.metrics as _m
from dpaudit.audit._validation import _check_delta, _check_significance, as_fpr, as_scores
from dpaudit.audit.catalog import METHODS, available_bounds, get_bound
from dpaudit.audit.registry import BoundSpec
from dpaudit.audit.results import AuditReport, BoundResult
from dpaudit.audit.selection import select_guesses, select_threshold
from dpaudit.audit.strategy import DEFAULT_STRATEGY, Strategy
from dpaudit.errors import InputError

__all__ = ["CanaryScores", "BoundResult", "AuditReport", "METHODS", "DEFAULT_FPRS"]

#: FPR levels reported by :meth:`CanaryScores.audit`.
DEFAULT_FPRS: tuple[float, ...] = (0.1, 0.01, 0.001)

# a branch of the seed of its own, so that the keys are not the stream of a caller who drew
# membership from numpy.random.default_rng(seed)
_TIE_KEYS = 0x7469_6573  # b"ties"


def tie_keys(seed: int, m: int) -> np.ndarray:
    """The random keys, one per canary in canary order, that break one-run ties for ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_TIE_KEYS,))).random(m)


# ---------------------------------------------------------------------------- object
class CanaryScores:
    """In-canary and out-canary attack scores, with every metric and bound as a method.

    Args:
      in_scores: scores of canaries that were in the training set (members).
      out_scores: scores of canaries that were not (non-members).
      seed: seeds the random keys that break ties among equal scores when ranking
        canaries for one-run guesses (:func:`tie_keys`), one key per canary in the order
        :meth:`from_labels` was given; with the two arrays of this
        constructor a tie is counted against the guesser instead.

    Higher score = member. Arrays must be 1-D, finite and non-empty.
    """

    def __init__(self, *, in_scores, out_scores, seed: int = 0):
        self._in = as_scores("in_scores", in_scores)
        self._out = as_scores("out_scores", out_scores)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise InputError(f"seed must be an int, got {seed!r}")
        self._seed = int(seed)
        self._canary_order: tuple[np.ndarray, np.ndarray] | None = None  # (scores, is_member) by canary
        self._roc_cache: _m.RocCurve | None = None
        self._warn_if_reversed()

    @classmethod
    def from_labels(cls, *, scores, is_member, seed: int = 0) -> CanaryScores:
        """Build from one score array and a boolean membership array of the same length, in
        an order fixed before membership was drawn (the canaries' own): one-run ties are then
        broken by random keys per canary rather than against the guesser."""
        s = as_scores("scores", scores)
        labels = np.asarray(is_member)
        if labels.shape != s.shape:
            raise InputError(f"is_member must have the shape of scores {s.shape}, got {labels.shape}")
        if labels.dtype != bool:
            if not np.isin(labels, (0, 1)).all():
                raise InputError("is_member must be boolean (or 0/1)")
            labels = labels.astype(bool)
        if labels.all() or not labels.any():
            raise InputError("need at least one member and one non-member")
        out = cls(in_scores=s[labels], out_scores=s[~labels], seed=seed)
        out._canary_order = (s, labels)
        return out

    # ------------------------------------------------------------------ properties
    @property
    def in_scores(self) -> np.ndarray:
        return self._in

    @property
    def out_scores(self) -> np.ndarray:
        return self._out

    @property
    def num_members(self) -> int:
        return int(self._in.size)

    @property
    def num_nonmembers(self) -> int:
        return int(self._out.size)

    @property
    def num_canaries(self) -> int:
        return self.num_members + self.num_nonmembers

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def tie_break_seed(self) -> int | None:
        """The seed of the keys that break one-run ties; None when ties count against the guesser."""
        return None if self._canary_order is None else self._seed

    def pooled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """All m scores, whether each is a member, and the random keys that break one-run ties
        (None when the canaries' order is unknown: ties then count against the guesser)."""
        if self._canary_order is None:
            return (np.concatenate([self._in, self._out]),
                    np.r_[np.ones(self._in.size, bool), np.zeros(self._out.size, bool)], None)
        scores, member = self._canary_order
        return scores, member, tie_keys(self._seed, scores.size)

    def __repr__(self) -> str:
        return f"CanaryScores(num_members={self.num_members}, num_nonmembers={self.num_nonmembers}, seed={self._seed})"

    def _warn_if_reversed(self) -> None:
        n1, n0 = self.num_members, self.num_nonmembers
        if n1 < 5 or n0 < 5:
            return
        z = (self.auc() - 0.5) / math.sqrt((n1 + n0 + 1) / (12.0 * n1 * n0))
        if z < -3.29:  # one-sided p < 0.0005
            warnings.warn(
                f"AUC is {self.auc():.3f}, well below 0.5: dpaudit expects higher scores for members; "
                "were the scores negated (e.g. a loss instead of a log-likelihood)?",
                stacklevel=3,
            )

    # --------------------------------------------------------------------- metrics
    def roc(self) -> _m.RocCurve:
        """ROC curve of "member iff score >= t" (see :func:`dpaudit.audit.metrics.roc_curve`)."""
        if self._roc_cache is None:
            self._roc_cache = _m._roc(self._in, self._out)
        return self._roc_cache

    def auc(self) -> float:
        return _m._auc(self._in, self._out)

    def tpr_at_fpr(self, fpr: float) -> _m.TprAtFpr:
        """Largest TPR with FPR <= fpr, or "not enough non-members" (value None)."""
        return _m._tpr_at_fpr(self.roc(), as_fpr(fpr))

    def balanced_accuracy(self) -> float:
        return _m._balanced_accuracy(self.roc())

    def bootstrap_ci(
        self,
        metric: str | Callable = "auc",
        *,
        fpr: float | None = None,
        num_samples: int = 1000,
        confidence: float = 0.95,
        seed: int | None = 0,
    ) -> _m.ConfidenceInterval:
        """Seeded percentile-bootstrap CI; see :func:`dpaudit.audit.metrics.bootstrap_ci`."""
        return _m.bootstrap_ci(
            in_scores=self._in,
            out_scores=self._out,
            metric=metric,
            fpr=fpr,
            num_samples=num_samples,
            confidence=confidence,
            seed=seed,
        )

    # ---------------------------------------------------------------------- bounds
    def epsilon_clopper_pearson(
        self, *, delta: float, significance: float = 0.05, strategy: Strategy | None = None
    ) -> BoundResult:
        """Clopper-Pearson epsilon bound (Jagielski et al. 2020) at a strategy-chosen threshold."""
        return self.bound("clopper_pearson", delta=delta, significance=significance, strategy=strategy)

    def epsilon_gdp(self, *, delta: float, significance: float = 0.05, strategy: Strategy | None = None) -> BoundResult:
        """Gaussian-DP epsilon estimate (Nasr et al. 2023; Dong, Roth, Su 2019) at a chosen threshold.

        Not sound: the epsilon reading assumes a Gaussian trade-off curve."""
        return self.bound("gdp", delta=delta, significance=significance, strategy=strategy)

    def epsilon_one_run(
        self, *, delta: float, significance: float = 0.05, strategy: Strategy | None = None
    ) -> BoundResult:
        """One-run epsilon bound (Steinke, Nasr, Jagielski 2023) with strategy-chosen k+, k-."""
        return self.bound("one_run", delta=delta, significance=significance, strategy=strategy)

    def epsilon_one_run_fdp(
        self, *, delta: float, significance: float = 0.05, strategy: Strategy | None = None
    ) -> BoundResult:
        """One-run f-DP estimate (Mahloujifar, Melis, Chaudhuri 2025) with strategy-chosen k+, k-.

        Not sound: the epsilon reading assumes a Gaussian trade-off curve (the mu bound in
        ``details`` does not)."""
        return self.bound("one_run_fdp", delta=delta, significance=significance, strategy=strategy)

    def bound(
        self, method: str, *, delta: float, significance: float = 0.05, strategy: Strategy | None = None
    ) -> BoundResult:
        """Any registered bound by name (see :func:`dpaudit.audit.available_bounds`):
        "clopper_pearson", "gdp", "one_run", "one_run_fdp", ..."""
        if not isinstance(method, str) or method not in available_bounds():
            raise InputError(f"unknown method {method!r}; use one of {available_bounds()}")
        spec = get_bound(method)
        if spec.family == "threshold":
            return self._threshold_bound(spec, delta, significance, strategy)
        return self._one_run_bound(spec, delta, significance, strategy)

    def audit(
        self,
        *,
        delta: float = 1e-5,
        significance: float = 0.05,
        strategy: Strategy | None = None,
        fprs: Sequence[float] = DEFAULT_FPRS,
    ) -> AuditReport:
        """All metrics and every registered bound, as one frozen :class:`AuditReport`."""
        return AuditReport(
            num_members=self.num_members,
            num_nonmembers=self.num_nonmembers,
            auc=self.auc(),
            balanced_accuracy=self.balanced_accuracy(),
            tpr_at_fpr=tuple(self.tpr_at_fpr(a) for a in fprs),
            bounds=tuple(
                self.bound(name, delta=delta, significance=significance, strategy=strategy)
                for name in available_bounds()
            ),
            delta=float(delta),
            significance=float(significance),
            seed=self._seed,
        )

    def summary(self, **kwargs) -> str:
        """Text summary of :meth:`audit` (same keyword arguments; delta defaults to 1e-5)."""
        return self.audit(**kwargs).summary()

    def to_dict(self, **kwargs) -> dict:
        """JSON-ready view of :meth:`audit` (same keyword arguments)."""
        return self.audit(**kwargs).to_dict()

    # ------------------------------------------------------------ one-run machinery
    def _one_run_bound(self, spec: BoundSpec, delta, significance, strategy) -> BoundResult:
        delta = _check_delta(delta)
        significance = _check_significance(significance)
        strategy = DEFAULT_STRATEGY if strategy is None else strategy

        def evaluate(m, r, v, sig):
            return spec.evaluate(num_canaries=m, num_guesses=r, num_correct=v, delta=delta, significance=sig)

        scores, member, keys = self.pooled()
        sel = select_guesses(strategy, scores=scores, member=member, tie_keys=keys, significance=significance,
                             chooser=lambda *a: evaluate(*a)[0], chooser_name="epsilon")
        ranking, per_test = sel.ranking, sel.significance_per_test
        tried = []
        for kp, km in sel.pairs:
            v = ranking.correct(kp, km)
            eps, extras = evaluate(ranking.m, kp + km, v, per_test)
            tried.append({"k_plus": kp, "k_minus": km, "num_correct": v, "epsilon": eps, **extras})
        best = max(tried, key=lambda t: (t["epsilon"], t["num_correct"] / (t["k_plus"] + t["k_minus"])))
        details = {"k_plus": best["k_plus"], "k_minus": best["k_minus"], **sel.details,
                   "significance_per_test": per_test}
        if sel.lists_candidates:
            details["candidates"] = tried
        details["tie_break_seed"] = self.tie_break_seed
        details.update({k: x for k, x in best.items() if k not in ("k_plus", "k_minus", "num_correct", "epsilon")})
        m, r, v = ranking.m, best["k_plus"] + best["k_minus"], best["num_correct"]
        return BoundResult(
            spec.name, float(best["epsilon"]), delta, significance, int(m), int(r), int(v), strategy.describe(),
            details, spec.sound,
        )

    # ---------------------------------------------------------- threshold machinery
    def _threshold_bound(self, spec: BoundSpec, delta, significance, strategy) -> BoundResult:
        delta = _check_delta(delta)
        significance = _check_significance(significance)
        strategy = DEFAULT_STRATEGY if strategy is None else strategy

        def evaluate(tp, fp, tn, fn, sig):
            return spec.evaluate(tp=tp, fp=fp, tn=tn, fn=fn, delta=delta, significance=sig)

        sel = select_threshold(strategy, in_scores=self._in, out_scores=self._out, significance=significance,
                               chooser=lambda *a: evaluate(*a)[0], chooser_name="epsilon")
        per_test = sel.significance_per_test
        tried = []
        for c in sel.candidates:
            eps, extras = evaluate(c["tp"], c["fp"], c["tn"], c["fn"], per_test)
            tried.append({**c, "epsilon": eps, **extras})
        best = max(tried, key=lambda t: t["epsilon"])
        details = {**best, **sel.details, "significance_per_test": per_test}
        if sel.lists_candidates:
            details["candidates"] = [{k: t[k] for k in ("j", "threshold", "tp", "fn", "epsilon")} for t in tried]
        eps = details.pop("epsilon")
        return BoundResult(
            spec.name, float(eps), delta, significance, sel.num_canaries, None, None, strategy.describe(), details,
            spec.sound,
        )
