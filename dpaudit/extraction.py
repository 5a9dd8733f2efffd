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
  (``method="skewnorm"``, as the paper does), which reaches beyond the sample.

* k-extractability (Carlini, Ippolito, Jagielski, Lee, Tramer, Zhang 2023, "Quantifying
  Memorization Across Neural Language Models", ICLR): a training string ``p || t`` is
  extractable with ``k`` tokens of context when greedy decoding from the ``k``-token
  prefix ``p`` emits exactly ``t``.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np
import torch

from dpaudit.errors import InputError
from dpaudit.signals import _check_texts, _place_model, _resolve_device

__all__ = ["exposure", "greedy_extracted", "k_extractable"]

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


def _greedy_match(
    model, prefixes: list[list[int]], targets: list[list[int]], *, batch_size: int, device
) -> np.ndarray:
    """True where greedy decoding from ``prefixes[i]`` emits exactly ``targets[i]``.

    Greedy decoding emits ``t`` iff at every step the most likely next token given
    ``prefix + t[:j]`` is ``t[j]`` (each step's context is then exactly that), so one
    teacher-forced forward pass over ``prefix + target`` decides it; no sampling loop.
    Ties in the argmax go to the lowest token id, as in ``torch.argmax`` and ``generate``.
    """
    n = len(prefixes)
    result = np.zeros(n, dtype=bool)
    if n == 0:
        return result
    dev = _place_model(model, _resolve_device(device))
    totals = np.array([len(p) + len(t) for p, t in zip(prefixes, targets)])
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and totals.max() > limit:
        i = int(np.argmax(totals))
        raise InputError(
            f"prefix + target of item {i} is {totals[i]} tokens; the model takes at most {limit}"
        )
    order = np.argsort(-totals, kind="stable")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                seq = int(totals[idx].max())
                arr = np.zeros((len(idx), seq), dtype=np.int64)
                att = np.zeros((len(idx), seq), dtype=np.int64)
                for row, i in enumerate(idx):
                    ids = prefixes[i] + targets[i]
                    arr[row, : len(ids)] = ids
                    att[row, : len(ids)] = 1
                logits = model(
                    input_ids=torch.from_numpy(arr).to(dev),
                    attention_mask=torch.from_numpy(att).to(dev),
                    use_cache=False,
                ).logits
                pred = logits[:, :-1].argmax(dim=-1).cpu().numpy()
                for row, i in enumerate(idx):
                    p, t = len(prefixes[i]), len(targets[i])
                    result[i] = bool(np.array_equal(pred[row, p - 1 : p - 1 + t], targets[i]))
    finally:
        if was_training:
            model.train()
    return result


def _check_batch(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")


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
    prefixes = _check_texts(prefixes)
    targets = _check_texts(targets)
    if len(prefixes) != len(targets):
        raise InputError(f"greedy_extracted: {len(prefixes)} prefixes but {len(targets)} targets")
    _check_batch(batch_size)
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
            raise InputError(f"greedy_extracted: prefix {i} is empty and the tokenizer adds no BOS token")
        if not t:
            raise InputError(f"greedy_extracted: target {i} is empty")
        pre.append(lead + p)
        tgt.append(t)
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
    texts = _check_texts(texts)
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
