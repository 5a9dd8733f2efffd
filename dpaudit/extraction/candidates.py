"""A canary's candidate secrets under the model: the secret space ``R`` of the Secret Sharer
(Carlini, Liu, Erlingsson, Kos, Song 2019, arXiv 1802.08232), the log-probability of each
candidate after the canary's prefix, and the exposure they give.

:func:`enumerated_exposure` ranks every candidate of ``R`` (a prefix tree of their tokens
after the canary's prefix, whose KV cache is computed once; :func:`candidate_logprobs`);
:func:`sampled_exposure` fits the skew-normal of :func:`dpaudit.extraction.exposure`
to a sample of ``R`` when it is too large to enumerate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from dpaudit.devices import place_model, resolve_device
from dpaudit.errors import InputError
from dpaudit.extraction.exposure_metric import exposure, exposure_from_log_frac
from dpaudit.extraction.forward import cache_kwargs, check_batch, prefix_state, repeated_cache, takes_logits_to_keep

__all__ = [
    "SecretExposure",
    "candidate_logprobs",
    "enumerated_exposure",
    "padded_tokens",
    "sampled_exposure",
    "secret_space",
]


class SecretExposure(NamedTuple):
    """Exposure of one canary's secret (:func:`enumerated_exposure`, :func:`sampled_exposure`)."""

    exposure: float
    """``log2 |R| - log2 rank``, in bits."""
    method: str
    """``"exact"`` (every candidate of ``R`` ranked) or ``"skewnorm"`` (estimated from a sample)."""
    logprob: float
    """Natural-log probability of the secret's tokens given the prefix."""
    rank: float | None
    """Exact rank (1 = the model's first choice; ties count half), None when estimated."""


def secret_space(pattern: str) -> list[str]:
    """Every secret of a canary pattern (``'#'`` = a digit, ``'?'`` = a capital letter, other
    characters literal; :mod:`dpaudit.canaries`), in lexicographic order: ``R`` of the
    Secret Sharer (Carlini et al. 2019, arXiv 1802.08232)."""
    import itertools

    from dpaudit.canaries import _PATTERN_ALPHABETS

    if not isinstance(pattern, str) or not any(c in _PATTERN_ALPHABETS for c in pattern):
        raise InputError(f"secret_space: pattern must hold a '#' or '?', got {pattern!r}")
    parts = [_PATTERN_ALPHABETS.get(c, c) for c in pattern]
    return ["".join(t) for t in itertools.product(*parts)]



def _extend(model, cache, paths: np.ndarray, dev, keep_arg: bool) -> torch.Tensor:
    """Next-token log-probabilities [B, V] after ``prefix + paths[b]`` (all paths of one
    length), from a copy of the prefix's cache repeated over the batch."""
    c = repeated_cache(cache, len(paths))
    kw = {"logits_to_keep": 1} if keep_arg else {}
    logits = model(input_ids=torch.from_numpy(np.ascontiguousarray(paths)).to(dev), use_cache=True,
                   **cache_kwargs(model, c), **kw).logits
    return torch.log_softmax(logits[:, -1].float(), dim=-1)


def padded_tokens(candidate_ids) -> np.ndarray:
    """int64 ``[n, L]``: token lists right-padded with -1 (an int array is returned as is,
    -1 taken as its padding)."""
    if isinstance(candidate_ids, np.ndarray):
        if candidate_ids.ndim != 2 or not np.issubdtype(candidate_ids.dtype, np.integer):
            raise InputError("candidate token ids must be a 2-D integer array padded with -1")
        return candidate_ids.astype(np.int64, copy=False)
    cands = [list(map(int, c)) for c in candidate_ids]
    toks = np.full((len(cands), max((len(c) for c in cands), default=0)), -1, dtype=np.int64)
    for i, c in enumerate(cands):
        toks[i, : len(c)] = c
    return toks


