"""Causal language models: build a GPT-2-style model from a size preset, or load one.

Models are saved with ``save_pretrained`` (safetensors) so that plain
``AutoModelForCausalLM.from_pretrained(run_dir / "model")`` loads them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedModel

from dpaudit.config import ModelConfig
from dpaudit.errors import InputError

# GPT-2 shapes. "gpt2" is the 124M model of Radford et al. 2019 (with the tokenizer's vocabulary).
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 128},
    "small": {"n_layer": 4, "n_embd": 128, "n_head": 4, "n_positions": 256},
    "medium": {"n_layer": 6, "n_embd": 384, "n_head": 6, "n_positions": 512},
    "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
}


def build_model(*, size: str, vocab_size: int, bos_token_id: int, eos_token_id: int, seed: int) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2-style model; ``seed`` fixes the initial weights."""
    if size not in SIZES:
        raise InputError(f"unknown model size {size!r}: expected one of {', '.join(SIZES)}")
    config = GPT2Config(
        vocab_size=vocab_size,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        # no dropout: it would make per-example gradients random and slow DP-SGD for no benefit here
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **SIZES[size],
    )
    with torch.random.fork_rng(devices=[]):  # the CPU generator only; global state is restored
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)


#: The families :func:`build_tiny` builds, and whether each ties its output layer to the input
#: embedding by default (as the family's own config does).
ARCHS: dict[str, bool] = {"gpt2": True, "llama": False, "opt": True, "gpt_neox": False}
TINY = {"hidden": 64, "layers": 2, "heads": 2, "inner": 256, "positions": 128}  # the shapes of SIZES["tiny"]


