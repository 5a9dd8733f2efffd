"""Fixtures for the training tests: a tiny byte-level BPE tokenizer and hand-built datasets
(the real corpus and tokenizer live in dpaudit.data, written separately)."""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

WORDS = (
    "patient presents with fever cough and mild chest pain history of asthma no known allergies "
    "prescribed amoxicillin follow up in two weeks blood pressure normal heart rate elevated"
).split()


def make_texts(n: int, *, seed: int = 0, min_words: int = 3, max_words: int = 14) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(n)]


def make_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_texts(200, seed=1), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def make_dataset(tokenizer, n: int, *, seed: int = 0, users: int | None = None, max_length: int = 32,
                 pad_to: int | None = None) -> Dataset:
    """Rows with text, input_ids, attention_mask, unit_id; ``users`` groups rows into that
    many users (unit_id = user), else unit_id = row index. ``pad_to`` right-pads rows."""
    texts = make_texts(n, seed=seed)
    ids, masks = [], []
    for text in texts:
        row = tokenizer(text)["input_ids"][:max_length] + [tokenizer.eos_token_id]
        row = row[:max_length]
        mask = [1] * len(row)
        if pad_to:
            mask += [0] * (pad_to - len(row))
            row += [tokenizer.pad_token_id] * (pad_to - len(row))
        ids.append(row)
        masks.append(mask)
    rng = random.Random(seed + 7)
    unit_ids = [f"u{rng.randrange(users)}" for _ in range(n)] if users else [f"r{i}" for i in range(n)]
    return Dataset.from_dict({"text": texts, "input_ids": ids, "attention_mask": masks, "unit_id": unit_ids})


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(name="make_dataset", scope="session")
def make_dataset_fixture():
    """The ``make_dataset`` function (a fixture, because another conftest module may own
    the name ``conftest`` in ``sys.modules``)."""
    return make_dataset


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)
    yield