def candidate_logprobs(
    model,
    *,
    prefix_ids: Sequence[int],
    candidate_ids: Sequence[Sequence[int]] | np.ndarray,
    threshold: float | None = None,
    batch_size: int = 512,
    device: str | torch.device = "auto",
) -> np.ndarray:
    """float64 ``[n]``: log-probability (nats) of each candidate's tokens given one shared
    prefix, as used to rank the secret space in the Secret Sharer (Carlini et al. 2019, arXiv
    1802.08232). ``candidate_ids``: token lists, or an int array padded with -1
    (:func:`padded_tokens`).

    The prefix is computed once (its KV cache is reused for every batch). The candidates are
    arranged as a prefix tree of their tokens: each distinct token path is run through the
    model once, at its depth, and its next-token distribution scores every candidate that
    continues it (10^6 six-digit secrets of one-digit tokens need about 1.1 * 10^5 paths, not
    6 * 10^6 tokens). With ``threshold``, a path whose log-probability so far is below it is
    not extended (log-probabilities only fall along a path): its candidates are returned as
    ``-inf``, known to be below ``threshold``; every candidate at or above it is exact. That is
    all an exact rank needs, and for a well-memorized secret it leaves little to compute.
    """
    check_batch(batch_size)
    prefix = list(map(int, prefix_ids))
    if not prefix:
        raise InputError("candidate_logprobs: the prefix is empty")
    toks = padded_tokens(candidate_ids)
    n = len(toks)
    if n == 0:
        return np.zeros(0)
    lengths = (toks >= 0).sum(axis=1)
    if lengths.min() < 1 or ((toks[:, 1:] >= 0) & (toks[:, :-1] < 0)).any():
        raise InputError("candidate_logprobs: a candidate has no tokens, or -1 padding before its last token")
    depth = int(lengths.max())
    vocab = int(toks.max()) + 1
    dev = place_model(model, resolve_device(device, what="extraction device"))
    keep_arg = takes_logits_to_keep(model)
    lp = np.zeros(n)
    alive = np.ones(n, dtype=bool)
    node = np.zeros(n, dtype=np.int64)  # each candidate's path id at the current depth
    paths = np.zeros((1, 0), dtype=np.int64)  # the token path of each id
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            cache, root = prefix_state(model, prefix, dev)
            for d in range(depth):
                idx = np.nonzero(alive & (lengths > d))[0]
                if idx.size == 0:
                    break
                used, inv = np.unique(node[idx], return_inverse=True)
                order = np.argsort(inv, kind="stable")
                starts = np.searchsorted(inv[order], np.arange(len(used) + 1))
                tok_d = toks[idx, d]
                got = np.empty(idx.size)
                for a in range(0, len(used), batch_size):
                    b = min(a + batch_size, len(used))
                    dist = root[None] if d == 0 else _extend(model, cache, paths[used[a:b]], dev, keep_arg)
                    sel = order[starts[a] : starts[b]]  # the candidates under these paths
                    rows = torch.from_numpy(inv[sel] - a).to(dist.device)
                    cols = torch.from_numpy(tok_d[sel]).to(dist.device)
                    got[sel] = dist[rows, cols].double().cpu().numpy()
                lp[idx] += got
                key = node[idx] * vocab + tok_d
                ukeys, inv2 = np.unique(key, return_inverse=True)
                paths = np.concatenate([paths[ukeys // vocab], (ukeys % vocab)[:, None]], axis=1)
                node[idx] = inv2
                if threshold is not None:
                    alive[idx] = lp[idx] >= threshold
    finally:
        if was_training:
            model.train()
    lp[~alive] = -math.inf
    return lp


def enumerated_exposure(
    model,
    *,
    prefix_ids: Sequence[int],
    candidate_ids: Sequence[Sequence[int]] | np.ndarray,
    secret_index: int,
    batch_size: int = 512,
    device: str | torch.device = "auto",
) -> SecretExposure:
    """Exact exposure (Carlini et al. 2019, arXiv 1802.08232): ``candidate_ids`` are the
    tokens of every secret of ``R`` (after the canary's prefix) and ``secret_index`` the
    inserted one. The rank counts the candidates the model finds more likely than the secret
    (ties half), computed with :func:`candidate_logprobs` pruned at the secret's
    log-probability, so only the candidates that could outrank it are scored in full."""
    candidate_ids = padded_tokens(candidate_ids)
    n = len(candidate_ids)
    if not 0 <= secret_index < n:
        raise InputError(f"enumerated_exposure: secret_index {secret_index} is not in 0..{n - 1}")
    if n < 2:
        raise InputError("enumerated_exposure: the secret space needs at least 2 candidates")
    secret_lp = float(candidate_logprobs(model, prefix_ids=prefix_ids, candidate_ids=candidate_ids[secret_index : secret_index + 1],
                                         batch_size=batch_size, device=device)[0])
    lp = candidate_logprobs(model, prefix_ids=prefix_ids, candidate_ids=candidate_ids, threshold=secret_lp,
                            batch_size=batch_size, device=device)
    lp[secret_index] = -math.inf
    # the secret's own score from the pruned pass (one float path) decides the ties
    better = np.count_nonzero(lp > secret_lp) + 0.5 * np.count_nonzero(lp == secret_lp)
    log_frac = math.log(better / (n - 1)) if better > 0 else -math.inf
    return SecretExposure(exposure_from_log_frac(n, log_frac), "exact", secret_lp, float(1.0 + better))


def sampled_exposure(
    model,
    *,
    prefix_ids: Sequence[int],
    secret_ids: Sequence[int],
    sample_ids: Sequence[Sequence[int]],
    secret_space_size: int,
    batch_size: int = 512,
    device: str | torch.device = "auto",
) -> SecretExposure:
    """Exposure estimated from a uniform sample of other secrets (``sample_ids``, their
    tokens): the skew-normal fit of Carlini et al. 2019 (arXiv 1802.08232, section 4.3),
    :func:`exposure` with ``method="skewnorm"``, for spaces too large to enumerate."""
    lp = candidate_logprobs(model, prefix_ids=prefix_ids, candidate_ids=[list(secret_ids), *sample_ids],
                            batch_size=batch_size, device=device)
    value = exposure(canary_logprob=lp[0], candidate_logprobs=lp[1:], secret_space_size=secret_space_size,
                     method="skewnorm")
    return SecretExposure(value, "skewnorm", float(lp[0]), None)

