"""Per-token signals: log-probabilities of many texts under one or many causal LMs.

Every membership attack in :mod:`dpaudit.attacks` and the exposure measure in
:mod:`dpaudit.extraction` start from the same numbers: for each text and each position,
the log-probability the model gives to the *next* token (shifted labels), plus two
statistics of the model's whole next-token distribution that Min-K%++ (Zhang et al.
2025, "Min-K%++: Improved Baseline for Detecting Pre-Training Data from Large Language
Models") needs:

    mean_t = sum_z p(z) log p(z)              (minus the entropy)
    std_t  = sqrt(sum_z p(z) (log p(z) - mean_t)^2)

These are computed once, batched, and cached in the run directory as
``signals/<name>.npz`` (plain ``np.savez``; no pickle), so that attacks and reports can be
rerun without touching a model.

Tokenisation uses the tokenizer's own defaults (``add_special_tokens=True``): a tokenizer
that prepends a BOS token (Llama) lets the first real token be scored; one that does not
(GPT-2) scores tokens 2..T. Column ``t`` of every array is the prediction of token
``t + 1`` from tokens ``0..t``. A text of fewer than two tokens has no scored token (its
mask row is all False).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from dpaudit.devices import place_model
from dpaudit.errors import InputError
from dpaudit.rundir import write_npz_atomic

__all__ = [
    "TokenSignals",
    "cached_signals",
    "check_texts",
    "compute_signals",
    "compute_signals_many",
    "signals_fingerprint",
]

#: Version of the ``.npz`` layout written by :meth:`TokenSignals.save`.
FORMAT_VERSION = 1

# On CPU the per-token statistics are computed on slices of the logits small enough to
# stay in cache (a few passes over each slice cost little once it is there). On GPU the
# slices only bound the temporary memory.
_CPU_CHUNK_BYTES = 1 << 19
_GPU_CHUNK_ELEMENTS = 1 << 27
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view: the caller's array stays writeable, ours cannot be mutated."""
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass(frozen=True, eq=False)
class TokenSignals:
    """Per-token signals of ``n`` texts under one model, padded to a common width.

    Attributes:
        logprob: float32 ``[n, L-1]``; ``logprob[i, t]`` = log p(token t+1 | tokens 0..t)
            of text ``i`` (shifted labels). 0 where ``mask`` is False.
        mask: bool ``[n, L-1]``; True where the predicted token is a real token of the text.
        mean: float32 ``[n, L-1]`` or None; sum_z p(z) log p(z) of the next-token
            distribution at that position (0 where masked).
        std: float32 ``[n, L-1]`` or None; the standard deviation of log p(z) under p.

    ``mean`` and ``std`` are optional so that signals from sources that only expose the
    chosen token's log-probability can still feed every attack but ``min_k_pp``.
    Arrays are stored as read-only views; the dataclass is frozen.
    """

    logprob: np.ndarray
    mask: np.ndarray
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    def __post_init__(self) -> None:
        lp = np.asarray(self.logprob, dtype=np.float32)
        if lp.ndim != 2:
            raise InputError(f"TokenSignals.logprob must be 2-D [n, L-1], got shape {lp.shape}")
        mask = np.asarray(self.mask)
        if mask.dtype != np.bool_:
            if not np.issubdtype(mask.dtype, np.integer):
                raise InputError(f"TokenSignals.mask must be boolean, got dtype {mask.dtype}")
            mask = mask.astype(bool)
        if mask.shape != lp.shape:
            raise InputError(
                f"TokenSignals.mask shape {mask.shape} differs from logprob shape {lp.shape}"
            )
        if (self.mean is None) != (self.std is None):
            raise InputError("TokenSignals.mean and TokenSignals.std must be given together")
        object.__setattr__(self, "logprob", _readonly(lp))
        object.__setattr__(self, "mask", _readonly(mask))
        for field in ("mean", "std"):
            value = getattr(self, field)
            if value is None:
                continue
            arr = np.asarray(value, dtype=np.float32)
            if arr.shape != lp.shape:
                raise InputError(
                    f"TokenSignals.{field} shape {arr.shape} differs from logprob shape {lp.shape}"
                )
            object.__setattr__(self, field, _readonly(arr))

    # -- shape -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of texts."""
        return int(self.logprob.shape[0])

    def __len__(self) -> int:
        return self.n

    @property
    def has_distribution_stats(self) -> bool:
        """True when ``mean`` and ``std`` are present (Min-K%++ needs them)."""
        return self.mean is not None

    def __repr__(self) -> str:
        stats = ", with mean/std" if self.has_distribution_stats else ""
        return f"TokenSignals(n={self.n}, width={self.logprob.shape[1]}{stats})"

    # -- per-text summaries --------------------------------------------------------------
    def token_count(self) -> np.ndarray:
        """int64 ``[n]``: number of scored tokens of each text."""
        return self.mask.sum(axis=1, dtype=np.int64)

    def sum_logprob(self) -> np.ndarray:
        """float64 ``[n]``: total log-probability of each text's scored tokens."""
        return np.where(self.mask, self.logprob, np.float32(0)).sum(axis=1, dtype=np.float64)

    def mean_logprob(self) -> np.ndarray:
        """float64 ``[n]``: mean scored-token log-probability, i.e. minus the LM loss.

        NaN for a text with no scored token (fewer than two tokens).
        """
        count = self.token_count()
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum_logprob() / count

    # -- subsets and persistence -----------------------------------------------------------
    def select(self, indices: np.ndarray | Sequence[int]) -> "TokenSignals":
        """The signals of a subset of texts (integer indices or a boolean mask), in order."""
        idx = np.asarray(indices)
        if idx.dtype != np.bool_ and not np.issubdtype(idx.dtype, np.integer):
            if idx.size:  # an empty list arrives as float64
                raise InputError(f"select() takes integer indices or a boolean mask, got {idx.dtype}")
            idx = idx.astype(np.int64)
        if idx.dtype == np.bool_ and idx.shape != (self.n,):
            raise InputError(f"boolean mask of shape {idx.shape} for {self.n} texts")

        def pick(a):
            return None if a is None else a[idx]

        return TokenSignals(
            logprob=pick(self.logprob), mask=pick(self.mask), mean=pick(self.mean), std=pick(self.std)
        )

    def _arrays(self) -> dict[str, np.ndarray]:
        out = {
            "format_version": np.asarray(FORMAT_VERSION, dtype=np.int64),
            "logprob": self.logprob,
            "mask": self.mask,
        }
        if self.mean is not None:
            out["mean"] = self.mean
            out["std"] = self.std
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write to ``path`` (an ``.npz`` made by ``np.savez``), atomically; returns the path."""
        path = Path(path)
        write_npz_atomic(path, **self._arrays())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TokenSignals":
        """Read signals written by :meth:`save` (``allow_pickle=False``)."""
        signals, _ = _load_npz(Path(path))
        return signals




def _load_npz(path: Path) -> tuple[TokenSignals, str | None]:
    """Signals and the stored fingerprint (None when absent)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            missing = {"logprob", "mask"} - keys
            if missing:
                raise InputError(f"{path}: not a signals file (missing {', '.join(sorted(missing))})")
            version = int(z["format_version"]) if "format_version" in keys else FORMAT_VERSION
            if version != FORMAT_VERSION:
                raise InputError(f"{path}: signals format version {version}, expected {FORMAT_VERSION}")
            has_stats = "mean" in keys and "std" in keys
            signals = TokenSignals(
                logprob=z["logprob"],
                mask=z["mask"],
                mean=z["mean"] if has_stats else None,
                std=z["std"] if has_stats else None,
            )
            fingerprint = str(z["fingerprint"]) if "fingerprint" in keys else None
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{path}: no such signals file") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: unreadable signals file ({type(exc).__name__}: {exc})") from None
    return signals, fingerprint