def build_tiny(arch: str, *, vocab_size: int, bos_token_id: int, eos_token_id: int, seed: int,
               tied: bool | None = None) -> PreTrainedModel:
    """A freshly initialised tiny causal LM of the family ``arch`` (:data:`ARCHS`), built from a
    config (nothing downloaded), no dropout, with GPT-2 ``tiny``'s shapes. ``tied`` ties the
    output layer to the input embedding (default: as the family does). ``gpt2`` is
    :func:`build_model` (``Conv1D`` layers); ``llama``, ``opt`` and ``gpt_neox`` use
    ``nn.Linear``, and the Llama is built with attention and MLP biases (``attention_bias``,
    ``mlp_bias``; Llama ships without, Qwen2-style variants with) so that every kind of
    parameter exists in each family: embeddings, attention and MLP weights, biases, norm gains."""
    if arch not in ARCHS:
        raise InputError(f"unknown architecture {arch!r}: expected one of {', '.join(ARCHS)}")
    tied = ARCHS[arch] if tied is None else bool(tied)
    if arch == "gpt2" and tied:
        return build_model(size="tiny", vocab_size=vocab_size, bos_token_id=bos_token_id,
                           eos_token_id=eos_token_id, seed=seed)
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

    t = TINY
    ids = dict(vocab_size=vocab_size, bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=eos_token_id,
               tie_word_embeddings=tied)
    if arch == "gpt2":
        config, cls = GPT2Config(n_layer=t["layers"], n_embd=t["hidden"], n_head=t["heads"],
                                 n_positions=t["positions"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                 **ids), GPT2LMHeadModel
    elif arch == "llama":
        config, cls = LlamaConfig(hidden_size=t["hidden"], intermediate_size=t["inner"], num_hidden_layers=t["layers"],
                                  num_attention_heads=t["heads"], num_key_value_heads=t["heads"],
                                  max_position_embeddings=t["positions"], attention_bias=True, mlp_bias=True,
                                  **ids), LlamaForCausalLM
    elif arch == "opt":
        config, cls = OPTConfig(hidden_size=t["hidden"], ffn_dim=t["inner"], num_hidden_layers=t["layers"],
                                num_attention_heads=t["heads"], word_embed_proj_dim=t["hidden"],
                                max_position_embeddings=t["positions"], dropout=0.0, attention_dropout=0.0,
                                activation_dropout=0.0, layerdrop=0.0, **ids), OPTForCausalLM
    else:
        config, cls = GPTNeoXConfig(hidden_size=t["hidden"], intermediate_size=t["inner"],
                                    num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
                                    max_position_embeddings=t["positions"], hidden_dropout=0.0,
                                    attention_dropout=0.0, **ids), GPTNeoXForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(config)


def load_model_config(path: str | Path, *, trust_remote_code: bool = False):
    """The model's ``config.json``, or an InputError when ``path`` holds no model."""
    text = str(path)
    if not Path(path).exists() and (Path(path).is_absolute() or text.startswith((".", "~")) or text.count("/") > 1):
        raise InputError(f"model directory not found: {path}")  # not a hub name (ORG/NAME) either
    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        if "custom code" in str(err) or "trust_remote_code" in str(err):
            raise InputError(f"{path} ships its own model code, which dpaudit runs only when asked: pass "
                             "--trust-remote-code (model.trust_remote_code: true) if you trust it") from None
        raise InputError(f"{path} is not a model directory: {str(err).splitlines()[0]}") from None


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def load_model(path: str | Path, *, trust_remote_code: bool = False) -> PreTrainedModel:
    """Load a causal LM from a local directory (or a hub name when the user has a network).

    Untrusted artifacts: weights load from safetensors only (``use_safetensors=True``); a
    directory that holds only a pickle checkpoint (``pytorch_model.bin``: unpickling can run
    code) is refused, not loaded; the model's own code runs only with ``trust_remote_code``.
    A truncated or corrupted weights file is an InputError, not a traceback."""
    from safetensors import SafetensorError

    path = str(path)
    load_model_config(path, trust_remote_code=trust_remote_code)
    local = Path(path)
    if local.is_dir() and not any(local.glob("*.safetensors")):
        pickles = sorted(f.name for f in local.iterdir() if f.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise InputError(f"{path} holds only a pickle checkpoint ({pickles[0]}), which dpaudit refuses to load "
                             "(unpickling can run code): convert it to safetensors")
        raise InputError(f"{path} has no model.safetensors (no weights)")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                           use_safetensors=True, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:
        raise InputError(f"cannot load a causal language model from {path} (its weights are missing, truncated or "
                         f"corrupted?): {' '.join(str(err).split())[:200]}") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would fill them with random numbers: not the model that was released
        raise InputError(f"the weights in {path} lack {len(missing)} of the model's tensors ({missing[0]}, ...): "
                         "the checkpoint is incomplete or does not belong to this config.json")
    return model


def check_tokenizer_fits(model_path: str | Path, tokenizer, *, trust_remote_code: bool = False) -> None:
    """A tokenizer whose ids run past the model's embedding table does not belong to it."""
    config = load_model_config(model_path, trust_remote_code=trust_remote_code)
    rows = getattr(config, "vocab_size", None)
    if rows is not None and len(tokenizer) > rows:
        raise InputError(
            f"the tokenizer has {len(tokenizer)} tokens but the model {model_path} has {rows} embeddings: "
            "the tokenizer does not fit the model"
        )


def make_model(config: ModelConfig, tokenizer, *, seed: int) -> PreTrainedModel:
    """The model a run trains: built from ``config.size`` or loaded from ``config.base_model``;
    its embedding grows to fit tokens added to the tokenizer (new-token canaries);
    with ``config.lora.enabled`` it is wrapped in ``peft`` LoRA adapters, and with
    ``config.trainable: input_embeddings`` every other parameter is frozen."""
    if config.base_model:
        model = load_model(config.base_model, trust_remote_code=config.trust_remote_code)
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    else:
        model = build_model(
            size=config.size,
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            seed=seed,
        )
    model.config.pad_token_id = tokenizer.pad_token_id
    if config.lora.enabled:
        model = add_lora(model, config)
    return restrict_trainable(model, config.trainable)


def restrict_trainable(model: PreTrainedModel, trainable: str) -> PreTrainedModel:
    """Freeze every parameter but the ones ``trainable`` names (``model.trainable``): ``all``
    changes nothing; ``input_embeddings`` leaves the input embedding matrix alone trainable.
    A model whose output layer is tied to its input embedding is untied first (the output
    layer keeps a frozen copy of the same values), so that an example's gradient lies on the
    input rows of its own tokens only: a canary made of tokens no other example contains then
    moves rows nothing else moves. Returns ``model``."""
    if trainable == "input_embeddings":
        embedding = model.get_input_embeddings().weight
        output = model.get_output_embeddings()
        if output is not None and output.weight is embedding:
            output.weight = torch.nn.Parameter(embedding.detach().clone(), requires_grad=False)
            model.config.tie_word_embeddings = False
        for p in model.parameters():
            p.requires_grad_(p is embedding)
    elif trainable != "all":
        raise InputError(f"model.trainable must be all or input_embeddings, got {trainable!r}")
    return model


def add_lora(model: PreTrainedModel, config: ModelConfig) -> PreTrainedModel:
    """Wrap ``model`` in LoRA adapters (Hu et al. 2022); everything else is frozen."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    lora = PeftLoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        fan_in_fan_out=isinstance(model, GPT2LMHeadModel),  # GPT-2's Conv1D stores weights transposed
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def save_model(model: PreTrainedModel, tokenizer, directory: str | Path) -> None:
    """Save model and tokenizer side by side; LoRA adapters are merged into the base weights
    so that plain ``AutoModelForCausalLM.from_pretrained`` loads the result."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
