"""The one place where an audit's claim, ceiling and verdict are decided.

``dpaudit run``'s report, ``dpaudit validate`` and the multi-run audit all call
:func:`assess`:

    claim = Claim.of_record(record)                      # what the training run claims
    verdict = assess(bounds=bounds, claim=claim, learned=True, checks=checks, record=record)

- The claim (:class:`Claim`) is what the bounds are held to: the accountant's epsilon of the
  run's DP record at each bound's delta (a group's epsilon for a canary repeated at note
  level), a stated (epsilon, delta), the largest epsilon of several runs, or nothing (no
  claim: non-private or unknown).
- The ceiling (:func:`ceilings`) is what each sound method could have shown with every
  guess right, for these canaries (or runs), strategy and significance; the verdict compares
  the largest with the claim.
- The verdict (:func:`dpaudit.audit.verdict.decide`) says violated, consistent,
  inconclusive or no claim; a trainer whose accounting is not of the training it ran (its
  DP record against its own fields and its sampler checks, or against the gradient canaries
  of a white-box rung), or whose own checks failed, is violated whatever the bounds say.

Records are read by duck typing (:class:`dpaudit.accounting.DpRecord`'s ``private``,
``epsilon(delta)``, ``group_epsilon(r, delta)``, ``unit``, ``delta``, ``dpsgd_parameters``),
so this module needs no accountant of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpaudit.audit.results import BoundResult
from dpaudit.audit.strategy import strategy_from_dict
from dpaudit.audit.verdict import Status, Verdict, decide
from dpaudit.errors import InputError

__all__ = ["NOT_THE_CLAIMED_MECHANISM", "Claim", "accounting_mismatch", "assess", "ceilings",
           "mechanism_refusal"]


@dataclass(frozen=True)
class Claim:
    """What an audit tests. ``kind`` is ``"dp"``, ``"non_private"`` or ``"unknown"``;
    ``epsilon_at(delta)`` is the claimed epsilon at a bound's delta (None: ``epsilon`` at
    every delta), ``delta`` the claim's own delta, ``family`` the DP-SGD parameters
    (``noise_multiplier``, ``sample_rate``, ``steps``) whose trade-off curve the claimed-curve
    test checks, and ``group_size`` the units a canary counts as."""

    kind: str
    epsilon: float | None = None
    delta: float | None = None
    epsilon_at: Callable[[float], float] | None = None
    family: Mapping[str, Any] | None = None
    group_size: int = 1

    @classmethod
    def unknown(cls) -> Claim:
        return cls("unknown")

    @classmethod
    def stated(cls, *, epsilon: float, delta: float, family: Mapping[str, Any] | None = None) -> Claim:
        """A claim stated by the user, at its delta (and at every other delta)."""
        return cls("dp", epsilon=float(epsilon), delta=float(delta), family=family)

    @classmethod
    def of_record(cls, record, *, group_size: int = 1) -> Claim:
        """The claim of a training run's DP record (None: unknown). ``group_size`` r > 1 at
        note level (a canary repeated r times) holds the audit to the group's epsilon."""
        if record is None:
            return cls.unknown()
        if not record.private:
            return cls("non_private", epsilon=math.inf)
        if group_size > 1 and record.unit == "example" and record.dpsgd_parameters is not None:
            def at(delta: float) -> float:
                return record.group_epsilon(group_size, delta)
        else:
            group_size = 1

            def at(delta: float) -> float:
                return float(record.epsilon(delta))
        return cls("dp", epsilon=at(record.delta), delta=record.delta, epsilon_at=at,
                   family=record.dpsgd_parameters, group_size=group_size)

    @classmethod
    def largest(cls, records: Sequence, *, delta: float, group_size: int = 1) -> Claim:
        """The largest epsilon of several runs at ``delta`` (the multi-run audit's 2K runs);
        unknown when a run recorded no DP event."""
        if any(r is None for r in records):
            return cls.unknown()
        seen, worst = [], 0.0
        for r in records:
            if r.event in seen:
                continue
            seen.append(r.event)
            eps = r.epsilon(delta)
            if math.isfinite(eps) and group_size > 1 and r.unit == "example":
                if r.dpsgd_parameters is None:
                    raise InputError("a canary repeated at note level is a group; its epsilon needs a plain "
                                     "DP-SGD event")
                eps = r.group_epsilon(group_size, delta)
            worst = max(worst, eps)
        return cls("non_private" if math.isinf(worst) else "dp", epsilon=worst, delta=delta)

    @property
    def claimed_epsilon(self) -> float | None:
        """The number :func:`decide` holds the bounds to (None: nothing is claimed)."""
        return None if self.kind == "unknown" else self.epsilon


