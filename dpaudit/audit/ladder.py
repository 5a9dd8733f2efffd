"""The threat-model ladder: one claim, audited by adversaries of growing strength.

Nasr, Song, Thakurta, Papernot, Carlini 2021 ("Adversary Instantiation: Lower Bounds for
Differentially Private Machine Learning", arXiv 2101.04535) measure a DP-SGD claim against
a ladder of adversaries; Steinke, Nasr, Jagielski 2023 (arXiv 2305.08846) do it in one run.
The rungs here, each a sound one-run bound on the same claim (epsilon, delta, unit):

- ``released``: the black-box audit of the model one would ship (its canaries scored on the
  final model);
- ``input_space``: the same trainer and claim in the isolated design (fresh-token canaries,
  only their rows training, full batch, plain SGD): the input canaries' worst case, scored on
  that twin's final model;
- ``white_box``: Dirac gradient canaries inside a DP-SGD run of the trainer, scored from every
  step's noisy clipped sum (all iterates).

Each rung has its own *ideal*: the median bound of the same tests on the ideal scores of
its regime (noise multiplier sigma, Poisson rate q, T steps, m canaries, the same strategy
and significance): each canary's score is the statistic a perfect attack on the final model
of linear losses sees (Steinke et al. 2025, arXiv 2410.06186), k + N(0, T sigma^2) with
k ~ Binomial(T, q) the steps that sampled it (0 when left out), in units of the clipping
norm; for Dirac gradient canaries this is their score exactly. A released model's canaries
go through its own optimizer and schedule (:func:`dpaudit.train.plan.optimizer_response`):
momentum leaves the last steps' sums partly unapplied, and AdamW's second moment normalizes
away part of each (all of the first step's, whose update is a sign). The ideal is what a perfect
attack shows on a run that keeps its claim: a rung far below its ideal has a weak attack, an
ideal far below the claim is an audit whose design (m, q, T) could not have come near it. It is
not the verdict's ceiling (:func:`dpaudit.audit.ceilings`, every guess right), which says
whether a violation could have been seen at all.

The white-box rung tests one pre-registered number of guesses: the guess fraction whose
ideal bound is the largest among those that could exceed the claim
(:func:`choose_guess_fraction`), chosen by simulating the claimed
mechanism alone, never the observed scores, so the test needs no correction for the choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpaudit.audit.canary_scores import CanaryScores
from dpaudit.audit.claimed_curve import claimed_curve_bound
from dpaudit.audit.results import BoundResult
from dpaudit.audit.strategy import BonferroniStrategy, Strategy
from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable

__all__ = ["RUNGS", "Rung", "choose_guess_fraction", "ideal_bounds", "ideal_scores", "rung_bound"]

#: The rungs, weakest adversary first, with what each one is.
RUNGS: dict[str, str] = {
    "released": "the released model, black-box",
    "input_space": "input canaries, worst case (isolated, full batch)",
    "white_box": "gradient canaries, all iterates",
}

#: Guess fractions the white-box rung pre-registers one of (by simulation of the claim).
GUESS_FRACTIONS: tuple[float, ...] = (0.0005, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3)


@dataclass(frozen=True)
class Rung:
    """One rung of a model's ladder: its best sound bound (None when the rung was refused or
    not run: ``refused`` says why), the rung's significance (the union over every test it
    tried: its best bound holds with confidence 1 - significance), its ideal (median of the
    ideal bounds, with their range), the regime it ran in (``noise_multiplier``,
    ``sample_rate``, ``steps``), its canaries, and what it cost in seconds."""

    rung: str
    bound: BoundResult | None
    attack: str | None
    significance: float | None
    ideal: float | None
    ideal_range: tuple[float, float] | None
    num_canaries: int
    regime: dict[str, Any]
    cost_s: float | None = None
    refused: str | None = None

    def __post_init__(self):
        if self.rung not in RUNGS:
            raise InputError(f"rung must be one of {', '.join(RUNGS)}, got {self.rung!r}")

    @property
    def epsilon(self) -> float | None:
        return None if self.bound is None else self.bound.epsilon

    def to_dict(self) -> dict[str, Any]:
        return jsonable({
            "rung": self.rung, "description": RUNGS[self.rung], "method": None if self.bound is None else self.bound.method,
            "attack": self.attack, "epsilon": self.epsilon,
            "significance": self.significance,
            "confidence": None if self.significance is None else 1.0 - self.significance,
            "ideal": self.ideal, "ideal_range": self.ideal_range, "num_canaries": self.num_canaries,
            "regime": self.regime, "cost_s": self.cost_s, "refused": self.refused,
            "bound": None if self.bound is None else self.bound.to_dict(),
        })

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rung:
        b = d.get("bound")
        bound = None if b is None else BoundResult.from_dict(b)
        rng = d.get("ideal_range")
        return cls(rung=d["rung"], bound=bound, attack=d.get("attack"), significance=d.get("significance"),
                   ideal=d.get("ideal"),
                   ideal_range=None if rng is None else (float(rng[0]), float(rng[1])),
                   num_canaries=int(d["num_canaries"]), regime=dict(d.get("regime") or {}), cost_s=d.get("cost_s"),
                   refused=d.get("refused"))


#: The dimension of a canary's row in :func:`ideal_scores` under an optimizer: the ideal does
#: not depend on it (AdamW at the demo's sigma, q and T: AUC 0.631-0.638 for 8 to 512).
ROW_DIM = 64


def ideal_scores(rng: np.random.Generator, *, member: np.ndarray, noise_multiplier: float, sample_rate: float,
                 steps: int, optimizer: Callable[[Iterable[np.ndarray]], np.ndarray] | None = None,
                 signal: Sequence[float] | None = None) -> np.ndarray:
    """Each canary's ideal score in its regime, in units of the clipping norm: the steps that
    sampled it (Binomial(T, q) for a member, 0 otherwise) plus N(0, T sigma^2), the plain sum
    of its noisy steps (SGD at a constant rate). With ``optimizer`` (the released model's
    update rule, :func:`dpaudit.train.plan.optimizer_response`), each canary is a row of
    :data:`ROW_DIM` coordinates whose T gradients, b_t u + N(0, sigma^2 I) with u a random unit
    vector and b_t ~ Bernoulli(q) for a member, go through that optimizer; the score is the
    final row's projection on u: what a perfect attack on that final model sees.

    ``signal`` (T numbers in [0, 1], default 1 at every step): the norm of a sampled canary's
    clipped gradient that lies on its own coordinates at step t, b_t ``signal[t]`` u in place
    of b_t u. Not the ideal of a rung: a measurement of a canary design, whose canaries keep
    less than the whole clipped norm on rows of their own (docs/ceilings.md)."""
    member = np.asarray(member, dtype=bool)
    if signal is not None:
        signal = np.asarray(signal, dtype=float)
        if signal.shape != (steps,) or not ((signal >= 0) & (signal <= 1)).all():
            raise InputError(f"signal must be {steps} numbers in [0, 1], one per step")
    if optimizer is None:
        if signal is None:
            k = rng.binomial(steps, sample_rate, size=member.size) * member
        else:
            k = (rng.random((steps, member.size)) < sample_rate).T @ signal * member
        return k + rng.normal(0.0, math.sqrt(steps) * noise_multiplier, size=member.size)
    u = rng.normal(size=(member.size, ROW_DIM))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    scale = np.ones(steps) if signal is None else signal

    def gradients():  # of each canary's loss on its row: descending it moves the row along u
        for t in range(steps):
            b = (rng.random(member.size) < sample_rate) & member
            yield -(scale[t] * b[:, None] * u + rng.normal(0.0, noise_multiplier, size=u.shape))

    return np.einsum("ij,ij->i", optimizer(gradients()), u)


def rung_bound(scores: CanaryScores, *, methods: Sequence[str], noise_multiplier: float, sample_rate: float,
               steps: int, delta: float, significance: float, strategy: Strategy | None = None) -> BoundResult:
    """The largest of the sound bounds ``methods`` (``one_run`` of Steinke et al. 2023 and
    ``claimed_curve``, the DP-SGD family test of Mahloujifar et al. 2024, arXiv 2410.22235)
    on ``scores``, each at ``significance / len(methods)`` (so the rung holds at
    ``significance``)."""
    per = significance / len(methods)
    found = []
    for method in methods:
        if method == "claimed_curve":
            found.append(claimed_curve_bound(scores, noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                                             steps=steps, delta=delta, significance=per, strategy=strategy))
        else:
            found.append(scores.bound(method, delta=delta, significance=per, strategy=strategy))
    return max(found, key=lambda b: b.epsilon)


def ideal_bounds(*, noise_multiplier: float, sample_rate: float, steps: int, num_canaries: int, delta: float,
                 significance: float, methods: Sequence[str], strategy: Strategy | None = None, trials: int = 5,
                 seed: int = 0, optimizer: Callable[[Iterable[np.ndarray]], np.ndarray] | None = None) -> list[float]:
    """The rung's bound on the ideal scores of its regime (:func:`ideal_scores`, with the
    ``optimizer`` of a released model), ``trials`` times: each a draw of m canaries, each in
    with probability 1/2. The tests are those of the claim (sigma, q, T) whatever the optimizer."""
    family = dict(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    return [rung_bound(cs, methods=methods, **family, delta=delta, significance=significance, strategy=strategy).epsilon
            for cs in _ideal_draws(**family, num_canaries=num_canaries, trials=trials, seed=seed,
                                   optimizer=optimizer)]


def _ideal_draws(*, noise_multiplier: float, sample_rate: float, steps: int, num_canaries: int, trials: int,
                 seed: int, optimizer: Callable[[Iterable[np.ndarray]], np.ndarray] | None = None
                 ) -> list[CanaryScores]:
    """``trials`` draws of the ideal scores of m canaries, each in with probability 1/2."""
    if trials < 1:
        raise InputError(f"trials must be at least 1, got {trials}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(trials):
        member = rng.random(num_canaries) < 0.5
        s = ideal_scores(rng, member=member, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
                         optimizer=optimizer)
        out.append(CanaryScores.from_labels(scores=s, is_member=member, seed=0))
    return out


def choose_guess_fraction(*, noise_multiplier: float, sample_rate: float, steps: int, num_canaries: int,
                          delta: float, significance: float, grid: Sequence[float] = GUESS_FRACTIONS,
                          seed: int = 0) -> float:
    """The guess fraction of ``grid`` whose claimed-curve bound is the largest on one draw of
    the ideal scores of the claim (sigma, q, T) with m canaries, among the fractions whose
    ceiling (every guess right) is above the claim's epsilon: a test that could not exceed
    the claim could never show a violation. When no fraction can, the one of the largest
    bound (the claim is then untestable with m canaries, and the verdict says so). The
    choice depends on the claim alone, never on observed scores, so a test at it needs no
    correction for it."""
    from dpaudit.audit.ceilings import claimed_curve_can_violate

    family = dict(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    scores = _ideal_draws(**family, num_canaries=num_canaries, trials=1, seed=seed)[0]  # one draw for every fraction
    found: list[tuple[bool, float, float]] = []
    for g in grid:
        if max(1, round(g * num_canaries)) < 2:
            continue
        strategy = BonferroniStrategy(grid=(g,))
        value = rung_bound(scores, methods=("claimed_curve",), **family, delta=delta, significance=significance,
                           strategy=strategy).epsilon
        testable = claimed_curve_can_violate(**family, num_canaries=num_canaries, delta=delta,
                                             significance=significance, strategy=strategy)
        found.append((testable, value, g))
    if not found:
        raise InputError(f"{num_canaries} canaries are too few for a white-box rung")
    return max(found)[2]
