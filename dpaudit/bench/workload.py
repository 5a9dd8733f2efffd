"""What the timed rows run on: the GPT-2-style model of a size and batches of random tokens."""

from __future__ import annotations

import torch

from dpaudit.errors import InputError

VOCAB = 2000  # the demo's tokenizer size; tokens are drawn from it
VOCABS = {"gpt2": 50257}  # size gpt2: GPT-2's own vocabulary, so that the model is the 124M one
LENGTH = 128
MICROBATCH = 16  # the config default, for the batch-256 row
MEMORY_BATCH = 64


def check_size(size: str) -> None:
    """An :class:`~dpaudit.errors.InputError` unless ``size`` is one of :data:`dpaudit.models.SIZES`."""
    from dpaudit.models import SIZES

    if size not in SIZES:
        raise InputError(f"--size must be one of {', '.join(SIZES)}, got {size!r}")


def build_model(size: str, *, seed: int = 0, tied: bool = True):
    """A GPT-2-style model of ``size`` (:data:`dpaudit.models.SIZES`) with the vocabulary of
    :func:`vocabulary`, no dropout, train mode; ``tied=False``: its twin with the output layer
    a copy of the input embedding, not the same parameter (Opacus' ghost clipping refuses
    tied parameters)."""
    from dpaudit.models import build_model as build

    check_size(size)
    model = build(size=size, vocab_size=vocabulary(size), bos_token_id=0, eos_token_id=0, seed=seed)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.transformer.wte.weight.detach().clone())
    return model.train()


def vocabulary(size: str) -> int:
    """The model's vocabulary size: :data:`VOCABS` for ``size``, else :data:`VOCAB`."""
    return VOCABS.get(size, VOCAB)


def random_units(batch: int, *, length: int | None = None, seed: int = 1) -> list[list[torch.Tensor]]:
    """``batch`` units of one sequence of ``length`` (default :data:`LENGTH`) random tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randint(1, VOCAB, (length or LENGTH,), generator=generator)] for _ in range(batch)]
