"""Privacy of Gaussian mixtures: a group of units sampled independently (the group's
epsilon), and the last-iterate heuristic; both PLDs of ``dp_accounting``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpaudit.accounting.epsilon import quiet_absl
from dpaudit.accounting.events import check_delta_range, check_noise, check_sample_rate, check_steps
from dpaudit.errors import InputError


def group_epsilon(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float, group_size: int) -> float:
    """Epsilon of DP-SGD for a group of ``group_size`` protected units (e.g. r copies of one
    canary at note level), each sampled independently with rate q at every step: the sum of
    their clipped gradients has sensitivity k C with k ~ Binomial(r, q), so one step is a
    mixture of Gaussians (PLD of ``dp_accounting``), composed ``steps`` times. Tighter than
    the group-privacy conversion (r eps, r e^((r-1) eps) delta). ``group_size=1`` is the
    ordinary DP-SGD epsilon (up to discretisation). The PLD is the pessimistic estimate
    on a grid of 0.01 nats: an upper bound on the group's epsilon, 5 to 10 times faster
    than a grid of 0.001 and within 0.3% of it (0.001 nats at q = 0.1, T = 20; 0.007 at
    q = 0.05, T = 200)."""
    from scipy.stats import binom

    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InputError(f"group_size must be a positive integer, got {group_size!r}")
    sigma = check_noise(noise_multiplier)
    q = check_sample_rate(sample_rate)
    sizes = list(range(group_size + 1))
    mixture = pld_lib.from_mixture_gaussian_mechanism(
        sigma, sizes, [float(binom.pmf(k, group_size, q)) for k in sizes], value_discretization_interval=1e-2
    )
    with quiet_absl():
        return float(mixture.self_compose(check_steps(steps)).get_epsilon_for_delta(check_delta_range(delta)))


def last_iterate_epsilon(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                         step_weights: Sequence[float] | None = None) -> float:
    """The last-iterate heuristic epsilon of DP-SGD (Steinke et al. 2025, "The Last Iterate
    Advantage: Empirical Auditing and Principled Heuristic Analysis of Differentially Private
    SGD", ICLR 2025, arXiv 2410.06186).

    On linear losses, SGD's final iterate shows a canary only through the sum of its
    clipped gradients over the steps it was sampled in, under the sum of all the steps'
    noise: one observation sum_t w_t b_t + N(0, sigma^2 sum_t w_t^2), with b_t ~ Bernoulli(q)
    and w_t the share of step t's sum in the final model (``step_weights``, relative: its
    learning rate, and what the optimizer applied of it, :func:`dpaudit.train.plan.step_weights`;
    constant when None). Its
    epsilon at ``delta`` (a mixture-of-Gaussians PLD) is the heuristic: what a black-box
    audit of the final model can hope to show. It is not an upper bound on the privacy
    loss; the paper reports that none of the black-box audits it ran exceeded it.

    A varying schedule is handled by rounding each w_t / max w up to a multiple of 1/20 (a
    slightly larger signal), so that the sum takes at most 20 T + 1 values.
    """
    from scipy.stats import binom

    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    sigma, q, steps, delta = (check_noise(noise_multiplier), check_sample_rate(sample_rate),
                              check_steps(steps), check_delta_range(delta))
    w = np.ones(steps) if step_weights is None else np.asarray(step_weights, dtype=float)
    if w.shape != (steps,) or not np.all(np.isfinite(w)) or (w < 0).any() or not (w > 0).any():
        raise InputError(f"step_weights must be {steps} non-negative numbers, not all 0")
    w = w / w.max()
    noise = sigma * math.sqrt(float(np.sum(w ** 2)))
    if np.all(w == 1.0):
        values, probs = np.arange(steps + 1, dtype=float), binom.pmf(np.arange(steps + 1), steps, q)
    else:
        levels = 20
        units = np.ceil(w * levels - 1e-9).astype(int)
        probs = np.zeros(int(units.sum()) + 1)
        probs[0] = 1.0
        for u in units[units > 0]:  # the distribution of sum_t u_t b_t, one step at a time
            probs[u:] = (1 - q) * probs[u:] + q * probs[:-u].copy()
            probs[:u] *= 1 - q
        values = np.arange(probs.size) / levels
    keep = probs > 1e-15
    keep[np.flatnonzero(keep).max()] = True
    tail = 1.0 - probs[keep].sum()  # the dropped values' mass (< 1e-12), on the largest kept one
    p = probs[keep]
    p[-1] += max(tail, 0.0)
    if keep.sum() == 1:  # q = 1: every step samples the canary, a plain Gaussian mechanism
        mixture = pld_lib.from_gaussian_mechanism(noise, sensitivity=float(values[keep][0]),
                                                  value_discretization_interval=1e-2)
    else:
        mixture = pld_lib.from_mixture_gaussian_mechanism(noise, [float(v) for v in values[keep]],
                                                          [float(x) for x in p / p.sum()],
                                                          value_discretization_interval=1e-2)
    with quiet_absl():
        return float(mixture.get_epsilon_for_delta(delta))
