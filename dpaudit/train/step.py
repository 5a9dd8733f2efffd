"""One DP-SGD update as a plug-in: the contract that ``dpaudit validate --step`` audits.

A step is any callable ``step(model, batch, *, generator) -> None`` that performs one DP-SGD
update of ``model`` in place:

- ``batch`` is ``{"input_ids": LongTensor[b, L], "attention_mask": LongTensor[b, L]}``,
  already sampled (the step does no sampling: every row is in the batch);
- the step computes its own causal-LM loss, clips, adds noise drawn from ``generator`` (a
  ``torch.Generator``) and updates the parameters, with whatever optimizer it owns.

The claim it is checked against is (noise multiplier S, clipping norm C, expected batch
size B). A step whose signature names the keyword-only ``noise_multiplier``,
``max_grad_norm`` or ``expected_batch_size`` is given the claimed values (so one step can
serve any claim); others keep their own.

:func:`dpsgd_step` (``dpaudit.train:dpsgd_step``) is the toolkit's own step: the DP-SGD
engine of :mod:`dpaudit.train.engine` (Abadi et al. 2016, arXiv 1607.00133: per-example
clipping to C, summed, N(0, S^2 C^2 I), divided by B) followed by plain SGD.
:func:`make_step` builds the same step around another engine class (the faulty engines of
:mod:`dpaudit.train.faulty`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from dpaudit.plugins import accepted_kwargs
from dpaudit.train.engine import DPSGDEngine, GradientEngine

__all__ = ["CLAIM_KWARGS", "STEP_LR", "batch_units", "call_step", "dpsgd_step", "make_step"]

#: The claimed parameters a step receives when its signature names them.
CLAIM_KWARGS = ("noise_multiplier", "max_grad_norm", "expected_batch_size")
#: The learning rate of the toolkit's SGD step (the audit is scale-free: any value works).
STEP_LR = 0.1


def batch_units(batch: Mapping[str, torch.Tensor]) -> list[list[torch.Tensor]]:
    """The rows of a step batch as units of one sequence each (padding, mask 0, dropped)."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    return [[row[m.bool()]] for row, m in zip(ids, mask)]


def make_step(engine: type[GradientEngine], *, lr: float = STEP_LR, keep: Sequence[str] = (),
              name: str | None = None) -> Callable[..., None]:
    """A step function ``step(model, batch, *, generator, noise_multiplier, max_grad_norm,
    expected_batch_size)``: ``engine`` leaves the private gradient in ``p.grad``, then plain
    SGD (``p -= lr * p.grad``). ``keep`` names engine attributes carried from one call to the
    next (state a trainer keeps across its steps, e.g. a noise vector drawn once)."""
    state: dict[str, object] = {}

    def step(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], *, generator: torch.Generator,
             noise_multiplier: float, max_grad_norm: float, expected_batch_size: int) -> None:
        units = batch_units(batch)
        e = engine(model, expected_batch_size=expected_batch_size, microbatch_size=max(1, len(units)), pad_id=0,
                   device=next(model.parameters()).device, noise_multiplier=noise_multiplier,
                   max_grad_norm=max_grad_norm)
        for attr, value in state.items():
            setattr(e, attr, value)
        try:
            e.step(units, generator)
            with torch.no_grad():
                for p in e.params.values():
                    p -= lr * p.grad
                    p.grad = None
        finally:
            e.close()
        state.update({attr: getattr(e, attr) for attr in keep})

    step.__name__ = step.__qualname__ = name or f"{engine.__name__}_step"
    step.__doc__ = f"One update: {engine.__name__} (clip, noise, divide by B), then SGD at lr {lr}."
    return step


dpsgd_step = make_step(DPSGDEngine, name="dpsgd_step")
dpsgd_step.__doc__ = (
    "The toolkit's DP-SGD step (Abadi et al. 2016, arXiv 1607.00133): per-example gradients clipped to "
    "max_grad_norm, summed, plus N(0, noise_multiplier^2 max_grad_norm^2 I), divided by expected_batch_size, "
    f"then plain SGD at lr {STEP_LR}.")


def call_step(fn: Callable[..., None], model, batch, *, generator: torch.Generator, noise_multiplier: float,
              max_grad_norm: float, expected_batch_size: int) -> None:
    """Call a step with the contract's arguments plus the claimed parameters it names."""
    claim = dict(zip(CLAIM_KWARGS, (noise_multiplier, max_grad_norm, expected_batch_size)))
    fn(model, batch, generator=generator, **accepted_kwargs(fn, claim))
