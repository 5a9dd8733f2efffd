"""Opacus as its users call it: ``PrivacyEngine.make_private`` in a step and a trainer plug-in.

``dpaudit.train.opacus`` drives Opacus's ``GradSampleModule`` and ``DPOptimizer`` from the
toolkit's own loop; this module instead calls ``opacus.PrivacyEngine().make_private(module=...,
optimizer=..., data_loader=..., noise_multiplier=..., max_grad_norm=..., poisson_sampling=True,
clipping=..., grad_sample_mode=...)`` as Opacus's documentation shows (Yousefpour et al.,
"Opacus: User-Friendly Differential Privacy Library in PyTorch", 2021, arXiv 2109.12298) and
then uses only the objects it returns, so that ``dpaudit validate`` audits Opacus's own code
path. Pick one on the command line::

    dpaudit validate --step dpaudit.adapters.opacus:step_ghost_flat --noise-multiplier 1 \\
        --max-grad-norm 1 --expected-batch-size 8 [--model-dir MY_MODEL | --arch llama]
    dpaudit validate --trainer dpaudit.adapters.opacus:train_hooks_flat --epsilon 4 --delta 1e-5

Plug-ins, one per ``grad_sample_mode`` x ``clipping`` that Opacus offers:
``step_MODE_CLIPPING`` (the contract of :mod:`dpaudit.train.step`) and ``train_MODE_CLIPPING``
(the contract of :mod:`dpaudit.plugins`), MODE in ``hooks``, ``ew``, ``functorch``, ``ghost``
and CLIPPING in ``flat``, ``per_layer``, ``adaptive``, except ``ghost_per_layer`` (Opacus's
ghost clipping is flat only). ``ghost_adaptive`` is Opacus's
``PrivacyEngineAdaptiveClipping`` (``opacus.utils.adaptive_clipping``), the one way Opacus offers
adaptive clipping with ghost clipping.

Which modes run which architectures in Opacus 1.6.0 (torch 2.13, transformers 5.24; found by
running them, ``tests/adapters/test_adapters_opacus.py``; the same in 1.5.3 and 1.5.4):

=============  ========================  ===================  ===================  ====================
mode           GPT-2 (``Conv1D``)        Llama (RMSNorm)      GPT-NeoX             OPT
=============  ========================  ===================  ===================  ====================
``hooks``      yes (``Conv1D`` by        yes                  yes                  no (1)
               functorch)
``ew``         no: ExpandedWeights has   no: ``mul`` in the   yes                  no (2)
               no ``addmm`` (``Conv1D``) RMSNorm
``functorch``  yes                       yes                  yes                  no (1)
``ghost``      yes, embeddings untied    yes                  yes                  no (1)
               here (3)
=============  ========================  ===================  ===================  ====================

(1) OPT's learned position embedding is called with an ``int`` argument, which Opacus's
forward hook cannot ``detach``; (2) ExpandedWeights sees OPT's position embedding called on a
batch of another size; (3) Opacus's ghost clipping refuses tied parameters ("Parameter tying
is not supported with Ghost Clipping"). Every clipping mode runs where its mode runs.

What users hit, and what these plug-ins do about it:

- **Tied embeddings and ghost clipping.** GPT-2 (and OPT, Gemma, ...) tie the output layer to
  the input embedding. The ghost plug-ins untie them before ``make_private``
  (:func:`untie_embeddings`: ``lm_head`` gets its own copy of the matrix and
  ``config.tie_word_embeddings`` becomes false), so the model that trains, and the one a
  trainer returns, has separate input and output embeddings. DP holds for the untied model,
  and anything computed from its parameters is post-processing. A step audit of a tied
  model then measures the input embedding's update only, not the output layer's.
- **Position ids.** GPT-2 builds position ids of shape (1, L) and broadcasts them over the
  batch; Opacus's embedding hook (and ghost clipping's embedding norm) then sees a batch of
  one. Every forward here passes explicit, contiguous (B, L) position ids
  (:func:`dpaudit.train.engine.collate`).
- **The loss and its reduction.** The criterion handed to ``make_private`` is
  :class:`SequenceLoss`: each sequence's mean next-token NLL over its own tokens (the
  toolkit's per-example loss), averaged over the batch (``loss_reduction="mean"``). Opacus
  multiplies the backpropagated gradient by the realised batch size to recover per-sample
  gradients and, after clipping and noise, divides by its expected batch size. A loss averaged
  over all tokens of a batch (a Hugging Face model's own ``loss``) would give each sequence a
  weight that depends on the others' lengths; so would Opacus's ghost-clipping wrapper before
  1.6 with ``criterion(..., shape=...)``, which averaged each sequence over the padded length.
- **The expected batch size.** ``make_private`` derives the Poisson rate from the data loader,
  q = 1 / len(data_loader), and the divisor from it, int(len(dataset) * q), which is not
  ``batch_size`` unless it divides the dataset's size. The trainer records the rate and divisor
  Opacus used. A step is handed a batch that is already sampled, so it passes a loader of B
  placeholder rows in batches of B (q = 1, divisor B, the claimed expected batch size) and
  never iterates the Poisson loader that comes back.
- **Poisson sampling.** ``poisson_sampling=True``: the trainer iterates the ``DPDataLoader``
  that ``make_private`` returns; an empty batch still gets its noise (a noise-only update,
  as DP-SGD must).
- **Opacus's accountant.** ``make_private`` attaches a PRV accountant to the optimizer; its
  epsilon is not used. The trainer records the toolkit's own
  :class:`~dpaudit.accounting.DpRecord` of what ran (Poisson rate, steps, sigma, delta,
  unit "example"), and epsilon is recomputed from it.
- **Randomness.** Noise comes from ``noise_generator``: the step's ``generator``; in the trainer
  the run's seeded noise generator (``train.dp.reproducible: true``) or
  :class:`~dpaudit.train.sampling.SecureGenerator`, which re-seeds torch's generator from
  the operating system at every step (Opacus's own ``secure_mode`` needs torchcsprng, which is
  archived). The Poisson sampler draws from the data loader's generator.
- **Per-layer clipping** clips each of the k parameter tensors to C / sqrt(k), so that the
  whole gradient's sensitivity is C (Opacus adds noise of std sigma * C).
- **Adaptive clipping** (Andrew et al. 2021, arXiv 1905.03871) starts at C and moves the bound
  towards the median norm after each step (:data:`ADAPTIVE`); its noisy count of unclipped
  gradients has std ``max(B / 20, sigma)`` (Opacus requires sigma < 2 x that std) and sigma
  is the combined noise multiplier the accountant sees. A step audit sees one step at the
  initial bound C. Opacus's adaptive optimizer fails on an empty batch
  (:meth:`Private.noise_only` works around it). Ghost adaptive clipping moves the bound before
  the step's own clipping, draws its count's noise from torch's global generator, refuses
  realised batches of at most 10 sigma, and **in Opacus 1.6.0 does not clip per example**:
  its loss wrapper calls the criterion with the criterion's own reduction ("mean"; 1.5.x set it
  to "none"), so the "per-sample" loss is the batch's mean and the whole batch's gradient is
  scaled by the mean clipping factor. The step validator finds it ``violated`` under 1.6.0
  and ``consistent`` under 1.5.3 (its tiny GPT-NeoX's ``spread`` canary, S = 1/3, 600 runs a
  side; ``benchmarks/bench_opacus_adapters.py``).

Only ``train.dp.unit: example`` (Opacus clips per example). The trainer trains in float32,
one physical batch per step (``train.microbatch_size`` is not used).

Faulty variants for the audits' tests live in ``tests/adapters/opacus_faults.py``: they take a
plug-in of :func:`make_step` (or :func:`make_trainer`) and change one object after
``make_private`` (``tamper``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit import accounting
from dpaudit.config import Config, load_config, validate
from dpaudit.devices import resolve_device
from dpaudit.errors import InputError
from dpaudit.train import checks
from dpaudit.train.engine import Batch, collate, example_losses
from dpaudit.train.evaluate import evaluate
from dpaudit.train.plan import (
    RELEASE_WARNING,
    dp_record,
    make_optimizer,
    make_scheduler,
    noise_mode,
    num_steps,
    plan_privacy,
)
from dpaudit.train.record import TrainingRecord
from dpaudit.train.sampling import RunSeeds, SecureGenerator, os_seed
from dpaudit.train.step import STEP_LR, batch_units
from dpaudit.train.units import load_data, prepare_sequences

MODES = ("hooks", "ew", "functorch", "ghost")
CLIPPINGS = ("flat", "per_layer", "adaptive")
MIN_OPACUS = (1, 5, 3)  # make_private returns ghost clipping's loss wrapper from 1.5.3 on
#: The architectures each mode runs in Opacus 1.6.0 (the table above), every clipping mode alike.
SUPPORT = {"hooks": ("gpt2", "llama", "gpt_neox"), "ew": ("gpt_neox",), "functorch": ("gpt2", "llama", "gpt_neox"),
           "ghost": ("gpt2", "llama", "gpt_neox")}
#: Adaptive clipping's settings: the target quantile of unclipped norms and the bound's
#: geometric learning rate (Andrew et al. 2021's defaults), its range as multiples of C.
ADAPTIVE = {"target_unclipped_quantile": 0.5, "clipbound_learning_rate": 0.2, "min_clipbound": 0.1,
            "max_clipbound": 10.0}
_OPACUS_ATTRS = ("grad_sample", "_forward_counter", "_current_grad_sample", "_norm_sample", "summed_grad")
_MODULE_ATTRS = ("activations", "max_batch_len")
_QUIET = ("Secure RNG turned off", "Full backward hook is firing", "Optimal order is the largest alpha",
          "PrivacyEngine detected new dataset", "Using a non-full backward hook",
          "In CPU autocast")

__all__ = ["ADAPTIVE", "CLIPPINGS", "MODES", "PLUG_INS", "SUPPORT", "Private", "SequenceLoss", "make_private",
           "make_step", "make_trainer", "untie_embeddings"]


def check_mode(mode: str, clipping: str) -> None:
    """An InputError unless Opacus offers ``grad_sample_mode=mode`` with ``clipping``."""
    if mode not in MODES:
        raise InputError(f"grad_sample_mode must be one of {', '.join(MODES)}, got {mode!r}")
    if clipping not in CLIPPINGS:
        raise InputError(f"clipping must be one of {', '.join(CLIPPINGS)}, got {clipping!r}")
    if mode == "ghost" and clipping == "per_layer":
        raise InputError("Opacus's ghost clipping is flat only: no per_layer clipping")


def import_opacus():
    """The ``opacus`` package, at least :data:`MIN_OPACUS`, or an InputError that says why not."""
    try:
        import opacus
    except ImportError:
        raise InputError("the Opacus adapters need the optional extra: pip install 'dpaudit[opacus]'") from None
    found = tuple(int(x) for x in re.findall(r"\d+", opacus.__version__)[:3])
    if found < MIN_OPACUS:
        raise InputError(f"the Opacus adapters need Opacus >= {'.'.join(map(str, MIN_OPACUS))} (make_private returns "
                         f"ghost clipping's loss from 1.5.3 on), found {opacus.__version__}")
    return opacus


def untie_embeddings(model: nn.Module) -> bool:
    """Give the output layer its own copy of a tied input embedding (Opacus's ghost clipping
    refuses tied parameters); ``config.tie_word_embeddings`` becomes false so that a saved and
    reloaded model stays untied. Returns whether the model was tied."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if outputs is None or outputs.weight is not inputs.weight:
        return False
    outputs.weight = nn.Parameter(inputs.weight.detach().clone(), requires_grad=inputs.weight.requires_grad)
    model.config.tie_word_embeddings = False
    return True