def ceilings(bounds: Sequence[tuple[str, BoundResult]], *, claim: Claim,
             warn: Callable[[str], None] | None = None) -> dict[str, float]:
    """The ceiling of each sound method among ``bounds``: the largest bound it could report,
    with every guess right (one run: ``one_run``, ``claimed_curve``, the latter for the DP-SGD
    family of its own details) or every run told apart (``clopper_pearson``), for the same
    canaries or runs, strategy, significance and delta (the claim's delta when it has one);
    the largest over the bounds of a method. A ceiling that cannot be computed is left out (and
    ``warn`` is told why)."""
    out: dict[str, float] = {}
    seen: set[tuple] = set()
    for _, b in bounds:
        if not b.sound or b.method not in ("one_run", "claimed_curve", "clopper_pearson"):
            continue
        family = tuple(b.details.get(k) for k in ("noise_multiplier", "sample_rate", "steps"))
        key = (b.method, b.num_canaries, b.significance, repr(b.strategy), family, b.delta)
        if key in seen:
            continue
        seen.add(key)
        delta = float(claim.delta if claim.delta is not None else b.delta)
        try:
            value = _ceiling(b, delta=delta, family=family)
        except (InputError, TypeError, ValueError) as err:
            if warn is not None:
                warn(f"{b.method} ceiling not computed: {err}")
            continue
        out[b.method] = max(out.get(b.method, value), value)
    return out


def rung_ceiling(rung, *, claim: Claim, warn: Callable[[str], None] | None = None) -> float | None:
    """The testability ceiling of a rung of the threat-model ladder (:class:`dpaudit.audit.ladder.Rung`):
    what its best test could show with every guess right, at the significance that test ran at
    (its share of the rung's); None for a rung without a bound, or when it cannot be computed."""
    if rung.bound is None:
        return None
    return max(ceilings([(rung.rung, rung.bound)], claim=claim, warn=warn).values(), default=None)


def _ceiling(b: BoundResult, *, delta: float, family: tuple) -> float:
    from dpaudit.audit.ceilings import claimed_curve_ceiling, one_run_ceiling

    common = dict(significance=float(b.significance), strategy=strategy_from_dict(b.strategy), delta=delta)
    if b.method == "clopper_pearson":
        return _runs_ceiling(b, **common)
    m = int(b.num_canaries + b.details.get("selection_num_canaries", 0))
    if b.method == "one_run":
        return float(one_run_ceiling(method="one_run", num_canaries=m, **common))
    sigma, q, steps = family
    return float(claimed_curve_ceiling(num_canaries=m, noise_multiplier=sigma, sample_rate=q, steps=steps, **common))


def _runs_ceiling(ref: BoundResult, *, delta: float, significance: float, strategy) -> float:
    """The Clopper-Pearson bound of runs told apart without error (as many in and out as ``ref``)."""
    import numpy as np

    from dpaudit.audit.canary_scores import CanaryScores

    d = ref.details
    perfect = CanaryScores(in_scores=np.ones(d["tp"] + d["fn"]), out_scores=np.zeros(d["fp"] + d["tn"]))
    return float(perfect.epsilon_clopper_pearson(delta=delta, significance=significance, strategy=strategy).epsilon)


#: How the white-box rung words its refusal of gradient canaries that ran another (T, q) than
#: the DP record claims (:func:`dpaudit.stages.ladder.white_box_rung`): evidence that the
#: accounting is not of the run, which the report hands to :func:`assess` as a ``mismatch``.
NOT_THE_CLAIMED_MECHANISM = "not the claimed mechanism"


def mechanism_refusal(rungs) -> str | None:
    """The refusal of a white-box rung whose gradient canaries ran another (T, q) than the DP
    record claims (:data:`NOT_THE_CLAIMED_MECHANISM`), for :func:`assess`'s ``mismatch``: not
    its other refusals (a failed inclusion check refuses honest runs at its p-value threshold)."""
    return next((r.refused for r in rungs if r.rung == "white_box" and r.bound is None and r.refused
                 and r.refused.endswith(NOT_THE_CLAIMED_MECHANISM)), None)


#: Relative tolerance of the comparisons of :func:`accounting_mismatch`.
MISMATCH_RTOL = 1e-6


