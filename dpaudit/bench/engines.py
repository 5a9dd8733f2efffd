"""The gradient engines the bench compares: ours (ghost clipping and ``vmap``), the
non-private one, and Opacus' hooks and ghost clipping in our engine's shape.

Ghost clipping: Li et al. 2021, arXiv 2110.05679; book-keeping: Bu et al. 2023, arXiv 2210.00038.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch


class OpacusGhostEngine:
    """Opacus' ghost clipping (``GradSampleModuleFastGradientClipping``; Opacus 1.5+) in our
    engine's shape, for the benchmark only: per micro-batch a backward pass for the per-sample
    norms, a second one of the clip-weighted loss for the clipped sum (Opacus'
    ``DPTensorFastGradientClipping.backward``), then the same noise and divisor as ours."""

    private = True

    def __init__(self, model, *, expected_batch_size, microbatch_size, pad_id, device, noise_multiplier,
                 max_grad_norm, autocast_dtype=None):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        from dpaudit.train.engine import trainable_parameters

        self.model, self.device = model, torch.device(device)
        self.expected_batch_size, self.microbatch_size, self.pad_id = expected_batch_size, microbatch_size, pad_id
        self.std = noise_multiplier * max_grad_norm
        self.autocast_dtype = autocast_dtype  # the same forward precision as ours (bf16 on CUDA)
        self.params = trainable_parameters(model)
        self._gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum", strict=False,
                                                         max_grad_norm=max_grad_norm, use_ghost_clipping=True)

    def close(self) -> None:
        self._gsm._close()

    def step(self, units, generator=None):
        from dpaudit.train.engine import autocast_context, collate, example_losses, forward_logits

        sequences = sorted((unit[0] for unit in units), key=len, reverse=True)
        total = {name: torch.zeros_like(p) for name, p in self.params.items()}
        for start in range(0, len(sequences), self.microbatch_size):
            batch = collate(sequences[start : start + self.microbatch_size], pad_id=self.pad_id, device=self.device)
            self._gsm.enable_hooks()
            with autocast_context(self.device, self.autocast_dtype):
                losses = example_losses(forward_logits(self._gsm, batch), batch.labels)
            with warnings.catch_warnings():  # "Full backward hook is firing ...": the inputs are token ids
                warnings.filterwarnings("ignore", message="Full backward hook")
                losses.sum().backward(retain_graph=True)
            coefficients = self._gsm.get_clipping_coef()
            self.model.zero_grad(set_to_none=True)
            self._gsm.disable_hooks()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook")
                (coefficients.to(losses.device) * losses).sum().backward()
            for name, p in self.params.items():
                total[name] += p.grad
                p.grad, p._norm_sample = None, None
        for name, p in self.params.items():
            noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
            p.grad = (total[name] + self.std * noise) / self.expected_batch_size


def engine_factories(*, opacus: bool = True) -> tuple[dict[str, Callable], dict[str, str]]:
    """name -> engine class (or factory) for the timed rows, and why any is missing."""
    from dpaudit.train.engine import DPSGDEngine, NonPrivateEngine
    from dpaudit.train.ghost import choose_engine

    dp_class, options = choose_engine(DPSGDEngine, "auto")
    factories: dict[str, Callable] = {
        "nonprivate": NonPrivateEngine,
        "dpsgd": lambda model, **kw: dp_class(model, **options, **kw),
        "dpsgd_vmap": DPSGDEngine,
    }
    missing: dict[str, str] = {}
    if opacus:
        try:
            import opacus

            from dpaudit.train.opacus import OpacusEngine

            factories["opacus"] = OpacusEngine
            factories["opacus_ghost"] = OpacusGhostEngine
        except ImportError as err:
            reason = f"Opacus is not installed ({err}): pip install 'dpaudit[opacus]'"
            missing["opacus"] = missing["opacus_ghost"] = reason
    else:
        missing["opacus"] = missing["opacus_ghost"] = "not measured (opacus=False)"
    return factories, missing


def make_engine(factory: Callable, model, *, batch: int, microbatch: int, device, private: bool,
                autocast_dtype=None):
    """The engine of ``factory`` on ``model`` for a batch of ``batch`` units in micro-batches of
    ``microbatch``: private with noise multiplier 1 and clipping norm 1, else neither."""
    return factory(model, expected_batch_size=batch, microbatch_size=microbatch, pad_id=0, device=device,
                   noise_multiplier=1.0 if private else 0.0, max_grad_norm=1.0 if private else math.inf,
                   autocast_dtype=autocast_dtype)