class SequenceLoss(nn.Module):
    """The criterion handed to ``make_private``: ``loss(logits (b, L, V), labels (b, L))``, each
    sequence's mean next-token NLL over its own tokens (labels -100 are padding;
    :func:`dpaudit.train.engine.example_losses`), averaged over the batch, or one loss per
    sequence when ``reduction`` is ``"none"`` (which ghost clipping's wrapper sets)."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses = example_losses(logits, labels)
        return losses if self.reduction == "none" else losses.mean()


@dataclass
class Private:
    """What ``make_private`` returned for ``model`` (the user's model, which the wrapped
    ``module`` shares its parameters with), and how to use and undo it."""

    model: nn.Module
    module: nn.Module
    optimizer: Any  # opacus.optimizers.DPOptimizer
    criterion: Callable[..., Any]
    data_loader: DataLoader
    mode: str
    clipping: str

    def loss(self, batch: Batch):
        """The batch's loss through the wrapped module, ready for ``.backward()`` (under ghost
        clipping Opacus's wrapper, whose ``backward`` runs both passes). ``input_ids`` goes
        first and positionally: ExpandedWeights reads the batch size from the first argument."""
        logits = self.module(batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                             use_cache=False).logits
        return self.criterion(logits, batch.labels)

    def step(self, batch: Batch | None) -> float | None:
        """One optimizer step on ``batch`` (:meth:`loss`, ``backward``, ``optimizer.step()``,
        ``zero_grad``), or on an empty batch (None: :meth:`noise_only`); returns the loss. An
        architecture the mode cannot run is an InputError that says so."""
        loss = None
        try:
            with _quiet():
                if batch is None:
                    self.noise_only()
                else:
                    out = self.loss(batch)
                    loss = float(getattr(out, "loss_per_sample", out).detach().mean())  # ghost: Opacus's wrapper
                    out.backward()
                self.optimizer.step()
        except torch.cuda.OutOfMemoryError:
            raise
        except (RuntimeError, AttributeError, NotImplementedError) as err:
            raise InputError(f"Opacus's grad_sample_mode={self.mode!r} failed on {type(self.model).__name__} "
                             f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); the "
                             "architectures each mode runs: dpaudit.adapters.opacus") from err
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def noise_only(self) -> None:
        """Leave a zero clipped sum for the optimizer's next ``step`` (an empty Poisson batch:
        the update is noise alone). Opacus's adaptive-clipping optimizer has no branch for an
        empty batch (it fails to reshape zero per-sample gradients), so it gets one per-sample
        gradient of zeros, which its count of unclipped gradients sees as one example."""
        rows = 1 if self.clipping == "adaptive" else 0
        for p in self.optimizer.params:
            if self.mode == "ghost":
                p.grad = torch.zeros_like(p)
            else:
                p.grad_sample = torch.zeros((rows, *p.shape), dtype=p.dtype, device=p.device)

    def close(self) -> None:
        """Undo what ``make_private`` did to ``model``: its hooks and the attributes Opacus
        set on the parameters and modules."""
        remove = getattr(self.module, "remove_hooks", None)
        if remove is not None:
            remove()
        for p in self.model.parameters():
            for attr in _OPACUS_ATTRS:
                if hasattr(p, attr):
                    delattr(p, attr)
        for m in self.model.modules():
            for attr in _MODULE_ATTRS:
                m.__dict__.pop(attr, None)


@contextlib.contextmanager
def _quiet():
    """Opacus's warnings that say nothing to a user of these plug-ins: secure RNG off (the noise
    generator is chosen here), hooks on the token-id input, functorch's autocast on the CPU."""
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=f".*{message}")
        yield