# ----------------------------------------------------------------------------------------
# computing signals
# ----------------------------------------------------------------------------------------


def _resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, torch.device):
        dev = device
    elif device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise InputError(f"unknown device {device!r} (use 'auto', 'cpu', 'cuda' or 'cuda:N')") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {device!r} requested but CUDA is not available")
    return dev


def check_texts(texts) -> list[str]:
    """``texts`` as a list of strings; InputError for a single string or a non-string item."""
    if isinstance(texts, (str, bytes)):
        raise InputError("texts must be a sequence of strings, not a single string")
    out = list(texts)
    bad = [i for i, t in enumerate(out) if not isinstance(t, str)]
    if bad:
        raise InputError(f"texts must be strings; item {bad[0]} is {type(out[bad[0]]).__name__}")
    return out


def _check_sizes(batch_size: int, max_length: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(max_length, int) or max_length < 2:
        raise InputError(f"max_length must be an integer >= 2, got {max_length!r}")


def _model_max_length(model, max_length: int) -> int:
    """Clamp ``max_length`` to the model's position table (GPT-2 fails beyond it)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and limit >= 2:
        return min(max_length, limit)
    return max_length


def _encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)
    return [list(ids) for ids in enc["input_ids"]]


def _batch_stats(logits: torch.Tensor, input_ids: torch.Tensor, lengths: np.ndarray):
    """float32 numpy ``[3, B, Lb-1]``: logprob, mean, std; 0 beyond each text's length.

    The logits ``[B, Lb, V]`` (overwritten: this module owns them) are walked as one
    ``[B * Lb, V]`` matrix, over the rows of real tokens only (adjacent texts' rows merged
    into one run), in slices that stay in a core's L2 cache on CPU (on GPU the slices only
    bound the temporary memory). Each slice ``x`` gets eight passes, one of them an
    exponential (the least any exact method needs): with ``y = x - max x`` (in place) and
    ``e = exp(y)`` (in one reused buffer, then multiplied by ``y`` in place, twice),

        s = sum e,    E_p[y] = sum(e y) / s,    E_p[y^2] = sum((e y) y) / s,

    so that ``log p = y - log s``, the mean of log p is ``E_p[y] - log s`` and its variance
    ``E_p[y^2] - E_p[y]^2``. Moments are taken of ``y`` (shift-invariant, and ``y`` is small
    where the mass is, so the difference does not cancel badly); float32 throughout. The
    sums land in preallocated rows and are finished once for the whole batch: no pass
    allocates a slice-sized tensor (fresh buffers cost more in page faults than the
    arithmetic), and few small operations run per slice.
    """
    bsz, seq, vocab = logits.shape
    dev = logits.device
    flat = logits.reshape(bsz * seq, vocab)  # a view when contiguous (the usual case)
    target = torch.zeros((bsz, seq), dtype=torch.long, device=dev)
    target[:, :-1] = input_ids[:, 1:]
    target = target.view(-1, 1)  # the last position of a text has no target: computed, then masked
    # rows of raw sums: sum e, sum e y, sum e y^2, y at the target
    acc = torch.zeros((4, bsz * seq, 1), dtype=torch.float32, device=dev)
    rows = max(1, (_CPU_CHUNK_BYTES // 4 if dev.type == "cpu" else _GPU_CHUNK_ELEMENTS) // vocab)
    work = torch.empty((min(rows, bsz * seq), vocab), dtype=torch.float32, device=dev)
    runs: list[list[int]] = []
    for b in range(bsz):
        r0, r1 = b * seq, b * seq + int(lengths[b])
        if runs and runs[-1][1] == r0:
            runs[-1][1] = r1
        else:
            runs.append([r0, r1])
    for r0, r1 in runs:
        for c0 in range(r0, r1, rows):
            c1 = min(r1, c0 + rows)
            y = flat[c0:c1].float()  # bf16 logits (CUDA autocast) one slice at a time
            e = work[: c1 - c0]
            y.sub_(y.amax(dim=-1, keepdim=True))
            torch.exp(y, out=e)
            torch.sum(e, dim=-1, keepdim=True, out=acc[0, c0:c1])
            torch.sum(e.mul_(y), dim=-1, keepdim=True, out=acc[1, c0:c1])
            torch.sum(e.mul_(y), dim=-1, keepdim=True, out=acc[2, c0:c1])
            torch.gather(y, 1, target[c0:c1], out=acc[3, c0:c1])
    s, m1, m2, y_target = acc.view(4, bsz, seq)[:, :, :-1]
    keep = torch.arange(seq - 1, device=dev)[None, :] < torch.as_tensor(lengths - 1, device=dev)[:, None]
    s = torch.where(keep, s, 1.0)  # rows never computed hold 0
    log_s = s.log()
    m1 = m1 / s
    var = (m2 / s).sub_(m1 * m1).clamp_min_(0.0)
    out = torch.stack([y_target - log_s, m1 - log_s, var.sqrt_()])
    return (out * keep).cpu().numpy()


def _signals_from_ids(
    model, ids: list[list[int]], *, batch_size: int, device: torch.device, progress: bool, desc: str
) -> TokenSignals:
    from dpaudit.progress import Progress

    n = len(ids)
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
    width = max(int(lengths.max(initial=0)) - 1, 0)
    logprob = np.zeros((n, width), dtype=np.float32)
    mean = np.zeros((n, width), dtype=np.float32)
    std = np.zeros((n, width), dtype=np.float32)
    mask = np.arange(width)[None, :] < (lengths - 1)[:, None]
    # Longest first: padding stays small, and an out-of-memory shows up at once.
    order = np.argsort(-lengths, kind="stable")

    dev = place_model(model, device)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if dev.type == "cuda"
        else contextlib.nullcontext()
    )
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), Progress(total=n, desc=desc, unit="text", enabled=progress) as bar:
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                blen = lengths[idx]
                seq = int(blen.max(initial=0))
                if seq < 2:  # sorted longest first: nothing left to score
                    bar.update(n - start)
                    break
                arr = np.zeros((len(idx), seq), dtype=np.int64)  # right padding (id 0, masked)
                for row, i in enumerate(idx):
                    arr[row, : lengths[i]] = ids[i]
                att = np.arange(seq)[None, :] < blen[:, None]
                input_ids = torch.from_numpy(arr).to(dev, non_blocking=True)
                attention_mask = torch.from_numpy(att.astype(np.int64)).to(dev, non_blocking=True)
                with autocast:
                    logits = model(
                        input_ids=input_ids, attention_mask=attention_mask, use_cache=False
                    ).logits
                stats = _batch_stats(logits, input_ids, blen)
                del logits
                logprob[idx, : seq - 1] = stats[0]
                mean[idx, : seq - 1] = stats[1]
                std[idx, : seq - 1] = stats[2]
                bar.update(len(idx))
    finally:
        if was_training:
            model.train()
    return TokenSignals(logprob=logprob, mask=mask, mean=mean, std=std)


def compute_signals(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 512,
    device: str | torch.device = "auto",
    progress: bool = True,
) -> TokenSignals:
    """Per-token log-probabilities of ``texts`` under a causal LM (batched).

    Texts are tokenised with the tokenizer's defaults, truncated to ``max_length`` tokens
    (and to the model's ``max_position_embeddings``), sorted by length to minimise
    padding, right-padded with an attention mask, and run under ``torch.inference_mode()``
    (bf16 autocast on CUDA); the output rows follow the order of ``texts``. Each logit
    goes through one exponential (float32, in cache-sized slices on CPU), from
    which the shifted-label log-prob and the mean/std used by Min-K%++ all follow.

    Args:
        model: a Hugging Face causal LM (anything returning ``.logits`` [B, L, V]). It is
            put in eval mode for the call (its mode is restored) and moved to ``device``.
        tokenizer: the matching Hugging Face tokenizer.
        texts: the texts.
        batch_size: texts per forward pass.
        max_length: longest token sequence kept per text.
        device: "auto" (CUDA if available, else CPU), "cpu", "cuda", "cuda:N" or a
            ``torch.device``.
        progress: show a tqdm progress bar on stderr.
    """
    texts = check_texts(texts)
    _check_sizes(batch_size, max_length)
    dev = _resolve_device(device)
    ids = _encode(tokenizer, texts, _model_max_length(model, max_length))
    return _signals_from_ids(
        model, ids, batch_size=batch_size, device=dev, progress=progress, desc="signals"
    )


def compute_signals_many(
    models: Iterable,
    tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 512,
    device: str | torch.device = "auto",
    progress: bool = True,
) -> list[TokenSignals]:
    """:func:`compute_signals` of the same texts under several models sharing a tokenizer.

    Texts are tokenised once. ``models`` may be a generator that loads each model on
    demand, so that only one model is in memory at a time.
    """
    texts = check_texts(texts)
    _check_sizes(batch_size, max_length)
    dev = _resolve_device(device)
    encoded: dict[int, list[list[int]]] = {}
    out = []
    for j, model in enumerate(models):
        limit = _model_max_length(model, max_length)
        if limit not in encoded:
            encoded[limit] = _encode(tokenizer, texts, limit)
        out.append(
            _signals_from_ids(
                model,
                encoded[limit],
                batch_size=batch_size,
                device=dev,
                progress=progress,
                desc=f"signals[{j}]",
            )
        )
    return out


# ----------------------------------------------------------------------------------------
# cache
# ----------------------------------------------------------------------------------------


def signals_fingerprint(texts: Sequence[str], *, model_id: str, max_length: int) -> str:
    """sha256 of the texts (in order), the model identity string and ``max_length``."""
    h = hashlib.sha256()
    h.update(f"dpaudit-signals-v{FORMAT_VERSION}\0".encode())
    h.update(model_id.encode("utf-8") + b"\0")
    h.update(f"max_length={max_length}\0n={len(texts)}\0".encode())
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def cached_signals(
    run_dir_or_cache_dir: str | os.PathLike,
    name: str,
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    model_id: str,
    batch_size: int = 16,
    max_length: int = 512,
    device: str | torch.device = "auto",
    progress: bool = True,
) -> TokenSignals:
    """:func:`compute_signals`, cached as ``<dir>/signals/<name>.npz``.

    The file is reused when its stored fingerprint (:func:`signals_fingerprint` of the
    texts, ``model_id`` and ``max_length``) matches; otherwise the signals are recomputed
    and the file is replaced atomically (temp file in the same directory, then
    ``os.replace``). An unreadable cache file counts as a miss. ``model_id`` must identify
    the weights (a path plus a checkpoint hash, a preset name plus a seed, ...): the cache
    cannot tell two models apart otherwise.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InputError(
            f"signals name {name!r} must be a plain file name (letters, digits, '.', '_', '-')"
        )
    if not isinstance(model_id, str) or not model_id:
        raise InputError("cached_signals needs a non-empty model_id string")
    texts = check_texts(texts)
    _check_sizes(batch_size, max_length)
    path = Path(run_dir_or_cache_dir) / "signals" / f"{name}.npz"
    fingerprint = signals_fingerprint(texts, model_id=model_id, max_length=max_length)
    if path.is_file():
        try:
            signals, stored = _load_npz(path)
        except InputError:
            stored = None
        if stored == fingerprint:
            return signals
    signals = compute_signals(
        model,
        tokenizer,
        texts,
        batch_size=batch_size,
        max_length=max_length,
        device=device,
        progress=progress,
    )
    arrays = signals._arrays()
    arrays["fingerprint"] = np.asarray(fingerprint)
    write_npz_atomic(path, **arrays)
    return signals
