"""A small plug-in trainer for the fleet tests, plus a toy tokenizer and candidate set.

``train`` follows the plug-in contract (``train(dataset, tokenizer, *, seed) -> model``) and
takes the optional ``run_dir``, where it records the unit ids it was given so that the tests
can check each fleet model saw exactly its rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

MAX_LENGTH = 16
RECEIVED = "received.json"
FAIL_ENV = "FLEET_PLUGIN_FAIL_SEED"


def make_tokenizer(num_words: int = 40):
    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(num_words)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<eos>", unk_token="<unk>"
    )


def make_candidates(tokenizer, *, num_units: int = 8, rows_per_unit: int = 2) -> Dataset:
    texts, units = [], []
    for u in range(num_units):
        for r in range(rows_per_unit):
            texts.append(" ".join(f"w{(u * 7 + r * 3 + k) % 40}" for k in range(6)))
            units.append(f"unit-{u:02d}")
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=MAX_LENGTH)
    return Dataset.from_dict(
        {"text": texts, "input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "unit_id": units}
    )


def train(dataset, tokenizer, *, seed, run_dir=None):
    """A 1-layer GPT-2 after a few SGD steps on exactly ``dataset``'s rows.

    Fails (as a buggy trainer would) when ``FLEET_PLUGIN_FAIL_SEED`` names its seed."""
    if os.environ.get(FAIL_ENV) == str(seed):
        raise RuntimeError(f"fleet_plugin: asked to fail for seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(
            GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=64)
        )
    ids = torch.tensor(dataset["input_ids"])
    mask = torch.tensor(dataset["attention_mask"])
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for _ in range(3):
        batch = torch.randperm(len(ids), generator=gen)[:4]
        loss = model(input_ids=ids[batch], attention_mask=mask[batch], labels=labels[batch]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    if run_dir is not None:
        record = {"unit_ids": list(dataset["unit_id"]), "seed": seed, "pid": os.getpid(), "threads": torch.get_num_threads()}
        (Path(run_dir) / RECEIVED).write_text(json.dumps(record))
    return model.eval()
