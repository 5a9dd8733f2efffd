"""Tiny models of each family, built from configs (dpaudit.models.build_tiny)."""

from __future__ import annotations

import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.models import ARCHS, build_model, build_tiny, isolate_token_rows


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


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_isolated_token_rows_put_a_canarys_gradient_on_its_own_row(arch, tied):
    """After isolate_token_rows, a new-token canary's loss gradient lies on the output row of
    the token it predicts (the shared weights get none of it), against a minority before."""
    model = _model(arch, tied)
    pool, canary = list(range(200, 256)), torch.tensor([[1, 230, 241]])  # an ordinary token, then two new ones

    def own_share() -> float:
        model.zero_grad(set_to_none=True)
        model(canary, labels=canary).loss.backward()
        total = sum(float(p.grad.square().sum()) for p in model.parameters() if p.grad is not None)
        head = model.get_output_embeddings().weight.grad
        return float(head[[230, 241]].square().sum()) / total

    before = own_share()
    left = isolate_token_rows(model, token_ids=pool, example_ids=canary[0].tolist())
    assert left <= 1e-3
    # the rest lies on the other pool rows, p_j h with p_j about 1/56 each: 3% of the norm squared
    assert before < 0.5 < 0.95 < own_share(), (before, own_share())
    inputs, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert torch.equal(inputs[200], inputs[255]) and torch.equal(head[200], head[255])
    assert not torch.equal(inputs[199], inputs[200])  # the other rows are untouched
    with pytest.raises(InputError, match="predicts none"):
        isolate_token_rows(model, token_ids=pool, example_ids=[230, 1, 2])
