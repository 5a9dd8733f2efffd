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


def _build_model_works() -> bool:
    from dpaudit.models import build_model

    try:
        build_model(size="tiny", vocab_size=10, bos_token_id=0, eos_token_id=0, seed=0)
    except AssertionError:  # torch.random.fork_rng(devices=[cpu]) asks a CPU-only torch for CUDA
        return False
    return True


@pytest.fixture(autouse=True, scope="session")
def _cpu_safe_build_model():
    """WORKAROUND (remove when dpaudit.models is fixed): ``build_model`` forks the RNG with
    ``devices=[torch.device("cpu")]``, which torch reads as CUDA device ids and fails on a
    CPU-only build. Substitute the same construction with ``devices=[]``."""
    import dpaudit.models as models

    if _build_model_works():
        yield
        return
    original = models.build_model

    def build_model(*, size, vocab_size, bos_token_id, eos_token_id, seed):
        from transformers import GPT2Config, GPT2LMHeadModel

        if size not in models.SIZES:
            return original(size=size, vocab_size=vocab_size, bos_token_id=bos_token_id, eos_token_id=eos_token_id, seed=seed)
        config = GPT2Config(vocab_size=vocab_size, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **models.SIZES[size])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return GPT2LMHeadModel(config)

    models.build_model = build_model
    yield
    models.build_model = original
