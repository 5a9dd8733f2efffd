"""Causal language models: build a GPT-2-style model from a size preset, or load one.

Models are saved with ``save_pretrained`` (safetensors) so that plain
``AutoModelForCausalLM.from_pretrained(run_dir / "model")`` loads them.
"""

from __future__ import annotations

import math
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


def build_from_architecture(path: str | Path, *, seed: int, trust_remote_code: bool = False) -> PreTrainedModel:
    """A freshly initialised causal LM with the architecture of the model in ``path`` (its
    ``config.json``, through ``AutoConfig`` and ``AutoModelForCausalLM.from_config``): the
    audited model's shape, none of its weights. ``seed`` fixes the initial weights."""
    config = load_model_config(path, trust_remote_code=trust_remote_code)
    with torch.random.fork_rng(devices=[]):  # the CPU generator only; global state is restored
        torch.manual_seed(seed)
        try:
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        except ValueError as err:
            raise InputError(f"{path} does not describe a causal language model: "
                             f"{str(err).splitlines()[0][:200]}") from None


def make_model(config: ModelConfig, tokenizer, *, seed: int) -> PreTrainedModel:
    """The model a run trains: built from ``config.size``, from ``config.architecture`` (fresh
    weights in the shape of a given model) or loaded from ``config.base_model``;
    its embedding grows to fit tokens added to the tokenizer (new-token canaries);
    with ``config.lora.enabled`` it is wrapped in ``peft`` LoRA adapters, and with
    ``config.trainable: input_embeddings`` every other parameter is frozen."""
    if config.base_model or config.architecture:
        if config.base_model:
            model = load_model(config.base_model, trust_remote_code=config.trust_remote_code)
        else:
            model = build_from_architecture(config.architecture, seed=seed, trust_remote_code=config.trust_remote_code)
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


def grow_vocabulary(model: PreTrainedModel, num_tokens: int) -> None:
    """Grow the embedding of ``model`` to ``num_tokens`` rows, every added row at the mean of
    the model's rows (input and output apart when the model does not tie them): tokens it never
    saw, none favoured over another (where ``resize_token_embeddings`` draws each at random)."""
    known = model.get_input_embeddings().weight.shape[0]
    if num_tokens <= known:
        return
    model.resize_token_embeddings(num_tokens, mean_resizing=False)
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():
        for w in [inputs] if outputs is inputs else [inputs, outputs]:
            w[known:] = w[:known].mean(0)


def isolate_token_rows(model: PreTrainedModel, *, token_ids, example_ids, mass: float = 0.999,
                       steps: int = 2000) -> float:
    """Give the tokens ``token_ids`` (the pool of new-token canaries, never in the data) one
    shared embedding row v, chosen so that a canary's loss has almost no gradient on the hidden
    states that predict its new tokens; returns the largest next-token probability those
    states leave off the pool (at most ``1 - mass`` unless ``steps`` did not suffice).

    At a hidden state h that predicts a new token, d loss / d h = sum_j p_j w_j - w_target
    (w: the output rows). When the model puts its next-token mass M on the pool, whose rows
    all equal v, this is (1 - M) (mean of the other rows under p - v): nothing reaches the
    shared weights, and a canary's clipped gradient lies on the output rows, nearly all of it
    on the row of the token it predicts, which no other canary trains. Where the rows are
    left as pretraining pushed them (its softmax moves every unseen token's row the same way),
    the canaries' gradients share one direction on the shared weights, most of their norm,
    and one canary's score moves with the inclusions of the others, so the one-run audit
    (Steinke, Nasr, Jagielski 2023, arXiv 2305.08846), which counts canaries as independent
    mechanisms, sees less of each (docs/ceilings.md). v (input and output rows apart when the
    model does not tie them) starts at the rows' mean and follows gradient descent on
    -log M at each position of ``example_ids`` (one canary's token ids) that predicts a new
    token, until every M reaches ``mass``."""
    return 1.0 - _shared_row(model, token_ids=token_ids, example_ids=example_ids, raise_mass=True,
                             mass=mass, steps=steps)


def mute_token_rows(model: PreTrainedModel, *, token_ids, example_ids, mass: float = 0.01,
                    steps: int = 2000) -> float:
    """The opposite of :func:`isolate_token_rows`, for canaries whose signal lies on their input
    rows (the isolated design of ``validate`` and the ladder's twins, where only the input
    embedding trains): one shared row v at which the hidden states that predict a canary's new
    tokens put at most ``mass`` of their next-token probability on the pool, so that d loss /
    d h, about (mean of the other rows under p - v), carries a canary's gradient back to its
    input rows. Rows at the other rows' mean can leave the pool most of the mass (0.89 after a
    twin canary's first token on a base of the demo's corpus with 8,192 new tokens) and the
    canaries a gradient far below the clipping norm. Returns the largest mass left on the pool."""
    return _shared_row(model, token_ids=token_ids, example_ids=example_ids, raise_mass=False, mass=mass,
                       steps=steps)


def _shared_row(model: PreTrainedModel, *, token_ids, example_ids, raise_mass: bool, mass: float,
                steps: int) -> float:
    """Set the rows ``token_ids`` to one value v, moved by gradient descent until the pool's
    next-token mass M at every position of ``example_ids`` that predicts one of them is at
    least (``raise_mass``) or at most ``mass``; returns the smallest M (raising) or the largest."""
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    example = torch.as_tensor(list(example_ids), dtype=torch.long)
    inputs, head = model.get_input_embeddings().weight, model.get_output_embeddings()
    tied = head.weight is inputs
    targets = torch.nonzero(torch.isin(example[1:], ids)).flatten()  # the positions that predict a new token
    if len(targets) == 0:
        raise InputError("the example canary predicts none of the tokens whose rows would be set")
    v_in = inputs.detach()[ids].mean(0).clone().requires_grad_(True)
    v_out = v_in if tied else head.weight.detach()[ids].mean(0).clone().requires_grad_(True)
    free = [v_in] if tied else [v_in, v_out]
    new_input = torch.isin(example, ids)[None, :, None]
    others = torch.ones(head.weight.shape[0], dtype=torch.bool).index_fill_(0, ids, False)
    was_training = model.training
    model.train(False)

    def log_mass() -> torch.Tensor:  # log M at each position that predicts a new token
        h = model.base_model(inputs_embeds=torch.where(new_input, v_in, inputs.detach()[example][None])
                             ).last_hidden_state[0, targets]
        logits = torch.cat([h @ head.weight.detach()[others].T, (h @ v_out)[:, None]], 1)
        if head.bias is not None:
            logits = logits + torch.cat([head.bias.detach()[others], head.bias.detach()[ids].logsumexp(0)[None]])
        else:
            logits[:, -1] += math.log(len(ids))
        return logits.log_softmax(-1)[:, -1]

    sign = -1.0 if raise_mass else 1.0  # descend on -log M to raise M, on log M to lower it

    def worst(lm: torch.Tensor) -> float:  # sign * log M at the position farthest from the goal
        return float((sign * lm.detach()).max())

    opt = torch.optim.Adam(free, lr=0.02)
    for _ in range(steps):
        lm = log_mass()
        if worst(lm) <= sign * math.log(mass):
            break
        opt.zero_grad()
        (sign * lm.sum()).backward(inputs=free)
        opt.step()
    with torch.no_grad():
        found = math.exp(sign * worst(log_mass()))
        inputs[ids] = v_in
        head.weight[ids] = v_out
    model.train(was_training)
    return found