def make_private(model: nn.Module, *, optimizer: torch.optim.Optimizer, data_loader: DataLoader, mode: str,
                 clipping: str, noise_multiplier: float, max_grad_norm: float,
                 noise_generator: torch.Generator | None = None) -> Private:
    """``PrivacyEngine().make_private`` of ``model``, ``optimizer`` and ``data_loader`` with
    ``poisson_sampling=True``, ``loss_reduction="mean"``, ``grad_sample_mode=mode``,
    ``clipping`` (per-layer: C / sqrt(k) for each of the optimizer's k tensors; adaptive:
    :data:`ADAPTIVE`) and :class:`SequenceLoss`. Untie a tied model first
    (:func:`untie_embeddings`) for ghost clipping, before building ``optimizer``."""
    check_mode(mode, clipping)
    opacus, requested = import_opacus(), clipping
    engine_class = opacus.PrivacyEngine
    params = [p for group in optimizer.param_groups for p in group["params"]]
    options: dict[str, Any] = {}
    bound: float | list[float] = float(max_grad_norm)
    if clipping == "per_layer":
        bound = [max_grad_norm / math.sqrt(len(params))] * len(params)
    elif clipping == "adaptive":
        options = {**ADAPTIVE, "min_clipbound": ADAPTIVE["min_clipbound"] * max_grad_norm,
                   "max_clipbound": ADAPTIVE["max_clipbound"] * max_grad_norm}
        if mode == "ghost":
            from opacus.utils.adaptive_clipping import PrivacyEngineAdaptiveClipping

            engine_class, clipping = PrivacyEngineAdaptiveClipping, "flat"
        else:
            expected = len(data_loader.dataset) / len(data_loader)
            options["unclipped_num_std"] = max(expected / 20.0, float(noise_multiplier))
    criterion = SequenceLoss(reduction="mean")
    with _quiet():
        out = engine_class().make_private(
            module=model, optimizer=optimizer, data_loader=data_loader, noise_multiplier=noise_multiplier,
            max_grad_norm=bound, poisson_sampling=True, clipping=clipping, grad_sample_mode=mode,
            loss_reduction="mean", noise_generator=noise_generator,
            **({"criterion": criterion} if mode == "ghost" else {}), **options)
    if mode == "ghost":
        module, dp_optimizer, criterion, loader = out
    else:
        module, dp_optimizer, loader = out
    return Private(model=model, module=module, optimizer=dp_optimizer, criterion=criterion, data_loader=loader,
                   mode=mode, clipping=requested)


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


