"""Tiny causal LMs of the four architectures, built from their transformers configs (nothing
downloaded), as a user would build their own: for the tests of which Opacus mode runs which
architecture, and, saved with ``save_pretrained``, as the user's own model directory. (The step
validator builds its own tiny models of these families: ``dpaudit validate --step --arch``.)"""

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

