"""Teacher-forced continuation scores and greedy extraction.

* Continuation scores: the mean per-token log-probability of a target (a secret such as a
  patient's MRN) given the text before it, computed in the same teacher-forced pass that
  decides greedy extraction (:func:`continuation_scores`, :func:`score_continuations`).

* k-extractability (Carlini, Ippolito, Jagielski, Lee, Tramer, Zhang 2023, "Quantifying
  Memorization Across Neural Language Models", ICLR, arXiv 2202.07646): a training string
  ``p || t`` is extractable with ``k`` tokens of context when greedy decoding from the
  ``k``-token prefix ``p`` emits exactly ``t`` (:func:`greedy_extracted`,
  :func:`k_extractable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from dpaudit.devices import place_model, resolve_device
from dpaudit.errors import InputError
from dpaudit.extraction.forward import check_batch, takes_logits_to_keep
from dpaudit.signals.compute import check_texts

__all__ = [
    "ContinuationScores",
    "continuation_scores",
    "encode_continuations",
    "greedy_extracted",
    "k_extractable",
    "score_continuations",
    "trained_token_limit",
]


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
    keep_arg = takes_logits_to_keep(model)
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


def trained_token_limit(model, max_length: int) -> int:
    """The most tokens of a text that training saw: ``max_length`` (``data.max_length``), or
    the model's position table when it is shorter. A prefix and target beyond it were cut."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return min(max_length, positions) if isinstance(positions, int) else max_length


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
    check_batch(batch_size)
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
    check_batch(batch_size)
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
    check_batch(batch_size)
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
    check_batch(batch_size)
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

