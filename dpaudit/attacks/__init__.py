"""Membership-inference attacks on language models, registered by name.

Every attack maps :class:`AttackInputs` (signals of candidate texts under the target
model, optionally texts, reference models and a population) to float64 scores, higher =
member. Registry names, used as keys in every JSON output:

==============  ===================================================================
``loss``        Yeom et al. 2018: mean token log-probability (minus the loss)
``zlib``        Carlini et al. 2021: log-perplexity over zlib entropy
``reference``   Carlini et al. 2021: calibrated by reference models' likelihood
``min_k``       Shi et al. 2024: mean of the lowest k% token log-probabilities
``min_k_pp``    Zhang et al. 2025: Min-K%++, standardised token log-probabilities
``lira_online`` Carlini et al. 2022: Gaussian likelihood ratio, in vs out models
``lira_offline`` Carlini et al. 2022: one-sided test against out models
``rmia``        Zarifzadeh et al. 2024: pairwise likelihood ratio vs a population
==============  ===================================================================

    from dpaudit.attacks import AttackInputs, get_attack, runnable_attacks
    inputs = AttackInputs(target=signals, texts=texts)
    scores = {name: get_attack(name).score(inputs) for name in runnable_attacks(inputs)}
"""

from dpaudit.attacks.base import REQUIREMENTS, Attack, AttackInputs
from dpaudit.attacks.registry import (
    attack_class,
    available_attacks,
    check_settings,
    get_attack,
    register,
    runnable_attacks,
)

# Importing the modules registers their attacks.
from dpaudit.attacks import lira, loss, min_k, reference, rmia, zlib  # noqa: E402,F401  isort: skip

__all__ = [
    "REQUIREMENTS",
    "Attack",
    "AttackInputs",
    "attack_class",
    "available_attacks",
    "check_settings",
    "get_attack",
    "register",
    "runnable_attacks",
]
