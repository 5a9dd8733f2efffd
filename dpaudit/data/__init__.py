"""Corpora, the built-in synthetic clinical-notes corpus, and tokenizers.

Heavy libraries (``datasets``, ``transformers``, ``tokenizers``, ``faker``) are imported
inside the functions that need them, so importing this package stays cheap.
"""

from dpaudit.data.clinical import generate_clinical_notes
from dpaudit.data.corpus import (
    apply_split,
    check_split,
    load_corpus,
    split_by_unit,
    tokenize_dataset,
)
from dpaudit.data.tokenizer import load_tokenizer, prepare_tokenizer, train_tokenizer

__all__ = [
    "generate_clinical_notes",
    "load_corpus",
    "split_by_unit",
    "apply_split",
    "check_split",
    "tokenize_dataset",
    "train_tokenizer",
    "prepare_tokenizer",
    "load_tokenizer",
]
