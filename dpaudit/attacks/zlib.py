"""zlib-ratio attack (Carlini et al. 2021, "Extracting Training Data from Large Language
Models", USENIX Security): calibrate the model's perplexity by the text's zlib entropy,
so that texts that are merely easy (repetitive, boilerplate) do not look memorised.

The paper's metric is the ratio of the log-perplexity to the zlib entropy, the length in
bytes of ``zlib.compress(text)``; a low ratio flags memorisation. With
log-perplexity = mean token NLL (nats) = -mean log-probability:

    score = mean_logprob / len(zlib.compress(text.encode("utf-8")))
          = -(log-perplexity) / zlib entropy                      (higher = member)

The compressed length is that of the whole text, while the log-probabilities cover the
tokens kept after truncation to ``max_length``.
"""

from __future__ import annotations

import zlib as _zlib

import numpy as np

from dpaudit.attacks.base import Attack, AttackInputs, sequence_logprob
from dpaudit.attacks.registry import register

__all__ = ["ZlibAttack", "zlib_entropy"]


def zlib_entropy(texts) -> np.ndarray:
    """Bytes of ``zlib.compress`` (default level) of each UTF-8 text, float64 ``[n]``."""
    return np.array(
        [len(_zlib.compress(t.encode("utf-8", "surrogatepass"))) for t in texts], dtype=np.float64
    )


@register("zlib")
class ZlibAttack(Attack):
    """Carlini et al. 2021: score = mean token log-prob / zlib-compressed length in bytes."""

    requires = frozenset({"texts"})

    def __init__(self) -> None:
        pass

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        return sequence_logprob(inputs.target, "target") / zlib_entropy(inputs.texts)