# --------------------------------------------------------------------------- the step


def make_step(mode: str, clipping: str, *, lr: float = STEP_LR,
              tamper: Callable[[Private], None] | None = None, name: str | None = None) -> Callable[..., None]:
    """A step plug-in ``step(model, batch, *, generator, noise_multiplier, max_grad_norm,
    expected_batch_size)`` (:mod:`dpaudit.train.step`): ``make_private`` of ``model``, plain
    SGD at ``lr`` and a loader of ``expected_batch_size`` placeholder rows (so that Opacus
    divides by the claimed B), noise from ``generator``; one forward, ``backward`` and
    ``optimizer.step()`` on the batch; then the hooks are removed. ``tamper``, for tests of
    the audit, changes the objects ``make_private`` returned before the step."""
    check_mode(mode, clipping)

    def step(model: nn.Module, batch, *, generator: torch.Generator, noise_multiplier: float,
             max_grad_norm: float, expected_batch_size: int) -> None:
        if mode == "ghost":
            untie_embeddings(model)
        device = next(model.parameters()).device
        b = int(expected_batch_size)
        placeholders = DataLoader(TensorDataset(torch.arange(b)), batch_size=b)
        private = make_private(model, optimizer=torch.optim.SGD(_trainable(model), lr=lr), data_loader=placeholders,
                               mode=mode, clipping=clipping, noise_multiplier=noise_multiplier,
                               max_grad_norm=max_grad_norm, noise_generator=generator)
        try:
            if tamper is not None:
                tamper(private)
            rows = collate([unit[0] for unit in batch_units(batch)], pad_id=0, device=device)
            private.step(rows)
        finally:
            private.close()

    step.__name__ = step.__qualname__ = name or f"step_{mode}_{clipping}"
    step.__doc__ = (f"One DP-SGD update by Opacus's make_private(grad_sample_mode={mode!r}, clipping={clipping!r}, "
                    f"poisson_sampling=True), then SGD at lr {lr} (dpaudit.adapters.opacus).")
    return step


