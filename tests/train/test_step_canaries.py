"""The step audit's canaries (dpaudit.train.step_canaries) on tiny models of every family
(dpaudit.models.build_tiny). No step is run here: fast."""

from __future__ import annotations

import pytest
import torch

from dpaudit.models import ARCHS, build_tiny
from dpaudit.train.step_canaries import KIND_LABELS, NORM_FACTOR, Statistics, design_canaries, parameter_kinds

VOCAB = 256
ROW = torch.arange(200, 208)
TARGET = {"embedding": ("embedding",), "weights": ("attention", "mlp"), "output": ("output",), "bias": ("bias",),
          "norm": ("norm",)}
CASES = [(arch, tied) for arch in ARCHS for tied in (True, False)]


def _model(arch, tied, seed=0):
    return build_tiny(arch, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, seed=seed, tied=tied).train()


def test_parameter_kinds_by_layer():
    kinds = parameter_kinds(_model("gpt2", False))
    assert kinds["transformer.wte.weight"] == kinds["transformer.wpe.weight"] == "embedding"
    assert kinds["lm_head.weight"] == "output"
    assert kinds["transformer.h.0.attn.c_attn.weight"] == "attention" and kinds["transformer.h.0.mlp.c_fc.weight"] == "mlp"
    assert kinds["transformer.h.0.attn.c_attn.bias"] == "bias" and kinds["transformer.ln_f.bias"] == "norm"
    tied = parameter_kinds(_model("gpt2", True))
    assert "lm_head.weight" not in tied and tied["transformer.wte.weight"] == "embedding"
    opt = parameter_kinds(_model("opt", True))
    assert opt["model.decoder.layers.0.fc1.weight"] == "mlp" and opt["model.decoder.layers.0.self_attn.q_proj.bias"] == "bias"


@pytest.mark.parametrize("arch, tied", CASES, ids=[f"{a}-{'tied' if t else 'untied'}" for a, t in CASES])
def test_each_canary_lies_in_its_kind(arch, tied):
    model = _model(arch, tied)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    canaries, skipped = design_canaries(model, ROW, max_grad_norm=0.5)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # the given model is left alone
    names = [k.name for k in canaries]
    assert names == ["spread", "embedding", "weights", *([] if tied else ["output"]), "bias", "norm"]
    assert set(skipped) == ({"output"} if tied else set()) and "tied" in skipped.get("output", "tied")
    for k in canaries:
        assert k.kind_norm >= NORM_FACTOR * 0.5 and k.norm >= k.kind_norm
        assert abs(sum(k.shares.values()) - 1) < 1e-9
        if k.name != "spread":
            share = sum(v for kind, v in k.shares.items() if kind in TARGET[k.name])
            assert share >= 0.95, (k.name, k.shares)
    spread = canaries[0].shares
    assert sum(v > 0.01 for v in spread.values()) >= 4  # spread over the kinds
    assert canaries[-1].shares["norm"] == 1.0  # exactly: nothing before the zeroed final norm gets a gradient


def test_canaries_restricted_and_impossible():
    model = _model("llama", False)
    canaries, skipped = design_canaries(model, ROW, max_grad_norm=0.5, names=["bias", "norm"])
    assert [k.name for k in canaries] == ["bias", "norm"] and skipped == {}
    with pytest.raises(ValueError, match="unknown canaries"):
        design_canaries(model, ROW, max_grad_norm=0.5, names=["biases"])
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            m.bias.requires_grad_(False)  # as a Llama without biases
    canaries, skipped = design_canaries(model, ROW, max_grad_norm=0.5, names=["bias"])
    assert canaries == [] and "no biases" in skipped["bias"]


def test_statistics_are_the_projections_on_the_canary_directions():
    model = _model("opt", False)
    canary = design_canaries(model, ROW, max_grad_norm=0.5, names=["spread"])[0][0]
    stats_, kinds, grads = canary.statistics, parameter_kinds(model), canary.grads
    rng = torch.Generator().manual_seed(0)
    update = {n: torch.randn(g.shape, generator=rng) for n, g in grads.items()}
    got = stats_.project(update)
    flat_g = torch.cat([grads[n].reshape(-1) for n in grads]).double()
    flat_u = torch.cat([update[n].reshape(-1) for n in grads]).double()
    assert got[0] == pytest.approx(float(-flat_g @ flat_u / flat_g.norm()), rel=1e-9)
    kind_of = {label: kind for kind, label in KIND_LABELS.items()}
    for label, value in zip(stats_.labels, got):
        members = [n for n in grads if kinds[n] == kind_of[label]] if label in kind_of else [label]
        if label != "all parameters":  # g restricted to a kind, or to one tensor
            g = torch.cat([grads[n].reshape(-1) for n in members]).double()
            u = torch.cat([update[n].reshape(-1) for n in members]).double()
            assert value == pytest.approx(float(-g @ u / g.norm()), rel=1e-9), label
    assert {"all parameters", "the embeddings", "the biases", "the norm layers"} <= set(stats_.labels)
    assert len(stats_) == len(stats_.labels) == len(got)
    # a tensor without gradient gives no statistic
    zero = {n: (g if n != "model.decoder.final_layer_norm.bias" else torch.zeros_like(g)) for n, g in grads.items()}
    assert "model.decoder.final_layer_norm.bias" not in Statistics(zero, kinds).labels
