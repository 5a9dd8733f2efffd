"""The signals cache of a run directory: ``signals/<name>.npz`` beside the weights they score.

:func:`cached_signals` reuses a file when its stored fingerprint (:func:`signals_fingerprint`
of the texts, the model's identity and ``max_length``) matches, and otherwise recomputes the
signals (:func:`dpaudit.signals.compute_signals`) and replaces the file atomically. Files are
plain ``np.savez`` (no pickle): :meth:`TokenSignals.to_arrays` and a ``fingerprint``.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from dpaudit.errors import InputError
from dpaudit.rundir import write_npz_atomic
from dpaudit.signals.tokens import FORMAT_VERSION, TokenSignals

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def save_signals(path: str | os.PathLike, signals: TokenSignals, *, fingerprint: str | None = None) -> Path:
    """Write ``signals`` (and a cache ``fingerprint``) to ``path``, atomically; returns the path."""
    arrays = signals.to_arrays()
    if fingerprint is not None:
        arrays["fingerprint"] = np.asarray(fingerprint)
    path = Path(path)
    write_npz_atomic(path, **arrays)
    return path


def load_signals(path: str | os.PathLike) -> TokenSignals:
    """Signals written by :func:`save_signals` (``allow_pickle=False``)."""
    return _load(Path(path))[0]


def _load(path: Path) -> tuple[TokenSignals, str | None]:
    """Signals and the stored fingerprint (None when absent)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            signals = TokenSignals.from_arrays(z, origin=str(path))
            fingerprint = str(z["fingerprint"]) if "fingerprint" in z.files else None
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{path}: no such signals file") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: unreadable signals file ({type(exc).__name__}: {exc})") from None
    return signals, fingerprint


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
    device="auto",
    progress: bool = True,
) -> TokenSignals:
    """:func:`dpaudit.signals.compute_signals`, cached as ``<dir>/signals/<name>.npz``.

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
    from dpaudit.signals.compute import check_sizes, check_texts, compute_signals

    texts = check_texts(texts)
    check_sizes(batch_size, max_length)
    path = Path(run_dir_or_cache_dir) / "signals" / f"{name}.npz"
    fingerprint = signals_fingerprint(texts, model_id=model_id, max_length=max_length)
    if path.is_file():
        try:
            signals, stored = _load(path)
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
    save_signals(path, signals, fingerprint=fingerprint)
    return signals
