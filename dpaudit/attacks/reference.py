"""Reference-model attack (Carlini et al. 2021, "Extracting Training Data from Large
Language Models"): compare the target's likelihood of a text with that of reference
models that did not train on it, so that texts every model finds easy are discounted.

    mode="difference" (default):
        score = mean_logprob_target - mean_j mean_logprob_ref_j
    i.e. the log of the ratio of the reference perplexity to the target perplexity
    (per token), the calibrated loss of Watson et al. 2022 ("On the Importance of
    Difficulty Calibration in Membership Inference Attacks").
    mode="ratio":
        score = -loss_target / mean_j loss_ref_j
    the paper's ratio of log-perplexities (loss = mean token NLL).

Only "out" reference models enter the average: all of them when ``reference_keep`` is
None, else those with ``reference_keep[j, i]`` False for candidate ``i``. A candidate that
no reference model left out gets the mean of its "in" models shifted by the average
in-minus-out gap of the other candidates.
"""

from __future__ import annotations

import numpy as np

from dpaudit.attacks.base import (
    Attack,
    AttackInputs,
    fill_missing_means,
    reference_logprobs,
    sequence_logprob,
    split_in_out,
)
from dpaudit.attacks.registry import register
from dpaudit.errors import InputError

__all__ = ["ReferenceAttack"]

_MODES = ("difference", "ratio")


@register("reference")
class ReferenceAttack(Attack):
    """Carlini et al. 2021 reference-model calibration; ``mode`` "difference" or "ratio"."""

    requires = frozenset({"references"})

    def __init__(self, *, mode: str = "difference") -> None:
        self.mode = mode

    def validate_params(self) -> None:
        if self.mode not in _MODES:
            raise InputError(f"reference: mode must be one of {_MODES}, got {self.mode!r}")

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        target = sequence_logprob(inputs.target, "target")
        stats = split_in_out(reference_logprobs(inputs.references), inputs.reference_keep)
        _, ref = fill_missing_means(stats, self.name, need_in=False)
        if self.mode == "difference":
            return target - ref
        # minus the ratio of losses (a loss is minus a mean log-prob, so it is positive)
        return target / np.maximum(-ref, 1e-12)