# --------------------------------------------------------------------------- the trainer


class _Rows(torch.utils.data.Dataset):
    """The training sequences, one 1-D token tensor a row."""

    def __init__(self, sequences: list[torch.Tensor]):
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.sequences[index]


def _collate_rows(pad_id: int):
    def collate_rows(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = collate(rows, pad_id=pad_id)
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "labels": batch.labels,
                "position_ids": batch.position_ids}

    return collate_rows


def _as_batch(rows, device: torch.device) -> Batch | None:
    """The Poisson loader's batch on ``device``; None for an empty one (Opacus's empty batch is
    a dict of zero-row tensors from 1.6 on, a list before)."""
    if not isinstance(rows, dict) or rows["input_ids"].shape[0] == 0:
        return None
    return Batch(rows["input_ids"], rows["attention_mask"], rows["labels"], rows["position_ids"]).to(device)


def make_trainer(mode: str, clipping: str, *, tamper: Callable[[Private], None] | None = None,
                 name: str | None = None) -> Callable[..., Any]:
    """A trainer plug-in ``train(dataset, tokenizer, *, seed, config=None, record=None,
    eval_dataset=None)`` (:mod:`dpaudit.plugins`): a plain PyTorch loop over what
    ``make_private`` returns. ``config=None`` is the ``tiny`` preset at noise multiplier 1.
    ``tamper``, for tests of the audits (as :func:`make_step`'s), changes the objects
    ``make_private`` returned before the first step; ``name``, its ``MODULE:FUNCTION``, is what
    the DP record names as the trainer (default ``dpaudit.adapters.opacus:train_MODE_CLIPPING``)."""
    check_mode(mode, clipping)
    spec = name or f"dpaudit.adapters.opacus:train_{mode}_{clipping}"
    if ":" not in spec:
        raise InputError(f"name must be MODULE:FUNCTION, got {spec!r}")

    def train(dataset, tokenizer, *, seed: int, config: Config | None = None, record: TrainingRecord | None = None,
              eval_dataset=None):
        return _train(dataset, tokenizer, seed=seed, config=config, record=record, eval_dataset=eval_dataset,
                      mode=mode, clipping=clipping, spec=spec, tamper=tamper)

    train.__name__ = train.__qualname__ = spec.rpartition(":")[2]
    train.__doc__ = (f"DP-SGD by Opacus's make_private(grad_sample_mode={mode!r}, clipping={clipping!r}, "
                     "poisson_sampling=True) in a plain PyTorch loop (dpaudit.adapters.opacus); records the "
                     "toolkit's DpRecord of what ran.")
    train.claims_dp = True
    return train


