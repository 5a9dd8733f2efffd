"""Sampled decoding from a canary's prefix: the sampling attack of Carlini et al. 2021
("Extracting Training Data from Large Language Models", arXiv 2012.07805), where a secret is
recovered when a sample equals its tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpaudit.devices import place_model, resolve_device
from dpaudit.errors import InputError
from dpaudit.extraction.forward import cache_kwargs, prefix_state

__all__ = ["sample_continuations"]


def sample_continuations(
    model,
    *,
    prefix_ids: Sequence[int],
    num_samples: int,
    num_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    device: str | torch.device = "auto",
) -> np.ndarray:
    """int64 ``[num_samples, num_tokens]``: continuations of one prefix sampled from the
    model at ``temperature`` (the whole distribution, no top-k), the prefix computed once;
    seeded by a torch Generator. The sampling attack of Carlini et al. 2021 (arXiv
    2012.07805) on a canary's prefix: a secret is recovered when a sample equals its tokens."""
    for name, v in (("num_samples", num_samples), ("num_tokens", num_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"sample_continuations: {name} must be a positive integer, got {v!r}")
    if not float(temperature) > 0:
        raise InputError(f"sample_continuations: temperature must be > 0, got {temperature!r}")
    prefix = list(map(int, prefix_ids))
    if not prefix:
        raise InputError("sample_continuations: the prefix is empty")
    dev = place_model(model, resolve_device(device, what="extraction device"))
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    out = torch.zeros((num_samples, num_tokens), dtype=torch.long, device=dev)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            cache, dist = prefix_state(model, prefix, dev)
            cache.batch_repeat_interleave(num_samples)
            logits = dist[None].expand(num_samples, -1)
            for t in range(num_tokens):
                probs = torch.softmax(logits / float(temperature), dim=-1)
                out[:, t] = torch.multinomial(probs, 1, generator=gen)[:, 0]
                if t + 1 < num_tokens:
                    logits = model(input_ids=out[:, t : t + 1], use_cache=True,
                                   **cache_kwargs(model, cache)).logits[:, -1].float()
    finally:
        if was_training:
            model.train()
    return out.cpu().numpy()
