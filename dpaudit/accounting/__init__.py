"""Privacy accounting for DP-SGD, built on Google's ``dp_accounting``.

One DP-SGD step samples every protected unit independently with probability ``q``
(Poisson sampling), clips each unit's gradient to norm ``C`` and adds ``N(0, sigma^2 C^2 I)``
to their sum: the sampled Gaussian mechanism of Abadi et al., "Deep Learning with
Differential Privacy" (CCS 2016). ``T`` steps are the event

    SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), T)

and an accountant turns that event into an epsilon at a given delta:

- ``"pld"`` (default, tightest): privacy loss distributions, Koskela, Jälkö and Honkela,
  "Computing Tight Differential Privacy Guarantees Using FFT" (AISTATS 2020), and Doroshenko,
  Ghazi, Kamath, Kumar and Manurangsi, "Connect the Dots: Tighter Discrete Approximations
  of Privacy Loss Distributions" (PETS 2022), as implemented in ``dp_accounting.pld``.
- ``"rdp"``: Rényi differential privacy, Mironov, "Rényi Differential Privacy"
  (CSF 2017), and Mironov, Talwar and Zhang, "Rényi Differential Privacy of the Sampled
  Gaussian Mechanism" (2019), as implemented in ``dp_accounting.rdp``.

Both use the add-or-remove-one neighbouring relation, which is what Poisson sampling
with sensitivity ``C`` gives. Known value: N = 60000, q = 256/60000, sigma = 1.1,
60 epochs (14063 steps), delta = 1e-5 gives about 2.38 (PLD) and 2.60 (RDP).

A training run's claim is one frozen :class:`DpRecord` (its event, delta, unit and DP-SGD
parameters), built once by the trainer and stored as ``dp_event.json`` through its own codec
(:meth:`DpRecord.to_dict` / :meth:`DpRecord.from_dict`); later stages recompute epsilon from
its event (:meth:`DpRecord.epsilon`) instead of trusting a logged number.

Modules: :mod:`~dpaudit.accounting.events` (events and their JSON form),
:mod:`~dpaudit.accounting.epsilon` (epsilon and noise calibration),
:mod:`~dpaudit.accounting.mixtures` (groups and the last-iterate heuristic, both mixtures of
Gaussians), :mod:`~dpaudit.accounting.record` (the DP record).
"""

from dpaudit.accounting.epsilon import (
    MAX_NOISE,
    MIN_NOISE,
    check_delta,
    default_delta,
    epsilon,
    epsilon_from_event,
    noise_multiplier,
    quiet_absl,
)
from dpaudit.accounting.events import METHODS, event_from_dict, event_to_dict, make_event
from dpaudit.accounting.mixtures import group_epsilon, last_iterate_epsilon
from dpaudit.accounting.record import DpRecord, dpsgd_parameters, epsilon_from_record, read_record

__all__ = [
    "METHODS",
    "DpRecord",
    "MAX_NOISE",
    "MIN_NOISE",
    "check_delta",
    "default_delta",
    "dpsgd_parameters",
    "epsilon",
    "epsilon_from_event",
    "epsilon_from_record",
    "event_from_dict",
    "event_to_dict",
    "group_epsilon",
    "last_iterate_epsilon",
    "make_event",
    "noise_multiplier",
    "quiet_absl",
    "read_record",
]
