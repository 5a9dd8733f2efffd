"""Tokenizers: train a byte-level BPE from scratch, or load a base model's tokenizer.

Training from scratch: :func:`train_tokenizer` trains a byte-level BPE (GPT-2 style) with
the ``tokenizers`` library and wraps it in ``transformers.PreTrainedTokenizerFast``; save it
beside the model with ``tokenizer.save_pretrained(model_dir)`` and reload it with
``AutoTokenizer.from_pretrained(model_dir)`` (or :func:`load_tokenizer`).

With a base model: :func:`load_tokenizer` loads that model's tokenizer.

Either way :func:`prepare_tokenizer` sets up padding *without growing the vocabulary*: the
pad token reuses the end-of-text token (or another existing token), and padding is on the
right. Because pad may equal eos, collators must build loss masks from
``attention_mask``, never from ``input_ids == pad_token_id``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from dpaudit.errors import InputError

__all__ = ["ENDOFTEXT", "train_tokenizer", "prepare_tokenizer", "load_tokenizer", "unencodable"]

ENDOFTEXT = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
                   "vocab.txt")


def train_tokenizer(texts: Iterable[str], *, vocab_size: int, seed: int | None = None):
    """Train a byte-level BPE tokenizer on ``texts``.

    ByteLevel pre-tokenizer and decoder (every byte is in the initial alphabet, so no
    input is ever unknown); one special token ``<|endoftext|>`` (id 0) serves as bos, eos,
    unk and pad. ``vocab_size`` counts the 256 byte tokens and the special token, so it must
    be at least 257.

    ``seed`` is accepted for a uniform interface and recorded in the tokenizer's
    ``init_kwargs``; BPE training has no randomness (the same texts give the same merges).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
        raise InputError(f"vocab_size must be an integer >= 257 (256 bytes + <|endoftext|>), got {vocab_size!r}")
    if isinstance(texts, str):
        raise InputError("texts must be an iterable of strings, not one string")
    if isinstance(texts, Sequence) and not isinstance(texts, (list, tuple)):
        texts = texts[:]  # a datasets Column iterates row by row (slow); a slice is one read

    count = 0

    def stream():
        nonlocal count
        for t in texts:
            if not isinstance(t, str):
                raise InputError(f"texts must be strings, got {type(t).__name__}")
            if t:
                count += 1
                yield t

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[ENDOFTEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stream(), trainer=trainer)
    if count == 0:
        raise InputError("cannot train a tokenizer on an empty corpus (no non-empty texts)")
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        unk_token=ENDOFTEXT,
    )
    wrapped.init_kwargs["dpaudit_seed"] = seed
    return prepare_tokenizer(wrapped)


def prepare_tokenizer(tokenizer):
    """Set up padding without growing the vocabulary; returns the same tokenizer.

    If the tokenizer has no pad token, the pad token becomes the eos token, else the bos,
    unk, sep or cls token, else the token with id 0 - always a token already in the
    vocabulary. Padding side is set to right. Raises ``InputError`` if the vocabulary is
    empty.
    """
    size_before = len(tokenizer)
    if tokenizer.pad_token is None:
        candidates = [
            getattr(tokenizer, name, None)
            for name in ("eos_token", "bos_token", "unk_token", "sep_token", "cls_token")
        ]
        vocab = tokenizer.get_vocab()  # includes added tokens
        choice = next((str(c) for c in candidates if c is not None and str(c) in vocab), None)
        if choice is None:
            if size_before == 0:
                raise InputError("the tokenizer has an empty vocabulary; cannot choose a pad token")
            choice = tokenizer.convert_ids_to_tokens(0)
        tokenizer.pad_token = str(choice)
    tokenizer.padding_side = "right"
    if len(tokenizer) != size_before:  # pragma: no cover - guarded above
        raise RuntimeError("prepare_tokenizer grew the vocabulary; this is a bug")
    return tokenizer


def load_tokenizer(path: str | os.PathLike, *, trust_remote_code: bool = False):
    """Load a tokenizer with ``AutoTokenizer`` (a local directory such as a saved model, or,
    when the user has a network, a hub model name) and apply :func:`prepare_tokenizer`."""
    from transformers import AutoTokenizer

    p = Path(path).expanduser()
    local = p.is_dir()
    if not local:
        s = str(path)
        if p.exists() or s.startswith(("/", "./", "../", "~")):
            raise InputError(f"tokenizer directory not found: {path}")
    if local and not any((p / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer from config.json alone
        raise InputError(f"{path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        tok = AutoTokenizer.from_pretrained(
            str(p) if local else str(path),
            trust_remote_code=bool(trust_remote_code),
            local_files_only=local,
        )
    except (OSError, ValueError) as exc:
        msg = " ".join(str(exc).split())[:300]
        raise InputError(f"could not load a tokenizer from {path}: {msg}") from None
    return prepare_tokenizer(tok)


def unencodable(input_ids: Iterable[Sequence[int]], *, tokenizer) -> list[tuple[int, str]]:
    """The texts (by index) that ``tokenizer`` cannot encode for training or scoring, each
    with why: fewer than two tokens (no next token to predict), or a token the tokenizer
    did not know (its unknown token, when that is a token of its own rather than the end of
    text). Empty: every text encodes."""
    special = {getattr(tokenizer, f"{name}_token_id", None) for name in ("eos", "bos", "pad")}
    unk = getattr(tokenizer, "unk_token_id", None)
    unk = None if unk in special else unk
    bad = []
    for i, ids in enumerate(input_ids):
        if len(ids) < 2:
            bad.append((i, f"it encodes to {len(ids)} token(s), a text needs at least 2"))
        elif unk is not None and unk in ids:
            bad.append((i, f"{list(ids).count(unk)} of its {len(ids)} tokens are unknown to the tokenizer "
                           f"({tokenizer.unk_token})"))
    return bad