def accounting_mismatch(record, checks: Mapping[str, Any] | None) -> str | None:
    """How the DP record a trainer wrote differs from the training it describes, or None when
    they agree or either is missing: a record of Poisson DP-SGD fields (sigma, q, T) whose
    event is not the DP-SGD of those fields, or one whose number of steps, expected batch q N
    or rate q differs from its sampler's (the sampler's checks: its Binomial(N, q) has mean N q
    and variance N q (1 - q), so q = 1 - variance / mean). Accounting each gradient-accumulation
    micro-step as a step (rate q / k over k T steps) is caught here, and so is a rate of
    another unit (q / 2 over 2 N examples where the sampler drew q of N users)."""
    if record is None:
        return None
    fields = [getattr(record, k, None) for k in ("noise_multiplier", "sample_rate", "steps")]
    if getattr(record, "private", False) and None not in fields and record.dpsgd_parameters is None:
        sigma, q, steps = fields
        return (f"its event is not the DP-SGD of its own fields ({steps} steps at q = {q:.6g}, sigma = "
                f"{sigma:.6g}), so its epsilon is not theirs")
    batch = (checks or {}).get("batch_size") or {}
    try:
        steps, q, n = int(record.steps), float(record.sample_rate), int(record.num_units)
        ran_steps, ran_mean = int(batch["steps"]), float(batch["expected_mean"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    if steps != ran_steps:
        return f"it accounts {steps} steps, and its sampler ran {ran_steps}"
    if abs(q * n - ran_mean) > MISMATCH_RTOL * max(1.0, ran_mean):
        return f"it accounts a sampling rate {q:.6g} (expected batch {q * n:.4g}), its sampler's expected batch was {ran_mean:.4g}"
    try:
        ran_q = 1.0 - float(batch["expected_variance"]) / ran_mean
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if abs(q - ran_q) > MISMATCH_RTOL * max(abs(q), abs(ran_q)):
        return (f"it accounts a sampling rate {q:.6g} over {n} units, and its sampler drew at rate {ran_q:.6g} "
                f"(the same expected batch {ran_mean:.4g})")
    return None


def assess(*, bounds: Sequence[tuple[str, BoundResult]], claim: Claim, learned: bool | None,
           ceiling: float | None = None, checks: Mapping[str, Any] | None = None,
           record=None, remedy: tuple[str, str] | None = None, mismatch: str | None = None) -> Verdict:
    """The verdict of an audit (the module docstring). ``ceiling`` is the largest of
    :func:`ceilings` unless given; ``checks`` are the trainer's sampler and update checks
    (``train_checks.json``) and ``record`` its DP record. ``remedy`` = (what the ceiling is
    of, what to do), e.g. ("the ceiling of 8 runs per side", "add runs"), words the reason of
    an audit whose ceiling is at or below the claim (default: its canaries, add canaries).
    ``mismatch`` is how the accounting differs from the training as seen elsewhere (a
    white-box rung refused as :data:`NOT_THE_CLAIMED_MECHANISM`): a violation, like
    :func:`accounting_mismatch`'s."""
    if ceiling is None:
        ceiling = max(ceilings(bounds, claim=claim).values(), default=None)
    verdict = decide(bounds=bounds, claimed_epsilon=claim.claimed_epsilon, accountant_epsilon=claim.epsilon_at,
                     ceiling=ceiling, learned=learned)
    if remedy is not None and verdict.status == Status.INCONCLUSIVE and verdict.ceiling is not None \
            and verdict.ceiling <= (verdict.claimed_epsilon or 0.0):
        verdict = dataclasses.replace(verdict, reason=(
            f"Even a perfect attack could not show a violation: {remedy[0]} is {verdict.ceiling:.3f} <= the claimed "
            f"epsilon {verdict.claimed_epsilon:.3f}; {remedy[1]}."))
    if verdict.status == Status.VIOLATED:
        return verdict
    mismatch = accounting_mismatch(record, checks) or mismatch
    if mismatch:
        return dataclasses.replace(verdict, status=Status.VIOLATED,
                                   reason=f"the trainer's accounting is not of the training it ran: {mismatch}")
    if checks is not None and not checks.get("ok", True):
        # batch_size: the sampler's; steps and noise: a wrapped loop's (dpaudit.adapters.loop)
        failed = [k for k in ("batch_size", "steps", "noise")
                  if isinstance(checks.get(k), dict) and checks[k].get("consistent") is False]
        reason = ("the trainer's own checks failed (" + (", ".join(failed) or "see train_checks.json") +
                  "): its sampling or its updates are not what its accounting assumes")
        return dataclasses.replace(verdict, status=Status.VIOLATED, reason=reason)
    return verdict