def _train(dataset, tokenizer, *, seed: int, config: Config | None, record: TrainingRecord | None, eval_dataset,
           mode: str, clipping: str, spec: str, tamper: Callable[[Private], None] | None = None):
    """The trainer of :func:`make_trainer`: data, a data loader of batches of ``train.batch_size``
    rows, a model (:func:`dpaudit.models.make_model`), its optimizer, ``make_private``, the loop."""
    from dpaudit.models import make_model

    import_opacus()
    config = config if config is not None else load_config(
        "tiny", overrides=[f"train.trainer={spec}", "train.dp.noise_multiplier=1.0"])
    if not isinstance(config, Config):
        raise InputError(f"config must be a dpaudit Config, got {type(config).__name__}")
    validate(config)
    train, dp = config.train, config.train.dp
    if dp.unit != "example":
        raise InputError(f"trainer {spec} does not support train.dp.unit={dp.unit}: Opacus clips per example")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise InputError("the tokenizer has neither a pad token nor an eos token")
    data = load_data(dataset, unit="example", max_length=config.data.max_length, pad_id=pad_id)
    steps = num_steps(train, data.num_units)
    # the checks and delta of train.dp; a target epsilon is calibrated below, at make_private's rate
    target = dp.target_epsilon is not None and dp.noise_multiplier is None
    plan = plan_privacy(dataclasses.replace(dp, noise_multiplier=1.0, target_epsilon=None) if target else dp,
                        batch_size=train.batch_size, num_units=data.num_units, steps=steps)
    seeds, secure = RunSeeds.from_seed(seed), not dp.reproducible
    device = resolve_device(train.device, what="train.device")
    sampler_seed = os_seed() if secure else int(seeds.sampler.generate_state(1, "uint64")[0] >> 1)
    loader = DataLoader(_Rows(data.sequences), batch_size=train.batch_size, collate_fn=_collate_rows(pad_id),
                        generator=torch.Generator().manual_seed(sampler_seed))
    q = 1.0 / len(loader)  # make_private's Poisson rate
    sigma = plan.noise_multiplier if not target else accounting.noise_multiplier(
        target_epsilon=dp.target_epsilon, sample_rate=q, steps=steps, delta=plan.delta, method=dp.accountant)
    evaluation = _evaluation(data.sequences, eval_dataset, config=config, pad_id=pad_id, device=device)
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seeds.torch)
        model = make_model(config.model, tokenizer, seed=seeds.model).to(device)
        model.train()
        if mode == "ghost":
            untie_embeddings(model)
        params = _trainable(model)
        before = checks.snapshot(dict(enumerate(params)))
        noise = SecureGenerator(device) if secure else seeds.noise_generator(device)
        private = make_private(model, optimizer=make_optimizer(params, train), data_loader=loader, mode=mode,
                               clipping=clipping, noise_multiplier=sigma, max_grad_norm=dp.max_grad_norm,
                               noise_generator=noise)
        try:
            if tamper is not None:
                tamper(private)
            log, sizes, nonfinite = _loop(private, train=train, steps=steps, noise=noise if secure else None,
                                          evaluation=evaluation, device=device)
        finally:
            private.close()
    if record is not None:
        record.log.extend(log)
        summary = checks.summarize(
            batch_sizes=checks.batch_size_check(sizes, num_units=data.num_units, sample_rate=q),
            moved=checks.parameters_moved(before, dict(enumerate(params))), nonfinite=nonfinite, sampler="poisson")
        summary["seeds"] = {**seeds.to_dict(), "noise": None} if secure else seeds.to_dict()
        summary["noise"] = noise_mode(True, dp)
        record.checks = summary
        ran = dataclasses.replace(plan, noise_multiplier=float(sigma), sample_rate=q, target_epsilon=dp.target_epsilon,
                                  expected_batch_size=int(private.optimizer.expected_batch_size))
        record.dp = dp_record(trainer=spec, sampler="poisson", plan=ran, num_units=data.num_units, steps=steps,
                              batch_size=ran.expected_batch_size, noise=noise_mode(True, dp))
    if dp.reproducible:
        model.config.dpaudit_warning = RELEASE_WARNING
    return model


