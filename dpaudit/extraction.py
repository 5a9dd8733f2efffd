"""Extraction measures: exposure of inserted secrets and greedy k-extractability.

* Exposure (Carlini, Liu, Erlingsson, Kos, Song 2019, "The Secret Sharer: Evaluating and
  Testing Unintended Memorization in Neural Networks", USENIX Security). A canary
  ``s[r]`` holds a secret ``r`` drawn from a space ``R``. Rank all candidate secrets by
  the model's likelihood of the canary they make (rank 1 = most likely); then

      exposure = log2 |R| - log2 rank(r)

  between 0 (the secret is the least likely candidate) and ``log2 |R|`` (it is the
  model's first choice); a model that has not learnt the secret gives about 1 bit (the
  expected rank of a random candidate is about ``|R| / 2``). When ``R`` is too large to
  enumerate, the rank is estimated from a sample of candidates: by counting
  (``method="rank"``), or by fitting a skew-normal distribution to the sampled
  log-likelihoods and reading the canary's tail probability from it
  (``method="skewnorm"``, as the paper does), which reaches beyond the sample. From a
  model: :func:`enumerated_exposure` ranks every candidate of ``R`` (a prefix tree of their
  tokens after the canary's prefix, whose KV cache is computed once; :func:`candidate_logprobs`),
  :func:`sampled_exposure` fits the skew-normal to a sample, and :func:`sample_continuations`
  samples decodings from the prefix.

* k-extractability (Carlini, Ippolito, Jagielski, Lee, Tramer, Zhang 2023, "Quantifying
  Memorization Across Neural Language Models", ICLR): a training string ``p || t`` is
  extractable with ``k`` tokens of context when greedy decoding from the ``k``-token
  prefix ``p`` emits exactly ``t``.

* Continuation scores: the mean per-token log-probability of a target (a secret such as a
  patient's MRN) given the text before it, computed in the same teacher-forced pass that
  decides greedy extraction (:func:`continuation_scores`, :func:`score_continuations`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from dpaudit.devices import place_model, resolve_device
from dpaudit.errors import InputError
from dpaudit.signals import check_texts

__all__ = [
    "ContinuationScores",
    "SecretExposure",
    "candidate_logprobs",
    "continuation_scores",
    "encode_continuations",
    "enumerated_exposure",
    "exposure",
    "greedy_extracted",
    "k_extractable",
    "padded_tokens",
    "sample_continuations",
    "sampled_exposure",
    "score_continuations",
    "secret_space",
]

_METHODS = ("rank", "skewnorm")


def exposure(
    *,
    canary_logprob: float,
    candidate_logprobs: np.ndarray,
    secret_space_size: int,
    method: str = "rank",
) -> float:
    """Exposure of a canary's secret (Carlini et al. 2019, "The Secret Sharer").

    Args:
        canary_logprob: log-likelihood of the canary with the true secret under the model
            (e.g. ``TokenSignals.sum_logprob()`` of the canary text; any quantity where
            higher = the model finds it more likely, used alike for all candidates).
        candidate_logprobs: the same quantity for *other* candidate secrets: all of
            ``R`` except the true one (exact rank), or a uniform sample of ``R``.
        secret_space_size: ``|R|``, the number of possible secrets (a Python int may be
            huge).
        method: ``"rank"``: the fraction ``f`` of candidates more likely than the canary
            (ties count half) estimates the fraction of ``R``; ``"skewnorm"``: ``f`` is
            the upper tail beyond the canary of a skew-normal fitted to the candidates.

    Returns:
        ``log2 |R| - log2 rank`` with ``rank = 1 + (|R| - 1) f``, in ``[0, log2 |R|]``.
        With all of ``R`` but the secret given, the rank method is exact.
    """
    if method not in _METHODS:
        raise InputError(f"exposure: method must be one of {_METHODS}, got {method!r}")
    if isinstance(secret_space_size, bool) or not isinstance(secret_space_size, numbers.Integral):
        raise InputError(f"exposure: secret_space_size must be an integer, got {secret_space_size!r}")
    size = int(secret_space_size)
    if size < 2:
        raise InputError(f"exposure: secret_space_size must be at least 2, got {size}")
    canary = float(canary_logprob)
    if not math.isfinite(canary):
        raise InputError(f"exposure: canary_logprob must be finite, got {canary_logprob!r}")
    cands = np.asarray(candidate_logprobs, dtype=np.float64).ravel()
    if cands.size == 0:
        raise InputError("exposure: candidate_logprobs is empty")
    if not np.isfinite(cands).all():
        raise InputError("exposure: candidate_logprobs holds non-finite values")

    if method == "rank":
        better = np.count_nonzero(cands > canary) + 0.5 * np.count_nonzero(cands == canary)
        log_frac = math.log(better / cands.size) if better > 0 else -math.inf
    else:
        log_frac = _skewnorm_log_tail(cands, canary)
    return _exposure_from_log_frac(size, log_frac)


def _exposure_from_log_frac(size: int, log_frac: float) -> float:
    """``log2 |R| - log2 rank`` with ``rank = 1 + (|R| - 1) f`` and ``log_frac = log f``."""
    # log2(rank) = log2(1 + (|R| - 1) f), computed in logs so that tiny f and huge |R| work
    log_rank = np.logaddexp(0.0, math.log(size - 1) + log_frac) if log_frac > -math.inf else 0.0
    return float(max(0.0, math.log2(size) - log_rank / math.log(2)))


def _skewnorm_log_tail(cands: np.ndarray, canary: float) -> float:
    """log Pr[X >= canary] for X skew-normal, fitted by maximum likelihood to ``cands``."""
    from scipy import stats

    if cands.size < 3:
        raise InputError("exposure: the skew-normal fit needs at least 3 candidates")
    mu, sd = float(cands.mean()), float(cands.std())
    if not sd > 0:
        raise InputError("exposure: all candidate log-probabilities are equal; nothing to fit")
    z = (cands - mu) / sd  # the fit is better conditioned on standardised data
    a, loc, scale = stats.skewnorm.fit(z)
    return float(stats.skewnorm.logsf((canary - mu) / sd, a, loc, scale))


# ----------------------------------------------------------------------------------------
# greedy extraction
# ----------------------------------------------------------------------------------------


def _bos_lead(tokenizer) -> list[int]:
    """``[bos]`` when the tokenizer prepends a BOS token to what it encodes, else ``[]``."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    return [bos] if with_special[:1] == [bos] and plain[:1] != [bos] else []


