"""Greedy extraction of the run's main canaries (the new-token canaries): k-extractability
(Carlini et al. 2023, arXiv 2202.07646) from each canary's prefix, counted for included and
excluded canaries."""

from __future__ import annotations

import numpy as np

from dpaudit.errors import InputError
from dpaudit.extraction.continuations import greedy_extracted

__all__ = ["canary_extraction"]


def canary_extraction(model, tokenizer, canaries: list, *, batch_size: int = 16, device="auto") -> dict:
    """``method``, ``included_extracted``, ``included_total``, ``excluded_extracted``,
    ``excluded_total`` and ``new_token_canaries`` of :data:`extraction.json
    <dpaudit.stages.extract>`: whether greedy decoding from each canary's prefix emits its
    secret."""
    extracted = np.zeros(len(canaries), dtype=bool)
    if canaries:
        split = [_split_canary(c, tokenizer) for c in canaries]
        extracted = greedy_extracted(model, tokenizer, prefixes=[p for p, _ in split], targets=[t for _, t in split],
                                     batch_size=batch_size, device=device)
    included = np.array([c.included for c in canaries], dtype=bool)
    return {
        "method": "greedy decoding from the canary prefix (from its first token, for a canary with none)",
        "included_extracted": int(extracted[included].sum()),
        "included_total": int(included.sum()),
        "excluded_extracted": int(extracted[~included].sum()),
        "excluded_total": int((~included).sum()),
        "new_token_canaries": {c.id: {"extracted": bool(e)} for c, e in zip(canaries, extracted)},
    }


def _split_canary(canary, tokenizer) -> tuple[str, str]:
    """``(prefix, target)`` for greedy extraction: the canary's own, or for a canary with no
    prefix (``new_token_bare``), its first token and the rest (a model cannot be prompted
    with nothing when its tokenizer adds no BOS token)."""
    if canary.prefix:
        return canary.prefix, canary.secret
    first = tokenizer.decode(tokenizer(canary.secret, add_special_tokens=False)["input_ids"][:1])
    if not canary.secret.startswith(first) or first == canary.secret:
        raise InputError(f"canary {canary.id} has no prefix and no first token to start extraction from")
    return first, canary.secret[len(first):]