def _evaluation(sequences, eval_dataset, *, config: Config, pad_id: int, device: torch.device):
    """``evaluation(model)``: the token-weighted loss and perplexity of the first training rows
    and of the held-out rows, as the toolkit's loop logs them."""
    train = config.train
    held_out = []
    if eval_dataset is not None and len(eval_dataset) > 0:
        held_out = prepare_sequences(eval_dataset.select(range(min(len(eval_dataset), train.max_eval_examples))),
                                     max_length=config.data.max_length, pad_id=pad_id, what="evaluation dataset")
    parts = (("train_eval_loss", "train_perplexity", sequences[: train.max_eval_examples]),
             ("heldout_loss", "heldout_perplexity", held_out))

    def evaluation(model) -> dict[str, float | None]:
        out = {}
        for loss_key, ppl_key, rows in parts:
            if rows:
                loss, ppl = evaluate(model, rows, batch_size=train.microbatch_size, pad_id=pad_id, device=device)
                out[loss_key], out[ppl_key] = (loss, ppl) if math.isfinite(loss) else (None, None)
        return out

    return evaluation


def _loop(private: Private, *, train, steps: int, noise: SecureGenerator | None, evaluation,
          device: torch.device) -> tuple[list[dict[str, Any]], list[int], dict[str, int]]:
    """``steps`` steps over the Poisson loader ``make_private`` returned (its epochs one after
    another), each :meth:`Private.step` (noise alone for an empty batch), the learning rate
    following ``train``'s schedule. Returns the log, the realised
    batch sizes and the non-finite counts. ``noise``: a secure generator to move on each step."""
    scheduler = make_scheduler(private.optimizer, train, steps)
    params = list(private.optimizer.params)
    log = [{"step": 0, **evaluation(private.model), "elapsed_s": 0.0}]
    sizes, nonfinite, started = [], {"updates": 0, "unit_gradients": 0, "losses": 0}, time.perf_counter()
    batches = iter(private.data_loader)
    for step in range(1, steps + 1):
        rows = next(batches, None)
        if rows is None:  # the loader's next epoch
            batches = iter(private.data_loader)
            rows = next(batches)
        batch, lr = _as_batch(rows, device), scheduler.get_last_lr()[0]
        if noise is not None:
            noise.next_step()
        loss = private.step(batch)
        if loss is not None and not math.isfinite(loss):
            raise InputError(f"training diverged: the loss is NaN or infinite at step {step} of {steps}; "
                             "lower train.lr or check the data")
        scheduler.step()
        nonfinite["updates"] += not all(bool(p.isfinite().all()) for p in params)
        sizes.append(0 if batch is None else len(batch))
        row = {"step": step, "train_loss": loss, "lr": lr, "batch_size": sizes[-1], "examples": sizes[-1]}
        if step % train.eval_every == 0 or step == steps:
            row.update(evaluation(private.model))
        log.append({**row, "elapsed_s": round(time.perf_counter() - started, 3)})
    return log, sizes, nonfinite


