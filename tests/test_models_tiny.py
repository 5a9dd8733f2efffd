"""Tiny models of each family, built from configs (dpaudit.models.build_tiny)."""

from __future__ import annotations

import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.models import ARCHS, build_model, build_tiny, grow_vocabulary, isolate_token_rows, mute_token_rows


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


@pytest.mark.parametrize("tied", [True, False])
def test_grown_rows_start_at_the_mean_of_the_others(tied):
    """grow_vocabulary: the added rows start at the mean of the others, input and output rows
    apart; the others are untouched."""
    model = _model("gpt2", tied)
    before = [w.detach().clone() for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)]
    grow_vocabulary(model, 300)
    for old, new in zip(before, (model.get_input_embeddings().weight, model.get_output_embeddings().weight)):
        assert new.shape[0] == 300 and torch.equal(new[:256], old)
        assert torch.allclose(new[270], old.mean(0)) and torch.equal(new[256], new[299])


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_muted_token_rows_send_a_canarys_gradient_to_its_input_rows(arch, tied):
    """mute_token_rows: the pool keeps at most 1% of the next-token probability where a canary
    predicts a new token, and the canary's gradient reaches its first token as an input, which
    isolated rows take away."""
    model = _model(arch, tied)
    pool, canary = list(range(200, 256)), torch.tensor([[230, 241]])

    def input_gradient() -> float:
        embedded = model.get_input_embeddings()(canary).detach().requires_grad_(True)
        model(inputs_embeds=embedded, labels=canary).loss.backward()
        return float(embedded.grad[0, 0].norm())

    with torch.no_grad():
        before = float(model(canary).logits[0, 0].softmax(-1)[pool].sum())
    left = mute_token_rows(model, token_ids=pool, example_ids=[230, 241], steps=300)
    with torch.no_grad():
        assert float(model(canary).logits[0, 0].softmax(-1)[pool].sum()) == pytest.approx(left, rel=1e-4)
    assert left < min(0.1, before / 2)  # 0.01 untied; tied, a tiny random model moves its hidden state along
    muted = input_gradient()
    isolate_token_rows(model, token_ids=pool, example_ids=[230, 241])
    assert input_gradient() < 0.2 * muted
