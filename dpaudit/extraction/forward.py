"""How the extraction measures call a causal LM (internal to :mod:`dpaudit.extraction`):
the keywords its forward takes, and a prefix's KV cache computed once and reused."""

from __future__ import annotations

import inspect

import torch

from dpaudit.errors import InputError


def check_batch(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")


def _forward_params(model) -> dict:
    try:
        return inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return {}


def takes_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` takes a tensor ``logits_to_keep`` (transformers >= 4.50 causal
    LMs: the output layer is then applied at those sequence positions only)."""
    return "logits_to_keep" in _forward_params(model)


def cache_kwargs(model, cache) -> dict:
    """``cache`` as the model's forward takes it: ``cache`` (transformers >= 5.x) or
    ``past_key_values`` (earlier)."""
    return {"cache" if "cache" in _forward_params(model) else "past_key_values": cache}


def prefix_state(model, prefix_ids: list[int], dev):
    """The KV cache of ``prefix_ids`` (computed once) and the log-probabilities of the next token."""
    out = model(input_ids=torch.tensor([prefix_ids], device=dev), use_cache=True)
    cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        raise InputError(f"{type(model).__name__} returns no reusable KV cache (use_cache=True)")
    return cache, torch.log_softmax(out.logits[0, -1].float(), dim=-1)


def repeated_cache(cache, batch: int):
    """A copy of a batch-1 KV cache, repeated ``batch`` times (the original stays as it is)."""
    import copy

    c = copy.deepcopy(cache)
    c.batch_repeat_interleave(batch)
    return c
