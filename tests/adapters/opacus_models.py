"""Tiny causal LMs of the four architectures, built from configs (nothing downloaded), and a way
to hand one to the step validator in place of its own tiny GPT-2."""

from __future__ import annotations

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)

VOCAB = 97


def build(arch: str, *, vocab_size: int = VOCAB, seed: int = 0):
    """A tiny ``arch`` model (2 layers, width 32, no dropout), in training mode; GPT-2 and OPT
    tie their embeddings, Llama and GPT-NeoX do not."""
    special = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    configs = {
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(
            vocab_size=vocab_size, n_layer=2, n_embd=32, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, **special)),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, **special)),
        "gpt_neox": lambda: GPTNeoXForCausalLM(GPTNeoXConfig(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, **special)),
        "opt": lambda: OPTForCausalLM(OPTConfig(
            vocab_size=vocab_size, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
            bos_token_id=0, eos_token_id=0, pad_token_id=1)),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = configs[arch]()
    return model.train()


def use_in_validator(arch: str, monkeypatch) -> None:
    """Make the step validator audit a tiny ``arch`` for the rest of the test: it builds its model
    with ``dpaudit.models.build_model`` (imported when it runs), which builds that instead (GPT-2:
    unchanged). The validator raises its GPT-2's final layer-norm gain when the canary's
    gradient norm is below 10 C, which other architectures lack: audit them at a C below a tenth
    of their canary's norm at initialization (C = 0.1 does)."""
    if arch != "gpt2":
        monkeypatch.setattr("dpaudit.models.build_model",
                            lambda *, vocab_size, seed, **_: build(arch, vocab_size=vocab_size, seed=seed))
