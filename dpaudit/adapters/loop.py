"""A user's own training loop, audited as it is: taps on its data loader and its optimizer.

:class:`dpaudit.Audit` (:mod:`dpaudit.wrap`) is the face; this module holds what it puts
into the loop and what it makes of what it saw, as objects (the run directory is written by
:mod:`dpaudit.stages.wrapped`).

- :class:`LoaderTap` wraps the loop's data loader. Each batch it yields is the loader's
  batch plus rows of the audit's input-space canaries: each canary drawn in (probability
  1/2, the one-run design of Steinke, Nasr, Jagielski 2023, arXiv 2305.08846) joins each
  batch independently with the loader's Poisson rate q, as one more protected unit would. It
  records the size of every batch trained on (the loader's rows plus the canaries') for the
  sampler check against Binomial(N + members, q) (:func:`dpaudit.train.checks.batch_size_check`)
  and keeps a uniform sample of the rows trained on (the member records the attacks score). A
  batch counts, with its canary draws and its rows, at the optimizer step that follows it: one
  drawn after the last step (a loop stopped mid-epoch, or the batch accelerate's
  ``DataLoaderShard`` collates ahead of the one it yields) was never trained on.
- :meth:`LoopObserver.wrap_optimizer` taps an Opacus ``DPOptimizer`` (Yousefpour et al. 2021,
  arXiv 2109.12298) in place: after its own ``add_noise`` (one release of DP-SGD), the tap
  counts the step, measures the noise the optimizer added (``p.grad - p.summed_grad``), and
  runs the white-box gradient canaries (:class:`~dpaudit.train.gradient_canaries.GradientCanaries`:
  Dirac gradients of norm C on coordinates of their own, Poisson-included at q, through the
  same ``add_noise`` of Opacus; Steinke et al. 2023, Sect. 6; Andrew et al. 2024, arXiv
  2302.03098), as :class:`dpaudit.train.opacus.OpacusEngine` does in the toolkit's loop. A
  plain torch optimizer is counted through its step hook; it adds no noise, and the checks
  say so.
- :meth:`LoopObserver.training_record` turns what was seen into the
  :class:`~dpaudit.train.TrainingRecord` a trainer plug-in would fill: the DP record of the
  claim (:func:`claimed_record`), the sampler, step and noise checks, the gradient canaries
  and the log.

The DP record is the claimed mechanism: T steps of the Poisson-subsampled Gaussian at the
loader's rate q, with the least noise multiplier that meets the claimed (epsilon, delta)
(:func:`dpaudit.accounting.noise_multiplier`). T is the claim's ``steps`` when it names them,
else the optimizer's noisy steps. The checks then hold the loop to it: batch sizes
Binomial(N, q) (a shuffling loader fails the variance test), as many loader batches as noisy
steps, the optimizer's noise multiplier at least the claim's (its accountant epsilon within
:data:`EPSILON_RTOL` of the claim), and the noise measured in its updates that of its noise
multiplier. :func:`dpaudit.audit.assess` makes a run whose checks fail, or whose record's T
is not the T its loader ran, ``violated``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpaudit import accounting
from dpaudit.accounting import DpRecord
from dpaudit.errors import InputError
from dpaudit.seeds import generator
from dpaudit.train import checks
from dpaudit.train.evaluate import evaluate
from dpaudit.train.gradient_canaries import GradientCanaries
from dpaudit.train.record import TrainingRecord

__all__ = ["EPSILON_RTOL", "USER_LOOP", "LoaderTap", "LoopClaim", "LoopObserver", "append_rows", "claimed_record",
           "user_loop"]

#: The trainer a wrapped run names in its config: a loop the toolkit cannot rerun.
USER_LOOP = "dpaudit.adapters.loop:user_loop"
#: The optimizer's noise passes when its accountant epsilon is at most the claim's times 1 + this: the
#: accountants (Opacus's PRV, dp_accounting's PLD and RDP) disagree by about this much.
EPSILON_RTOL = 0.01
#: The batch keys a canary row is added to, and the value that pads each (None: see append_rows).
BATCH_KEYS = {"input_ids": None, "attention_mask": 0, "labels": -100, "position_ids": None, "token_type_ids": 0}
WARNING = ("trained with dpaudit.Audit's canaries (input rows and gradient canaries): an audit model, whose "
           "training carried canaries to measure its privacy; not fit for release")
MAX_EVAL_ROWS = 256  # member and held-out rows each, for the loss before and after training


def user_loop(dataset, tokenizer, *, seed):
    """The trainer named in a wrapped run's config: the user's own loop, which only the user
    can run again (``reruns = False``: no twin, no fleet, no multi-run audit of it)."""
    raise InputError("this model was trained by the user's own loop (dpaudit.Audit): the toolkit cannot rerun it; "
                     "run your loop again with a new dpaudit.Audit")


user_loop.reruns = False


# --------------------------------------------------------------------------- the claim


@dataclass(frozen=True)
class LoopClaim:
    """What the user claims of their loop: (``epsilon``, ``delta``) for each ``unit``
    (``"example"``: a row of the loader), and optionally the ``steps`` and the Poisson
    ``sample_rate`` their accounting assumed, and its ``accountant`` (``pld`` or ``rdp``)."""

    epsilon: float
    delta: float
    unit: str = "example"
    steps: int | None = None
    sample_rate: float | None = None
    accountant: str = "pld"

    @classmethod
    def parse(cls, claim: Any) -> LoopClaim:
        """A claim from a mapping such as ``dict(epsilon=4, delta=1e-5, unit="example")``; an
        :class:`InputError` names what is missing or wrong."""
        if isinstance(claim, LoopClaim):
            return claim
        if not isinstance(claim, Mapping):
            raise InputError(f"claim must be a mapping such as dict(epsilon=4, delta=1e-5, unit='example'), got "
                             f"{type(claim).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(claim) - set(names))
        if unknown:
            raise InputError(f"claim: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(names)})")
        missing = [k for k in ("epsilon", "delta") if claim.get(k) is None]
        if missing:
            raise InputError(f"claim needs {' and '.join(missing)}: an epsilon holds only at a delta, e.g. "
                             "dict(epsilon=4, delta=1e-5, unit='example')")
        epsilon, delta = claim["epsilon"], claim["delta"]
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < math.inf:
            raise InputError(f"claim: epsilon must be a positive number, got {epsilon!r}")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise InputError(f"claim: delta must be in (0, 1), got {delta!r}")
        unit = claim.get("unit", "example")
        if unit != "example":
            raise InputError(f"claim: unit {unit!r} is not what a wrapped loop protects: each row of its loader is "
                             "one unit (unit='example'); per-user DP needs a trainer plug-in")
        steps = claim.get("steps")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1):
            raise InputError(f"claim: steps must be a positive integer, got {steps!r}")
        q = claim.get("sample_rate")
        if q is not None and (isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1):
            raise InputError(f"claim: sample_rate must be in (0, 1], got {q!r}")
        method = claim.get("accountant", "pld")
        accounting.events.check_method(method)
        return cls(epsilon=float(epsilon), delta=float(delta), unit=unit, steps=None if steps is None else int(steps),
                   sample_rate=None if q is None else float(q), accountant=method)


def claimed_record(claim: LoopClaim, *, sample_rate: float, steps: int, num_units: int, max_grad_norm: float | None,
                   expected_batch_size: int, trainer: str, warning: str | None = WARNING) -> DpRecord:
    """The DP record of the claim: ``steps`` of DP-SGD at Poisson rate ``sample_rate`` with the
    least noise multiplier whose accountant epsilon at the claim's delta is at most its epsilon
    (Abadi et al. 2016, arXiv 1607.00133)."""
    sigma = accounting.noise_multiplier(target_epsilon=claim.epsilon, sample_rate=sample_rate, steps=steps,
                                        delta=claim.delta, method=claim.accountant)
    return DpRecord.dpsgd(trainer=trainer, noise_multiplier=sigma, sample_rate=sample_rate, steps=steps,
                          delta=claim.delta, max_grad_norm=max_grad_norm, unit=claim.unit, num_units=num_units,
                          expected_batch_size=expected_batch_size, accountant=claim.accountant,
                          target_epsilon=claim.epsilon, warning=warning)


# --------------------------------------------------------------------------- batches


def append_rows(batch: Mapping[str, Any], rows: Sequence[torch.Tensor], *, pad_id: int):
    """``batch`` (a mapping of [B, L] tensors: ``input_ids``, ``attention_mask`` and any of
    ``labels``, ``position_ids``, ``token_type_ids``) with ``rows`` (1-D token tensors) appended,
    right-padded to the longest row: ``pad_id`` in ``input_ids``, 0 in the mask and token types,
    -100 in the labels (a row's labels are its tokens), positions counting on. Returns a dict (or
    the batch's own mapping type)."""
    if not rows:
        return batch
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise InputError(f"the audit adds its canaries to batches that are mappings with input_ids (as a Hugging Face "
                         f"collator makes), got {type(batch).__name__}")
    unknown = sorted(set(batch) - set(BATCH_KEYS))
    if unknown:
        raise InputError(f"the audit adds canary rows to batches of {', '.join(BATCH_KEYS)}; this batch also has "
                         f"{', '.join(map(str, unknown))}")
    if "attention_mask" not in batch:
        raise InputError("the audit's canary rows are padded, so the batches need an attention_mask")
    ids = batch["input_ids"]
    size = int(ids.shape[0]) if torch.is_tensor(ids) and ids.dim() >= 1 else -1
    for key, value in batch.items():
        if not torch.is_tensor(value) or (size > 0 and (value.dim() != 2 or value.shape[0] != size)):
            raise InputError(f"batch[{key!r}] must be a tensor of shape [batch, length], got "
                             f"{tuple(value.shape) if torch.is_tensor(value) else type(value).__name__}")
    length = int(ids.shape[1]) if size > 0 else 0
    width = max(length, *(int(r.numel()) for r in rows))
    out = {}
    for key, value in batch.items():
        fill = pad_id if key == "input_ids" else BATCH_KEYS[key]
        new = torch.full((max(size, 0) + len(rows), width), 0 if fill is None else fill, dtype=value.dtype,
                         device=value.device)
        if size > 0:
            new[:size, :length] = value
        if key == "position_ids":
            new[:size, length:] = torch.arange(length, width, dtype=value.dtype, device=value.device)
            new[max(size, 0):] = torch.arange(width, dtype=value.dtype, device=value.device)
        for i, row in enumerate(rows):
            n = int(row.numel())
            if key in ("input_ids", "labels"):
                new[max(size, 0) + i, :n] = row.to(value.device, value.dtype)
            elif key == "attention_mask":
                new[max(size, 0) + i, :n] = 1
        out[key] = new
    return out if isinstance(batch, dict) else type(batch)(out)


def _rows_of(batch: Mapping[str, Any]) -> tuple[int, list[np.ndarray]]:
    """The number of rows of a batch and each row's tokens (its attention mask's), on the CPU."""
    ids = batch["input_ids"]
    if ids.dim() < 2 or ids.shape[0] == 0:
        return 0, []
    ids = ids.detach().cpu()
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.detach().cpu().bool()
    return int(ids.shape[0]), [row[m].numpy() for row, m in zip(ids, mask)]


# --------------------------------------------------------------------------- the taps


class LoaderTap:
    """The user's data loader, with the audit's canary rows in its batches (see the module
    docstring). Everything else (``len``, ``dataset``, ``batch_sampler``, ...) is the loader's."""

    def __init__(self, loader, observer: LoopObserver):
        self._loader = loader
        self._observer = observer

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield self._observer.on_batch(batch)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_loader", "_observer"):
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        return f"LoaderTap({self._loader!r})"


def loader_units(loader) -> int:
    """N, the rows of the loader's data set (an :class:`InputError` when it has no length)."""
    try:
        n = len(loader.dataset)
    except (AttributeError, TypeError):
        raise InputError(f"the audit needs the number of records N: {type(loader).__name__} has no dataset with a "
                         "length (an IterableDataset cannot be Poisson-sampled)") from None
    if n < 1:
        raise InputError("the loader's dataset is empty")
    return int(n)


def loader_sample_rate(loader, num_units: int) -> float | None:
    """The loader's Poisson rate q: Opacus's ``DPDataLoader.sample_rate`` (or its batch
    sampler's), else ``batch_size / N`` for a loader of fixed batches (whose batch sizes the
    sampler check then refuses); None when the loader says neither."""
    for obj in (loader, getattr(loader, "batch_sampler", None)):
        q = getattr(obj, "sample_rate", None)
        if isinstance(q, (int, float)) and not isinstance(q, bool) and 0 < q <= 1:
            return float(q)
    for obj in (loader, getattr(loader, "batch_sampler", None)):
        batch = getattr(obj, "batch_size", None)
        if isinstance(batch, int) and batch > 0:
            return min(1.0, batch / num_units)
    return None


def sampler_name(loader) -> str:
    """What the loader samples with, in words: ``poisson`` for Opacus's uniform sampler."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if type(batch_sampler).__name__ == "UniformWithReplacementSampler":
        return "poisson"
    sampler = getattr(loader, "sampler", None)
    inner = f"({type(sampler).__name__})" if sampler is not None else ""
    return f"{type(batch_sampler).__name__}{inner}" if batch_sampler is not None else type(loader).__name__


def _dp_optimizer_classes() -> tuple[type, ...]:
    try:
        from opacus.optimizers import DPOptimizer
        from opacus.optimizers.adaclipoptimizer import AdaClipDPOptimizer
    except ImportError:
        return (), ()
    return (DPOptimizer,), (AdaClipDPOptimizer,)


class LoopObserver:
    """What the taps saw of one training loop (see the module docstring).

    ``canary_rows``: the token rows of the input canaries drawn in; ``gradient_canaries``: M
    (0: none); ``seeds``: a :class:`~dpaudit.train.sampling.RunSeeds` (the canaries' draws and
    noise, each a stream of its own); ``members``: how many of the rows seen to keep, a uniform
    sample, for the attacks."""

    def __init__(self, *, claim: LoopClaim, canary_rows: Sequence[torch.Tensor], gradient_canaries: int, seeds,
                 pad_id: int, members: int):
        self.claim = claim
        self.canary_rows = list(canary_rows)
        self.num_gradient_canaries = int(gradient_canaries)
        self.seeds = seeds
        self.pad_id = int(pad_id)
        self._draws = seeds.numpy_generator()  # the canary rows' Poisson draws: the run's sampling stream
        self._reservoir_rng = generator(seeds.seed, 5)  # a child of the seed that RunSeeds leaves unused
        self.loader = None
        self.optimizer = None
        self.num_units: int | None = None
        self.sample_rate: float | None = claim.sample_rate
        self.sampler = "unknown"
        self.sizes: list[int] = []  # rows of every batch the loop trained on, canaries included
        self._pending: list[tuple[int, np.ndarray, list[np.ndarray]]] = []  # drawn, not stepped on: size, draws, rows
        self._shard = None  # accelerate's DataLoaderShard, which collates one batch ahead of the one it yields
        self.canary_draws = np.zeros(len(self.canary_rows), dtype=np.int64)
        self.longest = max((int(r.numel()) for r in self.canary_rows), default=1)
        self._seen: set[int] = set()
        self._members: list[np.ndarray] = []
        self._wanted = int(members)
        self.steps = 0
        self.noise_sum_squares = 0.0
        self.noise_count = 0
        self.nonfinite_updates = 0
        self.log: list[dict[str, Any]] = []
        self.canaries: GradientCanaries | None = None
        self._restore = None
        self._params: list[torch.nn.Parameter] = []
        self._before: dict[int, torch.Tensor] = {}
        self._started = time.perf_counter()

    # -- the loader -----------------------------------------------------------------

    def wrap_loader(self, loader) -> LoaderTap:
        if isinstance(loader, LoaderTap):
            raise InputError("this loader is wrapped already: wrap the loop's loader once")
        if self.loader is not None:
            raise InputError("the audit wraps one loader already: one Audit audits one training loop")
        n = loader_units(loader)
        q = self.claim.sample_rate if self.claim.sample_rate is not None else loader_sample_rate(loader, n)
        if q is None:
            raise InputError(f"cannot tell the Poisson rate of {type(loader).__name__} (no sample_rate, no batch_size): "
                             "give it in the claim, claim=dict(..., sample_rate=q)")
        self.loader, self.num_units, self.sample_rate, self.sampler = loader, n, q, sampler_name(loader)
        return LoaderTap(loader, self)

    def tap_loader(self, loader) -> None:
        """Tap ``loader`` in place (a loader already handed to a loop, such as a Hugging Face
        ``Trainer``'s): its ``collate_fn`` adds the canary rows to each collated batch. Only a
        loader that collates in this process (``num_workers=0``) can be tapped so."""
        if getattr(loader, "num_workers", 0):
            raise InputError(f"the audit taps a Trainer's loader in this process: it needs num_workers=0 (the loader "
                             f"has {loader.num_workers}; set dataloader_num_workers=0)")
        self.wrap_loader(loader)
        target = getattr(loader, "base_dataloader", loader)  # accelerate's DataLoaderShard iterates its base loader
        self._shard = loader if target is not loader else None
        collate = target.collate_fn

        def tapped(rows):
            return self.on_batch(collate(rows))

        target.collate_fn = tapped

    def on_batch(self, batch):
        """The batch with this step's canary rows; its size, canary draws and rows pending until a step."""
        if not isinstance(batch, Mapping) or "input_ids" not in batch or not torch.is_tensor(batch["input_ids"]):
            raise InputError(f"the audit adds its canaries to batches that are mappings with an input_ids tensor (as "
                             f"a Hugging Face collator makes), got {type(batch).__name__}")
        rows, tokens = _rows_of(batch)
        drawn = np.flatnonzero(self._draws.random(len(self.canary_rows)) < self.sample_rate)
        out = append_rows(batch, [self.canary_rows[i] for i in drawn], pad_id=self.pad_id)
        self._pending.append((rows + len(drawn), drawn, tokens))
        self.longest = max(self.longest, int(out["input_ids"].shape[1]) if rows or len(drawn) else 0)
        return out

    def _commit(self) -> None:
        """At an optimizer step: the batches drawn since the last step were trained on, but for
        the one a ``DataLoaderShard`` collated ahead (it draws the next batch before it yields
        one, except at the end of its pass); their sizes, canary draws and rows are recorded."""
        ahead = self._shard is not None and not getattr(self._shard, "end_of_dataloader", True)
        trained = self._pending[:len(self._pending) - 1] if ahead and self._pending else self._pending
        self._pending = self._pending[len(trained):]
        for size, drawn, tokens in trained:
            self.sizes.append(size)
            self.canary_draws[drawn] += 1
            self._sample_members(tokens)

    def _sample_members(self, tokens: list[np.ndarray]) -> None:
        """A uniform sample (reservoir) of the distinct rows trained on: the members the attacks score."""
        for row in tokens:
            key = hash(row.tobytes())
            if key in self._seen:
                continue
            self._seen.add(key)
            if len(self._members) < self._wanted:
                self._members.append(row.copy())
            else:
                j = int(self._reservoir_rng.integers(len(self._seen)))
                if j < self._wanted:
                    self._members[j] = row.copy()

    def member_rows(self) -> list[np.ndarray]:
        return list(self._members)

    # -- the optimizer --------------------------------------------------------------

    def wrap_optimizer(self, optimizer):
        """Tap ``optimizer`` in place and return it (see the module docstring)."""
        if getattr(optimizer, "_dpaudit_tapped", False):
            raise InputError("this optimizer is wrapped already: wrap the loop's optimizer once")
        if self.optimizer is not None:
            raise InputError("the audit wraps one optimizer already: one Audit audits one training loop")
        while not isinstance(optimizer, _dp_optimizer_classes()[0]) and isinstance(
                getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
            optimizer = optimizer.optimizer  # accelerate's AcceleratedOptimizer (a Trainer's) around the user's
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InputError(f"wrap_optimizer takes a torch optimizer (Opacus's DPOptimizer is one), got "
                             f"{type(optimizer).__name__}")
        dp_classes, adaptive = _dp_optimizer_classes()
        if adaptive and isinstance(optimizer, adaptive):
            raise InputError("adaptive clipping moves the clipping bound at every step; the audit's gradient canaries "
                             "and its noise check need a fixed one (clipping='flat' or 'per_layer')")
        self._params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        if not self._params:
            raise InputError("the optimizer has no trainable parameters")
        self._before = checks.snapshot(dict(enumerate(self._params)))
        if dp_classes and isinstance(optimizer, dp_classes):
            original = optimizer.add_noise

            def add_noise(opt):
                original()
                self._released(opt, original)

            optimizer.add_noise = add_noise.__get__(optimizer)

            def restore():
                del optimizer.add_noise
        else:
            handle = optimizer.register_step_post_hook(lambda opt, args, kwargs: self._released(opt, None))
            restore = handle.remove
        optimizer._dpaudit_tapped = True
        self.optimizer, self._restore = optimizer, restore
        return optimizer

    def release(self) -> None:
        """Undo the optimizer's tap (the optimizer works as before)."""
        if self._restore is not None:
            self._restore()
            self._restore = None
            self.optimizer.__dict__.pop("_dpaudit_tapped", None)

    def _released(self, optimizer, add_noise) -> None:
        """One noisy step of the optimizer (``add_noise``: Opacus's, None for a plain optimizer)."""
        self._commit()
        self.steps += 1
        sums, flags, count = [], [], 0
        for p in self._params:
            if p.grad is None:
                continue
            flags.append(torch.isfinite(p.grad).all())
            summed = getattr(p, "summed_grad", None)
            if add_noise is not None and summed is not None:
                sums.append((p.grad.detach().reshape(-1).double() - summed.detach().reshape(-1).double()).pow(2).sum())
                count += summed.numel()
        squares = sum(float(s) for s in sums)
        self.noise_sum_squares += squares
        self.noise_count += count
        self.nonfinite_updates += not all(bool(f) for f in flags)
        if add_noise is not None and self.num_gradient_canaries:
            self._canary_step(optimizer, add_noise)
        row = {"step": self.steps, "batch_size": self.sizes[self.steps - 1] if self.steps <= len(self.sizes) else None,
               "noise_std": math.sqrt(squares / count) if count else None,
               "elapsed_s": round(time.perf_counter() - self._started, 3)}
        self.log.append(row)

    def _canary_step(self, optimizer, add_noise) -> None:
        """The canaries' block as the clipped sum (``summed_grad``) of a parameter of their M
        coordinates, alone in the optimizer's parameter groups for one more ``add_noise`` of
        Opacus with the canaries' own noise stream; its noisy ``grad`` goes to their scores."""
        device = self._params[0].device
        if self.canaries is None:
            if self.sample_rate is None:
                raise InputError("wrap the data loader before the first step (the gradient canaries are included at "
                                 "its Poisson rate q)")
            self.canaries = GradientCanaries(
                num_canaries=self.num_gradient_canaries, sample_rate=self.sample_rate,
                max_grad_norm=float(optimizer.max_grad_norm), rng=self.seeds.canary_generator(),
                noise_generator=self.seeds.canary_noise_generator(device))
        parameter = torch.nn.Parameter(torch.empty(self.canaries.num_canaries, device=device))
        parameter.summed_grad = self.canaries.block(device=device)
        groups, noise = optimizer.param_groups, optimizer.generator
        optimizer.param_groups = [{**groups[-1], "params": [parameter]}]
        optimizer.generator = self.canaries.noise_source(noise)
        try:
            add_noise()
        finally:
            optimizer.param_groups, optimizer.generator = groups, noise
        self.canaries.observe(parameter.grad)

    # -- the record -----------------------------------------------------------------

    def training_record(self, *, log_rows: Sequence[dict[str, Any]] = ()) -> TrainingRecord:
        """The :class:`~dpaudit.train.TrainingRecord` of the loop: the claim's DP record, the
        checks, the gradient canaries and the log (``log_rows``: the evaluations, by step)."""
        if self.loader is None or self.optimizer is None:
            raise InputError("finish() needs the loop's loader and optimizer wrapped (audit.wrap_loader(loader), "
                             "audit.wrap_optimizer(optimizer)) before training")
        if not self.sizes or not self.steps:
            drawn = len(self.sizes) + len(self._pending)
            raise InputError(f"finish() before any training step ({drawn} batches drawn, {self.steps} optimizer "
                             "steps): nothing to audit")
        claim, q = self.claim, float(self.sample_rate)
        steps = claim.steps if claim.steps is not None else self.steps
        units = self.num_units + len(self.canary_rows)
        opt = self.optimizer
        sigma = float(getattr(opt, "noise_multiplier", 0.0) or 0.0)
        clip = getattr(opt, "max_grad_norm", None)
        clip = float(clip) if isinstance(clip, (int, float)) else None
        expected = getattr(opt, "expected_batch_size", None)
        record = claimed_record(claim, sample_rate=q, steps=steps, num_units=units, max_grad_norm=clip,
                                expected_batch_size=int(expected) if expected else max(1, round(q * units)),
                                trainer=f"user loop with {type(opt).__module__}.{type(opt).__name__} (dpaudit.Audit)")
        summary = checks.summarize(
            batch_sizes=checks.batch_size_check(self.sizes, num_units=units, sample_rate=q),
            moved=checks.parameters_moved(self._before, dict(enumerate(self._params))),
            nonfinite={"updates": self.nonfinite_updates}, sampler=self.sampler)
        summary["steps"] = {"loader_batches": len(self.sizes), "optimizer_steps": self.steps, "claimed": claim.steps,
                            "consistent": len(self.sizes) == self.steps}
        summary["noise"] = noise_check(claim, record, noise_multiplier=sigma, max_grad_norm=clip,
                                       sum_squares=self.noise_sum_squares, count=self.noise_count)
        summary["ok"] = bool(summary["ok"] and summary["steps"]["consistent"] and summary["noise"]["consistent"])
        summary["canary_rows"] = {"members": len(self.canary_rows), "draws": int(self.canary_draws.sum())}
        log = _merge_log(self.log, log_rows)
        return TrainingRecord(log=log, dp=record, checks=summary,
                              gradient_canaries=None if self.canaries is None else self.canaries.result())

    # -- evaluation -----------------------------------------------------------------

    @contextlib.contextmanager
    def at_start(self):
        """Inside the block the optimizer's parameters hold their values of when it was
        wrapped (the model the loop started from); their values now are put back after."""
        now = [p.detach().clone() for p in self._params]
        try:
            with torch.no_grad():
                for i, p in enumerate(self._params):
                    p.copy_(self._before[i].to(p.device))
            yield
        finally:
            with torch.no_grad():
                for p, value in zip(self._params, now):
                    p.copy_(value)

    def evaluations(self, model, *, members: Sequence[torch.Tensor], heldout: Sequence[torch.Tensor]
                    ) -> list[dict[str, Any]]:
        """The loss of the member and the held-out rows before training (the optimizer's
        parameters put back to their values when it was wrapped, then restored) and now: the
        log's step-0 record and its last, as the toolkit's own loop writes them."""
        device = self._params[0].device
        batch = 16

        def losses() -> dict[str, float | None]:
            out = {}
            for key, rows in (("train", members), ("heldout", heldout)):
                loss, ppl = evaluate(model, list(rows)[:MAX_EVAL_ROWS], batch_size=batch, pad_id=self.pad_id,
                                     device=device)
                finite = math.isfinite(loss)
                out["train_eval_loss" if key == "train" else "heldout_loss"] = loss if finite else None
                out["train_perplexity" if key == "train" else "heldout_perplexity"] = ppl if finite else None
            return out

        final = losses()
        with self.at_start():
            initial = losses()
        return [{"step": 0, **initial, "elapsed_s": 0.0}, {"step": self.steps, **final}]


def noise_check(claim: LoopClaim, record: DpRecord, *, noise_multiplier: float, max_grad_norm: float | None,
                sum_squares: float, count: int) -> dict[str, Any]:
    """Is the optimizer's noise the claim's? Its noise multiplier's accountant epsilon (at the
    record's q, T and delta) at most the claim's (within :data:`EPSILON_RTOL`), and the noise
    measured in its updates (``sum_squares`` over ``count`` coordinates) of the standard
    deviation its noise multiplier says: the pooled variance against (sigma C)^2, a z-score
    with variance 2 / count (chi-squared), two-sided p-value at least
    :data:`dpaudit.train.checks.P_VALUE_THRESHOLD`."""
    params = record.dpsgd_parameters
    if noise_multiplier > 0:
        at_optimizer = accounting.epsilon(noise_multiplier=noise_multiplier, sample_rate=params["sample_rate"],
                                          steps=params["steps"], delta=claim.delta, method=claim.accountant)
    else:
        at_optimizer = math.inf
    enough = at_optimizer <= claim.epsilon * (1 + EPSILON_RTOL)
    expected = noise_multiplier * max_grad_norm if max_grad_norm is not None else 0.0
    measured = math.sqrt(sum_squares / count) if count else None
    out: dict[str, Any] = {
        "optimizer_noise_multiplier": noise_multiplier, "max_grad_norm": max_grad_norm,
        "claimed_noise_multiplier": params["noise_multiplier"], "claimed_epsilon": claim.epsilon,
        "epsilon_at_optimizer_noise": at_optimizer if math.isfinite(at_optimizer) else None,
        "expected_std": expected, "measured_std": measured, "coordinates": count, "z": None, "p_value": None,
        "p_value_threshold": checks.P_VALUE_THRESHOLD,
    }
    if measured is None:
        as_said = expected == 0
    elif expected == 0:
        as_said = measured == 0
    else:
        z = (sum_squares / count / expected**2 - 1.0) / math.sqrt(2.0 / count)
        p = math.erfc(abs(z) / math.sqrt(2.0))
        out.update(z=z, p_value=p)
        as_said = p >= checks.P_VALUE_THRESHOLD
    out["enough"] = bool(enough)
    out["as_configured"] = bool(as_said)
    out["consistent"] = bool(enough and as_said)
    return out


def _merge_log(steps: list[dict[str, Any]], evaluations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step rows with the evaluations merged in by step (a step-0 row first)."""
    by_step = {r["step"]: dict(r) for r in steps}
    for row in evaluations:
        by_step[row["step"]] = {**by_step.get(row["step"], {}), **row}
    return [by_step[k] for k in sorted(by_step)]


def rows_of_texts(tokenizer, texts: Sequence[str], *, max_length: int) -> list[torch.Tensor]:
    """Token rows of ``texts`` as the attack stage tokenizes them (special tokens, truncated)."""
    if not texts:
        return []
    enc = tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=max_length)
    return [torch.tensor(ids, dtype=torch.long) for ids in enc["input_ids"] if ids]