# --------------------------------------------------------------------------- the plug-ins

step_hooks_flat = make_step("hooks", "flat")
step_hooks_per_layer = make_step("hooks", "per_layer")
step_hooks_adaptive = make_step("hooks", "adaptive")
step_ew_flat = make_step("ew", "flat")
step_ew_per_layer = make_step("ew", "per_layer")
step_ew_adaptive = make_step("ew", "adaptive")
step_functorch_flat = make_step("functorch", "flat")
step_functorch_per_layer = make_step("functorch", "per_layer")
step_functorch_adaptive = make_step("functorch", "adaptive")
step_ghost_flat = make_step("ghost", "flat")
step_ghost_adaptive = make_step("ghost", "adaptive")

train_hooks_flat = make_trainer("hooks", "flat")
train_hooks_per_layer = make_trainer("hooks", "per_layer")
train_hooks_adaptive = make_trainer("hooks", "adaptive")
train_ew_flat = make_trainer("ew", "flat")
train_ew_per_layer = make_trainer("ew", "per_layer")
train_ew_adaptive = make_trainer("ew", "adaptive")
train_functorch_flat = make_trainer("functorch", "flat")
train_functorch_per_layer = make_trainer("functorch", "per_layer")
train_functorch_adaptive = make_trainer("functorch", "adaptive")
train_ghost_flat = make_trainer("ghost", "flat")
train_ghost_adaptive = make_trainer("ghost", "adaptive")

#: ``(mode, clipping)`` of every plug-in pair above.
PLUG_INS = tuple((m, c) for m in MODES for c in CLIPPINGS if not (m == "ghost" and c == "per_layer"))
