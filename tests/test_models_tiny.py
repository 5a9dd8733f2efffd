"""Tiny models of each family, built from configs (dpaudit.models.build_tiny)."""

from __future__ import annotations

import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.models import ARCHS, build_model, build_tiny


def _model(arch, tied, seed=0):
    return build_tiny(arch, vocab_size=256, bos_token_id=0, eos_token_id=0, seed=seed, tied=tied)


def test_tiny_models_of_each_family():
    for arch, ties in ARCHS.items():
        default = _model(arch, None)
        head, embedding = default.get_output_embeddings().weight, default.get_input_embeddings().weight
        assert (head is embedding) == ties, arch
        assert _model(arch, False).get_output_embeddings().weight is not _model(arch, False).get_input_embeddings().weight
        assert all(torch.equal(a, b) for a, b in zip(_model(arch, True, 3).parameters(),
                                                     _model(arch, True, 3).parameters()))
        names = " ".join(n for n, _ in default.named_parameters())
        assert "bias" in names and ("norm" in names or "ln_" in names), arch  # every kind exists
    with pytest.raises(InputError, match="unknown architecture"):
        build_tiny("bert", vocab_size=256, bos_token_id=0, eos_token_id=0, seed=0)
    gpt2 = build_model(size="tiny", vocab_size=256, bos_token_id=0, eos_token_id=0, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(gpt2.parameters(), _model("gpt2", None, 4).parameters()))
