"""The audit verdict: does any sound bound contradict the DP claim, and could one have?

    verdict = decide(
        bounds=[("loss", scores.bound("one_run", delta=1e-5))],
        claimed_epsilon=8.0,
        accountant_epsilon=None,
        ceiling=one_run_ceiling(method="one_run", num_canaries=1000, delta=1e-5, significance=0.05),
        learned=True,
    )
    verdict.status      # "inconclusive": the ceiling (5.23) is below the claim
    verdict.exit_code   # 3

Four outcomes, decided in this order (exit statuses of the command line in brackets):

1. ``"no_claim"`` (0) -- there is no DP claim to test (a non-private run, or one whose
   privacy is unknown): nothing can be violated.
2. ``"violated"`` (1) -- some *sound* bound (one that holds for any (epsilon, delta)-DP
   mechanism: Steinke et al. 2023, Jagielski et al. 2020; or the claimed-curve test, sound
   for the claimed DP-SGD family: Mahloujifar et al. 2024) exceeds the claimed epsilon at
   that bound's delta (the accountant's epsilon at that delta when a curve is given). This
   wins over everything below: a violation seen is a violation, however weak the audit.
   The claimed-curve test's epsilon is that of the claimed family at delta (the least noisy
   DP-SGD curve, same q and T, that the guesses reject): above the claim, it shows the run
   lacks the trade-off curve its accountant claims, not that it fails (epsilon, delta)-DP at
   that one delta for every kind of mechanism.
3. ``"inconclusive"`` (3) -- the audit could not have seen a violation: the model learned
   nothing (held-out loss no better than at initialisation, and no sound bound above 0,
   which would show that the canaries moved it), or the audit's ceiling (the largest bound
   any of its tests could give, every guess right) is at or below the claim, or no sound
   bound was computed.
4. ``"consistent"`` (0) -- no sound bound exceeds the claim, though one could have. Not a
   proof of privacy.

Bounds that are not sound (the f-DP and GDP epsilons, which assume a Gaussian trade-off
curve) never decide anything. The bound reported is the largest sound one (in a
violation: the largest sound one that violates).

Several bounds (attacks x methods), each at significance alpha_i, are looked at together;
the verdict holds with confidence at least 1 - sum(alpha_i) over the sound bounds that
entered it (union bound). :attr:`Verdict.significance` is that sum (capped at 1). To
keep the verdict at 95%, compute K bounds at 0.05 / K each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from numbers import Real
from typing import Any

from dpaudit.audit.results import BoundResult
from dpaudit.errors import ExitCode, InputError
from dpaudit.jsonable import jsonable

__all__ = ["STATUSES", "Status", "Verdict", "decide", "fit_from_log", "learned",
           "MIN_LOSS_DROP"]

#: A model "learned" when its loss fell by at least this fraction of the loss before training
#: (and by at least MIN_LOSS_DROP_NATS): a from-scratch DP model at perplexity 4,246 on a
#: vocabulary of about 4,500 (a drop of 0.7%) did not.
MIN_LOSS_DROP = 0.01
MIN_LOSS_DROP_NATS = 0.01


def learned(*, initial_loss: float | None, final_loss: float | None, trainable: str = "all") -> bool | None:
    """Did training move the model? ``final_loss`` at least 1% (and 0.01 nats) below
    ``initial_loss``; None when either is unknown. A model that learned nothing from its
    training data memorized nothing, so no audit of it can see a violation. None too when not
    every parameter trains (``model.trainable``): with only the isolated canaries' embedding
    rows learning, the records' loss cannot show it, and only a bound above 0 can."""
    if initial_loss is None or final_loss is None or trainable != "all":
        return None
    return bool(initial_loss - final_loss >= max(MIN_LOSS_DROP * abs(initial_loss), MIN_LOSS_DROP_NATS))

