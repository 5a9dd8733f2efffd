"""Token-weighted loss and perplexity of a model on token sequences."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dpaudit.train.engine import autocast_context, collate, forward_logits, token_nll


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    sequences: Sequence[torch.Tensor],
    *,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[float, float]:
    """Token-weighted mean NLL and perplexity of ``sequences``."""
    if not sequences:
        return math.nan, math.nan
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    ordered = sorted(sequences, key=len, reverse=True)
    try:
        for start in range(0, len(ordered), batch_size):
            batch = collate(ordered[start : start + batch_size], pad_id=pad_id, device=device)
            with autocast_context(device, autocast_dtype):
                nll, n = token_nll(forward_logits(model, batch), batch.labels)
            total += float(nll.sum())
            count += int(n.sum())
    finally:
        model.train(was_training)
    loss = total / max(count, 1)
    return loss, math.exp(min(loss, 700.0))