class ContinuationScores(NamedTuple):
    """What one teacher-forced pass over ``prefix + target`` says about each target."""

    token_logprobs: list[np.ndarray]
    """``[i][j]``: natural-log probability of target token ``j`` given the prefix and the
    target's tokens before it (float64)."""
    extracted: np.ndarray
    """bool ``[n]``: greedy decoding from the prefix emits exactly the target's tokens."""

    def mean_logprob(self) -> np.ndarray:
        """float64 ``[n]``: mean per-token log-probability of each target (nats per token)."""
        return np.array([float(x.mean()) for x in self.token_logprobs], dtype=np.float64)

    def sum_logprob(self) -> np.ndarray:
        """float64 ``[n]``: log-probability of each whole target given its prefix."""
        return np.array([float(x.sum()) for x in self.token_logprobs], dtype=np.float64)


def _takes_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` takes a tensor ``logits_to_keep`` (transformers >= 4.50 causal
    LMs: the output layer is then applied at those sequence positions only)."""
    import inspect

    try:
        params = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False
    return "logits_to_keep" in params


def _teacher_forced(
    model, prefixes: list[list[int]], targets: list[list[int]], *, batch_size: int, device
) -> ContinuationScores:
    """One forward pass over each ``prefix + target`` (batched, sorted by length so that
    rows of a batch are padded little): the target tokens' log-probabilities and whether
    greedy decoding from the prefix emits the target.

    Greedy decoding emits ``t`` iff at every step the most likely next token given
    ``prefix + t[:j]`` is ``t[j]`` (each step's context is then exactly that), so the one
    teacher-forced pass decides it; no sampling loop. Ties in the argmax go to the lowest
    token id, as in ``torch.argmax`` and ``generate``. Only the logits at target positions
    are normalised, and where the model takes ``logits_to_keep`` its output layer is
    applied there only; the prefix is computed once, in the same pass.
    """
    n = len(prefixes)
    extracted = np.zeros(n, dtype=bool)
    logprobs: list[np.ndarray] = [np.zeros(0)] * n
    if n == 0:
        return ContinuationScores(logprobs, extracted)
    dev = place_model(model, resolve_device(device, what="extraction device"))
    totals = np.array([len(p) + len(t) for p, t in zip(prefixes, targets)])
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and totals.max() > limit:
        i = int(np.argmax(totals))
        raise InputError(
            f"prefix + target of item {i} is {totals[i]} tokens; the model takes at most {limit}"
        )
    order = np.argsort(-totals, kind="stable")
    keep_arg = _takes_logits_to_keep(model)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                seq = int(totals[idx].max())
                arr = np.zeros((len(idx), seq), dtype=np.int64)
                att = np.zeros((len(idx), seq), dtype=np.int64)
                rows, cols, want, bounds = [], [], [], [0]
                for row, i in enumerate(idx):
                    p, t = len(prefixes[i]), len(targets[i])
                    arr[row, : p + t] = prefixes[i] + targets[i]
                    att[row, : p + t] = 1
                    rows.extend([row] * t)
                    cols.extend(range(p - 1, p - 1 + t))  # the logits that predict the target
                    want.extend(targets[i])
                    bounds.append(bounds[-1] + t)
                kw = {}
                if keep_arg:  # the output layer only where a target token is predicted
                    keep = np.unique(cols)
                    kw["logits_to_keep"] = torch.from_numpy(keep).to(dev)
                logits = model(
                    input_ids=torch.from_numpy(arr).to(dev),
                    attention_mask=torch.from_numpy(att).to(dev),
                    use_cache=False,
                    **kw,
                ).logits
                if keep_arg and logits.shape[1] == len(keep) != seq:
                    cols = np.searchsorted(keep, cols).tolist()
                sel = logits[torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)]
                want_t = torch.tensor(want, device=logits.device)
                hit = (sel.argmax(dim=-1) == want_t).cpu().numpy()
                lp = torch.log_softmax(sel.float(), dim=-1).gather(1, want_t[:, None])[:, 0]
                lp = lp.double().cpu().numpy()
                for row, i in enumerate(idx):
                    a, b = bounds[row], bounds[row + 1]
                    extracted[i] = bool(hit[a:b].all())
                    logprobs[i] = lp[a:b].copy()
    finally:
        if was_training:
            model.train()
    return ContinuationScores(logprobs, extracted)


def _greedy_match(
    model, prefixes: list[list[int]], targets: list[list[int]], *, batch_size: int, device
) -> np.ndarray:
    """True where greedy decoding from ``prefixes[i]`` emits exactly ``targets[i]``
    (see :func:`_teacher_forced`)."""
    return _teacher_forced(model, prefixes, targets, batch_size=batch_size, device=device).extracted


def _check_batch(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")


def encode_continuations(
    tokenizer, *, prefixes: Sequence[str], targets: Sequence[str], who: str = "encode_continuations"
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids ``(prefix_ids, target_ids)`` of each ``(prefix, target)`` pair, as the
    model saw them in training when the two were one text.

    The target's tokens are those of ``prefix + target`` after the prefix's tokens (when
    the joint tokenisation does not start with the prefix's, the target is tokenised
    alone); the prefix gets the tokenizer's BOS token if it adds one. So a target that
    starts a new word should carry its leading space (``"MRN" + " 12345678"``).
    """
    prefixes = check_texts(prefixes)
    targets = check_texts(targets)
    if len(prefixes) != len(targets):
        raise InputError(f"{who}: {len(prefixes)} prefixes but {len(targets)} targets")
    lead = _bos_lead(tokenizer)
    p_ids = tokenizer(prefixes, add_special_tokens=False)["input_ids"] if prefixes else []
    f_ids = (
        tokenizer([p + t for p, t in zip(prefixes, targets)], add_special_tokens=False)["input_ids"]
        if prefixes
        else []
    )
    pre, tgt = [], []
    for i, (p, f) in enumerate(zip(p_ids, f_ids)):
        p, f = list(p), list(f)
        if f[: len(p)] == p:
            t = f[len(p) :]
        else:
            t = list(tokenizer(targets[i], add_special_tokens=False)["input_ids"])
        if not lead and not p:
            raise InputError(f"{who}: prefix {i} is empty and the tokenizer adds no BOS token")
        if not t:
            raise InputError(f"{who}: target {i} is empty")
        pre.append(lead + p)
        tgt.append(t)
    return pre, tgt


def score_continuations(
    model,
    prefix_ids: Sequence[Sequence[int]],
    target_ids: Sequence[Sequence[int]],
    *,
    batch_size: int = 16,
    device: str | torch.device = "auto",
) -> ContinuationScores:
    """Per-token log-probabilities of each target given its prefix, and whether greedy
    decoding from the prefix reproduces it, from token ids (e.g. of
    :func:`encode_continuations`): one batched teacher-forced pass, each prefix computed
    once for both measures. Items longer than the model's position table raise
    InputError."""
    _check_batch(batch_size)
    pre = [list(map(int, p)) for p in prefix_ids]
    tgt = [list(map(int, t)) for t in target_ids]
    if len(pre) != len(tgt):
        raise InputError(f"score_continuations: {len(pre)} prefixes but {len(tgt)} targets")
    bad = [i for i, (p, t) in enumerate(zip(pre, tgt)) if not p or not t]
    if bad:
        raise InputError(f"score_continuations: item {bad[0]} has an empty prefix or target")
    return _teacher_forced(model, pre, tgt, batch_size=batch_size, device=device)


def continuation_scores(
    model,
    tokenizer,
    *,
    prefixes: Sequence[str],
    targets: Sequence[str],
    batch_size: int = 16,
    device: str | torch.device = "auto",
) -> ContinuationScores:
    """:func:`score_continuations` of texts, tokenised by :func:`encode_continuations`:
    ``.mean_logprob()`` is the mean per-token log-probability of ``targets[i]`` given
    ``prefixes[i]``; ``.extracted`` is :func:`greedy_extracted`."""
    _check_batch(batch_size)
    pre, tgt = encode_continuations(tokenizer, prefixes=prefixes, targets=targets, who="continuation_scores")
    return _teacher_forced(model, pre, tgt, batch_size=batch_size, device=device)


def greedy_extracted(
    model,
    tokenizer,
    *,
    prefixes: Sequence[str],
    targets: Sequence[str],
    batch_size: int = 16,
    device: str | torch.device = "auto",
) -> np.ndarray:
    """bool ``[n]``: does greedy decoding from ``prefixes[i]`` reproduce ``targets[i]``
    exactly (token for token)? Carlini et al. 2023, "Quantifying Memorization Across
    Neural Language Models".

    The target's tokens are those of ``prefix + target`` after the prefix's tokens, i.e.
    the tokens the model saw in training when the two were one text (when the joint
    tokenisation does not start with the prefix's, the target is tokenised alone). The
    prefix gets the tokenizer's BOS token if it adds one. Exactly ``len(target tokens)``
    tokens are compared; what the model would emit after them does not matter.
    """
    _check_batch(batch_size)
    pre, tgt = encode_continuations(tokenizer, prefixes=prefixes, targets=targets, who="greedy_extracted")
    return _greedy_match(model, pre, tgt, batch_size=batch_size, device=device)


def k_extractable(
    model,
    tokenizer,
    *,
    texts: Sequence[str],
    k: int,
    suffix_length: int | None = None,
    batch_size: int = 16,
    device: str | torch.device = "auto",
) -> np.ndarray:
    """bool ``[n]``: is each text k-extractable (Carlini et al. 2023)? The first ``k``
    tokens of the text are the prompt (plus the tokenizer's BOS token if it adds one);
    greedy decoding must emit the next ``suffix_length`` tokens (default: all the rest).
    Texts with fewer than ``k + 1`` tokens (``k + suffix_length`` when given) raise
    InputError.
    """
    texts = check_texts(texts)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"k_extractable: k must be a positive integer, got {k!r}")
    if suffix_length is not None and (
        isinstance(suffix_length, bool) or not isinstance(suffix_length, int) or suffix_length < 1
    ):
        raise InputError(f"k_extractable: suffix_length must be a positive integer, got {suffix_length!r}")
    _check_batch(batch_size)
    lead = _bos_lead(tokenizer)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    need = k + (suffix_length or 1)
    short = [i for i, x in enumerate(ids) if len(x) < need]
    if short:
        raise InputError(
            f"k_extractable: {len(short)} text(s) have fewer than {need} tokens, e.g. index {short[0]}"
        )
    end = (lambda x: len(x)) if suffix_length is None else (lambda x: k + suffix_length)
    pre = [lead + list(x[:k]) for x in ids]
    tgt = [list(x[k : end(x)]) for x in ids]
    return _greedy_match(model, pre, tgt, batch_size=batch_size, device=device)


# ----------------------------------------------------------------------------------------
# exposure by enumeration (Secret Sharer) and sampled decoding
# ----------------------------------------------------------------------------------------


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


def _cache_kw(model, cache) -> dict:
    """``cache`` as the model's forward takes it: ``cache`` (transformers >= 5.x) or
    ``past_key_values`` (earlier)."""
    import inspect

    try:
        params = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        params = {}
    return {"cache" if "cache" in params else "past_key_values": cache}


def _prefix_state(model, prefix_ids: list[int], dev):
    """The KV cache of ``prefix_ids`` (computed once) and the log-probabilities of the next token."""
    out = model(input_ids=torch.tensor([prefix_ids], device=dev), use_cache=True)
    cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        raise InputError(f"{type(model).__name__} returns no reusable KV cache (use_cache=True)")
    return cache, torch.log_softmax(out.logits[0, -1].float(), dim=-1)


def _copy_cache(cache, batch: int):
    """A copy of a batch-1 KV cache, repeated ``batch`` times (the original stays as it is)."""
    import copy

    c = copy.deepcopy(cache)
    c.batch_repeat_interleave(batch)
    return c


def _extend(model, cache, paths: np.ndarray, dev, keep_arg: bool) -> torch.Tensor:
    """Next-token log-probabilities [B, V] after ``prefix + paths[b]`` (all paths of one
    length), from a copy of the prefix's cache repeated over the batch."""
    c = _copy_cache(cache, len(paths))
    kw = {"logits_to_keep": 1} if keep_arg else {}
    logits = model(input_ids=torch.from_numpy(np.ascontiguousarray(paths)).to(dev), use_cache=True,
                   **_cache_kw(model, c), **kw).logits
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
    _check_batch(batch_size)
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
    keep_arg = _takes_logits_to_keep(model)
    lp = np.zeros(n)
    alive = np.ones(n, dtype=bool)
    node = np.zeros(n, dtype=np.int64)  # each candidate's path id at the current depth
    paths = np.zeros((1, 0), dtype=np.int64)  # the token path of each id
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            cache, root = _prefix_state(model, prefix, dev)
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
    return SecretExposure(_exposure_from_log_frac(n, log_frac), "exact", secret_lp, float(1.0 + better))


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


def sample_continuations(
    model,
    *,
    prefix_ids: Sequence[int],
    num_samples: int,
    num_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    device: str | torch.device = "auto",
) -> np.ndarray:
    """int64 ``[num_samples, num_tokens]``: continuations of one prefix sampled from the
    model at ``temperature`` (the whole distribution, no top-k), the prefix computed once;
    seeded by a torch Generator. The sampling attack of Carlini et al. 2021 (arXiv
    2012.07805) on a canary's prefix: a secret is recovered when a sample equals its tokens."""
    for name, v in (("num_samples", num_samples), ("num_tokens", num_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"sample_continuations: {name} must be a positive integer, got {v!r}")
    if not float(temperature) > 0:
        raise InputError(f"sample_continuations: temperature must be > 0, got {temperature!r}")
    prefix = list(map(int, prefix_ids))
    if not prefix:
        raise InputError("sample_continuations: the prefix is empty")
    dev = place_model(model, resolve_device(device, what="extraction device"))
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    out = torch.zeros((num_samples, num_tokens), dtype=torch.long, device=dev)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            cache, dist = _prefix_state(model, prefix, dev)
            cache.batch_repeat_interleave(num_samples)
            logits = dist[None].expand(num_samples, -1)
            for t in range(num_tokens):
                probs = torch.softmax(logits / float(temperature), dim=-1)
                out[:, t] = torch.multinomial(probs, 1, generator=gen)[:, 0]
                if t + 1 < num_tokens:
                    logits = model(input_ids=out[:, t : t + 1], use_cache=True,
                                   **_cache_kw(model, cache)).logits[:, -1].float()
    finally:
        if was_training:
            model.train()
    return out.cpu().numpy()