def fit_from_log(log: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """The loss on the training rows before training (the log's step-0 record) and at its last
    evaluation, from a training log; ``(None, None)`` when it has no step-0 evaluation."""
    fits = [r for r in log if r.get("train_eval_loss") is not None]
    if len(fits) < 2 or fits[0].get("step") != 0:
        return None, None
    return float(fits[0]["train_eval_loss"]), float(fits[-1]["train_eval_loss"])


class Status(str, Enum):
    """The four verdicts; each is its string (``Status.VIOLATED == "violated"``)."""

    VIOLATED = "violated"
    CONSISTENT = "consistent"
    INCONCLUSIVE = "inconclusive"
    NO_CLAIM = "no_claim"

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def exit_code(self) -> ExitCode:
        """1 violated, 3 inconclusive, 0 otherwise."""
        return {Status.VIOLATED: ExitCode.VIOLATION, Status.INCONCLUSIVE: ExitCode.INCONCLUSIVE}.get(self, ExitCode.OK)


#: The four verdicts.
STATUSES: tuple[str, ...] = tuple(s.value for s in Status)


@dataclass(frozen=True)
class Verdict:
    """What an audit says about a DP claim (see the module docstring for the rules).

    ``claimed_epsilon`` is the claim the bound was compared with, at ``delta`` (the
    accountant's epsilon at that delta when a curve was given). ``epsilon_lower_bound``,
    ``method``, ``attack``, ``num_*`` describe the reported sound bound (None when there is
    none). ``significance`` is the union-bound level over every sound bound that entered
    the decision. ``ceiling`` is the one given to :func:`decide`.
    """

    status: Status
    reason: str
    claimed_epsilon: float | None
    delta: float | None
    epsilon_lower_bound: float | None
    method: str | None
    attack: str | None
    significance: float | None
    ceiling: float | None
    num_canaries: int | None
    num_guesses: int | None
    num_correct: int | None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise InputError(f"status must be one of {STATUSES}, got {self.status!r}")
        object.__setattr__(self, "status", Status(self.status))

    @property
    def exit_code(self) -> int:
        """Command-line exit status: 1 violated, 3 inconclusive, 0 otherwise."""
        return int(self.status.exit_code)

    def to_dict(self) -> dict:
        """Plain JSON (infinities become null); includes ``exit_code``."""
        return jsonable({**asdict(self), "status": self.status.value, "exit_code": self.exit_code})

    def summary(self) -> str:
        return f"{self.status}: {self.reason}"

    __str__ = summary


# ------------------------------------------------------------------------- checks
def _check_pairs(bounds) -> list[tuple[str, BoundResult]]:
    if isinstance(bounds, str | bytes) or not isinstance(bounds, Sequence):
        raise InputError(f"bounds must be a sequence of (attack name, BoundResult) pairs, got {bounds!r}")
    pairs = []
    for item in bounds:
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise InputError(f"each bound must be an (attack name, BoundResult) pair, got {item!r}")
        attack, bound = item
        if not isinstance(attack, str):
            raise InputError(f"attack name must be a string, got {attack!r}")
        if not isinstance(bound, BoundResult):
            raise InputError(f"bound for attack {attack!r} must be a BoundResult, got {type(bound).__name__}")
        pairs.append((attack, bound))
    return pairs


def _check_epsilon(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InputError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or value < 0.0:
        raise InputError(f"{name} must be >= 0 (or infinity), got {value}")
    return value


def _fmt_delta(delta: float) -> str:
    return format(delta, "g")


def _confidence(sig: float, k: int) -> str:
    if k <= 1:
        return f"{1.0 - sig:.0%} confidence"
    return f"joint confidence {1.0 - sig:.0%} over {k} sound bounds (union bound)"


def _describe(attack: str, b: BoundResult) -> str:
    paper = f" ({b.paper})" if b.paper else ""
    return f"the {b.method} bound{paper} on attack {attack!r}"


# ------------------------------------------------------------------------- decide
def decide(
    *,
    bounds: Sequence[tuple[str, BoundResult]],
    claimed_epsilon: float | None,
    accountant_epsilon: Callable[[float], float] | None,
    ceiling: float | None,
    learned: bool | None,
) -> Verdict:
    """The verdict of an audit (rules in the module docstring).

    Args:
      bounds: (attack name, bound) pairs; only bounds with ``sound=True`` enter.
      claimed_epsilon: the claim; None (or infinity) when there is none (non-private, or
        unknown).
      accountant_epsilon: delta -> the accountant's epsilon at that delta, used at each
        bound's own delta; None: ``claimed_epsilon`` is used at every delta.
      ceiling: the audit's ceiling: the largest over its tests of what each could show with
        every guess right, for its m, guesses and significance (see
        :func:`dpaudit.audit.one_run_ceiling`), or None when unknown.
      learned: whether the model learned (held-out loss below its value at
        initialisation); None when unknown.
    """
    pairs = _check_pairs(bounds)
    claim = None if claimed_epsilon is None else _check_epsilon("claimed_epsilon", claimed_epsilon)
    if accountant_epsilon is not None and not callable(accountant_epsilon):
        raise InputError(f"accountant_epsilon must be a function of delta, or None, got {accountant_epsilon!r}")
    if ceiling is not None:
        ceiling = _check_epsilon("ceiling", ceiling)
    if learned is not None and not isinstance(learned, bool):
        raise InputError(f"learned must be True, False or None, got {learned!r}")

    sound = [(a, b) for a, b in pairs if b.sound]
    significance = min(1.0, sum(b.significance for _, b in sound)) if sound else None
    best = max(sound, key=lambda t: t[1].epsilon) if sound else None

    def verdict(status: str, reason: str, chosen, claim_value) -> Verdict:
        attack, b = chosen if chosen is not None else (None, None)
        return Verdict(status=status, reason=reason, claimed_epsilon=claim_value,
                       delta=None if b is None else b.delta, epsilon_lower_bound=None if b is None else b.epsilon,
                       method=None if b is None else b.method, attack=attack, significance=significance,
                       ceiling=ceiling, num_canaries=None if b is None else b.num_canaries,
                       num_guesses=None if b is None else b.num_guesses, num_correct=None if b is None else b.num_correct)

    # 1. No claim: nothing to violate.
    if claim is None or math.isinf(claim):
        what = "the run is non-private" if claim is not None else "the run's privacy is unknown or not claimed"
        tail = f"; the best sound bound is epsilon >= {best[1].epsilon:.3f} ({_describe(*best)})" if best else ""
        return verdict("no_claim", f"No DP claim to test ({what}), so there is nothing to violate{tail}.", best, None)

    def claim_at(delta: float) -> float:
        if accountant_epsilon is None:
            return claim
        return _check_epsilon(f"accountant_epsilon({delta:g})", accountant_epsilon(delta))

    # 2. A sound bound above the claim at its own delta: violated, whatever else holds.
    checked = [(a, b, claim_at(b.delta)) for a, b in sound]
    violators = [t for t in checked if t[1].epsilon > t[2]]
    if violators:
        attack, b, c = max(violators, key=lambda t: t[1].epsilon)
        source = "the accountant's epsilon" if accountant_epsilon is not None else "the claimed epsilon"
        # the family test rejects the claimed trade-off curve, on which the claimed (c, delta)
        # rests: its epsilon is the claimed family's at delta, not a bound for every mechanism
        what = (f"the run does not have the trade-off curve its accountant claims, on which ({c:.3f}, "
                f"{_fmt_delta(b.delta)})-DP rests" if b.method == "claimed_curve" else
                f"the run is not ({c:.3f}, {_fmt_delta(b.delta)})-DP as claimed")
        reason = (
            f"Attack {attack!r}, {b.method} bound{f' ({b.paper})' if b.paper else ''}: epsilon >= {b.epsilon:.3f} "
            f"at delta={_fmt_delta(b.delta)}, above {source} {c:.3f} "
            f"({_confidence(significance, len(sound))}): {what}."
        )
        return verdict("violated", reason, (attack, b), c)

    claim_ref = claim if best is None else claim_at(best[1].delta)
    status, reason = _without_violation(best, claim_ref=claim_ref, ceiling=ceiling, learned=learned)
    return verdict(status, reason, best, claim_ref)


def _without_violation(best, *, claim_ref: float, ceiling: float | None, learned: bool | None) -> tuple[str, str]:
    """Rules 3 and 4 (no sound bound above the claim): inconclusive when the audit could not
    have seen a violation, else consistent, which is not a proof of privacy."""
    if learned is False and (best is None or best[1].epsilon <= 0):  # a bound above 0: the canaries moved it
        return "inconclusive", ("The model learned nothing (its loss is no better than at initialisation), so an "
                                "audit of it cannot see a violation of the claim; train a model that learns, then "
                                "audit it.")
    if ceiling is not None and ceiling <= claim_ref:
        return "inconclusive", (f"Even a perfect attack could not show a violation: the best possible bound of this "
                                f"audit (its ceiling: every guess of its strongest test right) is {ceiling:.3f} <= the "
                                f"claimed epsilon {claim_ref:.3f}; add canaries.")
    if best is None:
        return "inconclusive", ("No sound bound was computed (estimates under a Gaussian trade-off curve do not "
                                "count), so the audit cannot test the claim; compute a one_run or clopper_pearson "
                                "bound.")
    attack, b = best
    ceiling_text = (f"beside this audit's ceiling of {ceiling:.3f} (every guess of its strongest test right)"
                    if ceiling is not None else "(no ceiling given)")
    return "consistent", (f"The best sound bound, epsilon >= {b.epsilon:.3f} at delta={_fmt_delta(b.delta)} from "
                          f"{_describe(attack, b)}, {ceiling_text}, does not exceed the claimed epsilon "
                          f"{claim_ref:.3f}: consistent with the claim, which is not a proof of privacy.")
