"""Opacus adapter: ``dpaudit.train.opacus:dpsgd``, an optional extra (``pip install dpaudit[opacus]``).

The same loop, sampler, accounting and record as ``dpaudit.train:dpsgd``; only the
private gradient comes from Opacus (Yousefpour et al., "Opacus: User-Friendly
Differential Privacy Library in PyTorch", 2021): its ``GradSampleModule`` hooks compute
per-sample gradients and its ``DPOptimizer`` clips them, sums them and adds
N(0, sigma^2 C^2 I); the adapter then divides by the expected batch size (Opacus's own
``loss_reduction="mean"`` would divide by ``expected_batch_size * micro-batches``, wrong
for micro-batched accumulation, so the adapter uses ``"sum"`` and divides itself).

GPT-2 fix: GPT-2 builds ``position_ids`` of shape (1, L) and broadcasts them over the
batch, so Opacus's embedding hook sees a batch of one for the position embedding and
produces a wrong (or mis-shaped) per-sample gradient. The adapter always passes explicit
position ids of shape (B, L) (:func:`dpaudit.train.engine.collate`).

Gradient canaries (``train.dp.gradient_canaries``, :mod:`dpaudit.train.gradient_canaries`):
the adapter runs ``DPOptimizer.pre_step`` in its parts (``clip_and_accumulate``,
``add_noise``), then sets the canary block as the clipped sum of a parameter of the canaries'
coordinates and runs Opacus's own ``add_noise`` on it.

Only ``train.dp.unit: example`` is supported (Opacus has no per-user clipping).
"""

from __future__ import annotations

import warnings

import torch

from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.train.engine import GradientEngine, StepStats, collate, example_losses, forward_logits
from dpaudit.train.loop import TrainerSpec, run_training
from dpaudit.train.record import TrainingRecord
from dpaudit.train.step import batch_units


def _import_opacus():
    try:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer
    except ImportError:
        raise InputError("the Opacus trainer needs the optional extra: pip install 'dpaudit[opacus]'") from None
    return GradSampleModule, DPOptimizer


class OpacusEngine(GradientEngine):
    """Per-sample gradients, clipping and noise by Opacus; division by the expected
    batch size by the adapter."""

    private = True

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        GradSampleModule, DPOptimizer = _import_opacus()
        # strict=False: Opacus refuses any module with buffers (GPT-2 keeps masks and
        # rotary models keep frequencies as buffers, which do not affect per-sample grads)
        self._gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)
        self._optimizer = DPOptimizer(
            torch.optim.SGD(list(self.params.values()), lr=0.0),  # never stepped: only the DP part is used
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=self.expected_batch_size,
            loss_reduction="sum",
        )

    def close(self) -> None:
        self._gsm.remove_hooks()

    def step(self, units, generator=None) -> StepStats:
        if any(len(unit) != 1 for unit in units):
            raise InputError("the Opacus trainer supports train.dp.unit: example only")
        stats = StepStats(num_units=len(units), num_examples=len(units))
        order = sorted(range(len(units)), key=lambda u: len(units[u][0]), reverse=True)
        sequences = [units[u][0] for u in order]
        for p in self.params.values():
            p.grad, p.grad_sample, p.summed_grad = None, None, None
        if not sequences:  # an empty Poisson batch: noise only
            for p in self.params.values():
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        for start in range(0, len(sequences), self.microbatch_size):
            batch = collate(sequences[start : start + self.microbatch_size], pad_id=self.pad_id, device=self.device)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                losses = example_losses(forward_logits(self.model, batch), batch.labels)
            with warnings.catch_warnings():
                # Opacus's hooks on the first layer see no input that requires grad (token ids)
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                losses.sum().backward()
            stats.add_losses(losses.detach())
        missing = [name for name, p in self.params.items() if p.grad_sample is None]
        if missing:
            raise RuntimeError(f"Opacus computed no per-sample gradient for: {', '.join(missing[:5])}")
        if sequences:
            flat = [self._optimizer._get_flat_grad_sample(p) for p in self.params.values()]
            norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in flat], dim=1).norm(2, dim=1)
            # the per-sample rows come in the order of ``sequences``
            stats.add_norms(norms, order, max_grad_norm=self.max_grad_norm)
        # Opacus's pre_step in its parts: clip and sum (p.summed_grad), the noise (p.grad); the canaries after
        self._optimizer.generator = generator
        self._optimizer.clip_and_accumulate()
        self._optimizer.add_noise()
        self._optimizer.scale_grad()  # a no-op with loss_reduction="sum": the adapter divides
        self.canary_step(generator)
        for p in self.params.values():
            p.grad = p.grad / self.expected_batch_size
            p.grad_sample, p.summed_grad = None, None
        return stats

    def canary_step(self, generator) -> None:
        """The canary block as the clipped sum (``summed_grad``) of a parameter of their M
        coordinates, alone in the optimizer's parameters for one more ``add_noise`` of Opacus
        with the canaries' noise source; its noisy ``grad`` goes to their scores."""
        if self.canaries is None:
            return
        parameter = torch.nn.Parameter(torch.empty(self.canaries.num_canaries, device=self.device))
        parameter.summed_grad = self.canaries.block(device=self.device)
        optimizer = self._optimizer
        groups = optimizer.param_groups
        optimizer.param_groups = [{**groups[-1], "params": [parameter]}]
        optimizer.generator = self.canaries.noise_source(generator)
        try:
            optimizer.add_noise()
        finally:
            optimizer.param_groups = groups
            optimizer.generator = generator
        self.canaries.observe(parameter.grad)


OPACUS = TrainerSpec("dpaudit.train.opacus:dpsgd", private=True, engine=OpacusEngine, units=("example",))


def dpsgd(dataset, tokenizer, *, seed: int, config: Config | None = None, record: TrainingRecord | None = None,
          eval_dataset=None):
    """DP-SGD through Opacus, in dpaudit's loop (Poisson sampling, accounting, run
    directory). ``config=None`` uses the ``tiny`` preset with noise multiplier 1.0."""
    _import_opacus()
    return run_training(dataset, tokenizer, seed=seed, spec=OPACUS, config=config, record=record,
                        eval_dataset=eval_dataset)


dpsgd.claims_dp = True


def dpsgd_step(model, batch, *, generator, noise_multiplier: float, max_grad_norm: float,
               expected_batch_size: int, lr: float = 0.1) -> None:
    """One update by Opacus's own optimizer step, as a step plug-in (:mod:`dpaudit.train.step`):
    ``GradSampleModule`` per-sample gradients of the mean per-example loss, then
    ``DPOptimizer(SGD).step()``, which clips each to ``max_grad_norm``, sums, adds
    N(0, noise_multiplier^2 max_grad_norm^2 I) drawn from ``generator`` and divides by
    ``expected_batch_size`` (Yousefpour et al. 2021, arXiv 2109.12298). Position ids are
    passed explicitly (the GPT-2 fix above)."""
    GradSampleModule, DPOptimizer = _import_opacus()
    params = [p for p in model.parameters() if p.requires_grad]
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=False)
    optimizer = DPOptimizer(torch.optim.SGD(params, lr=lr), noise_multiplier=noise_multiplier,
                            max_grad_norm=max_grad_norm, expected_batch_size=expected_batch_size,
                            loss_reduction="mean", generator=generator)
    try:
        rows = [unit[0] for unit in batch_units(batch)]
        collated = collate(rows, pad_id=0, device=next(model.parameters()).device)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            example_losses(forward_logits(model, collated), collated.labels).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    finally:
        gsm.remove_hooks()
