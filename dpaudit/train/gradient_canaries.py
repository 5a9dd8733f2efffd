"""Gradient canaries inside the model's own DP-SGD run: the white-box rung of the audit.

Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run" (arXiv
2305.08846), audit DP-SGD in the white-box, all-iterates setting with canary gradients that
the training run adds to its clipped sums. Here (``train.dp.gradient_canaries: M``):

- The M canaries are Dirac gradients of norm C (``train.dp.max_grad_norm``), canary i on
  coordinate i of a block of M coordinates appended to the parameter vector, which no data
  example reaches and no optimizer reads. So scoring costs nothing, and the model's own
  update is the same as without canaries.
- Membership: each canary is a member with probability 1/2, drawn once at the start (the
  one-run design). Inclusion: at every step each member is in the step's sum independently
  with the run's Poisson rate q (``PrivacyPlan.sample_rate``), as a protected unit is
  (:meth:`GradientCanaries.draw_sampled`); a non-member never is.
- The engine (:meth:`dpaudit.train.engine.GradientEngine.canary_step`) takes the step's
  block ``C * sampled`` as the clipped sum of the canaries' coordinates, adds the noise with
  its own ``add_noise`` as it does to the parameters' sums, and hands the noisy block back
  before dividing by the batch size: the canaries see what the mechanism releases at every
  step, not what the optimizer makes of it. A faulty engine's noise shows in the block as in
  the parameters; the Opacus adapter puts the block between Opacus's clipping and its noise.
- Score of canary i: the sum over steps of the released block's coordinate i, its
  projection on the canary's direction. For a correct engine
  ``C k_i + N(0, T sigma^2 C^2)`` with k_i ~ Binomial(T, q) for a member and 0 otherwise:
  M independent, exact copies of the claimed Poisson-subsampled Gaussian mechanism.

What the canaries do not see: bugs in per-unit clipping (the canary gradient has norm C
exactly and is never clipped), in the sampler of the data (the canaries draw their own
inclusions with the claimed rate), and in what comes after the noise (the divisor, the
optimizer). They test the noise against the claim.

Random draws: in reproducible mode from streams of their own, children of the run seed
(:meth:`~dpaudit.train.sampling.RunSeeds.canary_generator` for membership and inclusions,
:meth:`~dpaudit.train.sampling.RunSeeds.canary_noise_generator` for the noise), so that the
run's other streams, and its model weights, are the same with and without canaries; in
secure mode membership and inclusions from a keystream keyed by the OS
(:class:`~dpaudit.train.sampling.SecureRandom`) and the noise from the step's secure generator.
A model trained with canaries is an audit model (:data:`dpaudit.train.plan.GRADIENT_CANARY_WARNING`).

The result is a :class:`~dpaudit.audit.gradient_canaries.GradientCanaryRecord`; check it with
:func:`~dpaudit.audit.gradient_canaries.inclusion_check` before any bound.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpaudit.audit.gradient_canaries import GradientCanaryRecord, inclusion_check
from dpaudit.devices import to_device
from dpaudit.errors import InputError
from dpaudit.train.sampling import SecureRandom, bernoulli

__all__ = ["GradientCanaries", "GradientCanaryRecord", "inclusion_check"]


class GradientCanaries:
    """The gradient canaries of one training run: their draws, each step's block, their scores.

    Each step calls :meth:`block` (draws which members are in this step, returns the block
    ``C * sampled``) and then :meth:`observe` with the block as the mechanism released it
    (after the noise); :meth:`result` gives the record. ``rng``: a ``numpy.random.Generator``
    (reproducible mode) or :class:`~dpaudit.train.sampling.SecureRandom` (secure mode);
    ``noise_generator``: see :meth:`noise_source`."""

    def __init__(self, *, num_canaries: int, sample_rate: float, max_grad_norm: float,
                 rng: np.random.Generator | SecureRandom, noise_generator: torch.Generator | None = None):
        if isinstance(num_canaries, bool) or not isinstance(num_canaries, int | np.integer) or num_canaries < 1:
            raise InputError(f"the number of gradient canaries must be a positive integer, got {num_canaries!r}")
        if not 0 < sample_rate <= 1:
            raise InputError(f"the canaries' sampling rate q must be in (0, 1], got {sample_rate!r}")
        if not 0 < max_grad_norm < math.inf:
            raise InputError(f"gradient canaries need a finite clipping norm C > 0, got {max_grad_norm!r}")
        self.num_canaries = int(num_canaries)
        self.sample_rate = float(sample_rate)
        self.max_grad_norm = float(max_grad_norm)
        self.rng = rng
        self.noise_generator = noise_generator
        self.included = bernoulli(rng, 0.5, self.num_canaries)  # the one-run design: each in with probability 1/2
        self._members = np.flatnonzero(self.included)
        self._member_counts = np.zeros(self._members.size, dtype=np.int64)
        self._scores: torch.Tensor | None = None  # float64 sums, where the blocks are released
        self.steps = 0
        self._pending = False

    def __repr__(self) -> str:
        return (f"GradientCanaries(num_canaries={self.num_canaries}, members={self._members.size}, "
                f"sample_rate={self.sample_rate:.6g}, steps={self.steps})")

    def noise_source(self, generator: torch.Generator | None) -> torch.Generator | None:
        """The generator the engine draws the canaries' noise from: their own
        ``noise_generator`` when they have one (reproducible mode: a stream apart from the
        parameters' noise), else the step's ``generator`` (secure mode: one more draw of it)."""
        return self.noise_generator if self.noise_generator is not None else generator

    def draw_sampled(self) -> np.ndarray:
        """Which members are in this step: bool[number of members], each independently with
        probability q, drawn as :class:`~dpaudit.train.sampling.PoissonSampler` draws a unit
        (:func:`~dpaudit.train.sampling.bernoulli`)."""
        return bernoulli(self.rng, self.sample_rate, self._members.size)

    def block(self, *, device: torch.device | str = "cpu") -> torch.Tensor:
        """This step's canary block: float32[M] on ``device``, C at the sampled members'
        coordinates, 0 elsewhere. The caller adds noise to it and passes it to :meth:`observe`."""
        if self._pending:
            raise RuntimeError("the previous step's canary block was not observed")
        sampled = self.draw_sampled()
        self._member_counts += sampled
        values = np.zeros(self.num_canaries, dtype=np.float32)
        values[self._members[sampled]] = self.max_grad_norm
        self._pending = True
        return to_device(torch.from_numpy(values), device)

    def observe(self, released: torch.Tensor) -> None:
        """Add the block as the mechanism released it (clipped sum plus noise, before any
        division or optimizer) to the scores."""
        if not self._pending:
            raise RuntimeError("observe() without a block() of this step")
        released = released.detach().reshape(-1)
        if released.numel() != self.num_canaries:
            raise RuntimeError(f"the released canary block has {released.numel()} coordinates, "
                               f"not {self.num_canaries}")
        # summed in float64 where the block is (read at result(), not here: on CUDA a read
        # would make the host wait for the step's queued work)
        released = released.to(torch.float32).to(torch.float64)
        self._scores = released if self._scores is None else self._scores.add_(released)
        self.steps += 1
        self._pending = False

    def result(self) -> GradientCanaryRecord:
        """The frozen record of the steps so far."""
        if self._pending:
            raise RuntimeError("the last step's canary block was not observed")
        inclusions = np.zeros(self.num_canaries, dtype=np.int64)
        inclusions[self._members] = self._member_counts
        scores = np.zeros(self.num_canaries) if self._scores is None else self._scores.cpu().numpy()
        return GradientCanaryRecord(included=self.included, scores=scores, inclusions=inclusions,
                                    steps=self.steps, sample_rate=self.sample_rate, max_grad_norm=self.max_grad_norm)
