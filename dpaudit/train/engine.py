"""Gradient engines: what one training step does with a batch of protected units.

An engine turns a batch of units (each a list of token sequences) into the update
direction, left in ``p.grad`` of every trainable parameter. The training loop
(:mod:`dpaudit.train.loop`) then takes an optimizer step. Both engines follow one template,

    summed   = sum over units u of clip_C(g_u)        (no clipping for the non-private engine)
    noisy    = summed + N(0, sigma^2 C^2 I)             (no noise for the non-private engine)
    update   = noisy / B                                (B: the EXPECTED batch size, a constant)

which is DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016) with
the noise calibrated as in the paper: sensitivity C under add/remove of one unit, and
the divisor fixed in the config, never the realised batch size (that would make the
noise scale depend on the data). The faulty engines of :mod:`dpaudit.train.faulty`
override single steps of this template.

Loss. The loss of one example is the mean negative log-likelihood over that example's
predicted tokens (the tokens after the first, padding excluded), so every example has the
same weight whatever its length. A unit's gradient ``g_u`` is the gradient of the sum of
its examples' losses: one example for ``unit: example``, all of a user's examples for
``unit: user``; clipping then bounds the whole user's contribution.

Per-example gradients (:class:`DPSGDEngine`) come from ``torch.func``: ``vmap`` over the
examples of a micro-batch of ``grad`` of the one-example loss, with ``functional_call`` on
the trainable parameters only (with LoRA, the adapter weights; tied embeddings stay tied).
Three traps of Hugging Face models are avoided:

- position ids are passed explicitly, one row per example (GPT-2 would otherwise build
  one broadcast row, which hooks-based per-sample code gets wrong);
- the attention implementation is switched to ``"eager"`` while the engine lives:
  SDPA's mask preparation branches on the mask's values (``padding_mask.all()``), which
  ``vmap`` refuses, and SDPA has no batching rule on CPU (a slow per-example fallback);
- should a model's mask code still branch on data, the engine falls back to a
  precomputed additive 4-D causal+padding mask, which transformers passes through as is.

GPT-2's ``Conv1D`` layers need nothing special: ``torch.func`` differentiates any module.

:class:`dpaudit.train.ghost.GhostClippingEngine` (the default, ``train.dp.engine: auto``)
computes the same update without materializing most per-example gradients (ghost clipping
with book-keeping); this engine is its fallback and reference.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from dpaudit.devices import to_device
from dpaudit.train import sampling

if TYPE_CHECKING:
    from dpaudit.train.gradient_canaries import GradientCanaries

CLIP_EPS = 1e-6  # clip factor C / (||g|| + eps): the clipped norm is strictly below C
CANARY_KEY = "<gradient canaries>"  # the canary block's key in a step's dicts: no parameter's name

# --------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """A right-padded micro-batch. ``labels`` are ``input_ids`` with -100 on padding."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    position_ids: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(*(to_device(t, device) for t in (self.input_ids, self.attention_mask, self.labels, self.position_ids)))


def collate(sequences: Sequence[Tensor], *, pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Pad 1-D token tensors on the right to the longest of them; explicit position ids."""
    if not sequences:
        raise ValueError("cannot collate an empty batch")
    length = max(int(s.shape[0]) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, : seq.shape[0]] = seq
        mask[i, : seq.shape[0]] = 1
    labels = ids.masked_fill(mask == 0, -100)
    positions = torch.arange(length, dtype=torch.long).unsqueeze(0).expand(len(sequences), -1).contiguous()
    return Batch(ids, mask, labels, positions).to(device)


def token_nll(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Summed next-token NLL and the number of predicted tokens, over the last dimension
    pair of ``logits`` (..., L, V) and ``labels`` (..., L); -100 labels are ignored."""
    logits = logits[..., :-1, :].float()
    targets = labels[..., 1:]
    valid = targets != -100
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * valid).sum(-1), valid.sum(-1)


def example_losses(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-example loss: mean NLL over each example's own predicted tokens (0 if none)."""
    total, count = token_nll(logits, labels)
    return total / count.clamp(min=1)


def _logits(output) -> Tensor:
    return output.logits if hasattr(output, "logits") else output[0]


def forward_logits(model: torch.nn.Module, batch: Batch) -> Tensor:
    return _logits(
        model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
    )


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters by name; a tied parameter appears once (its first name)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


# --------------------------------------------------------------------------- statistics


class StepStats:
    """What one step saw: ``num_units`` and ``num_examples``; the per-example ``losses`` (for the
    train log only: not private); the per-unit gradient norms before clipping (``unit_norms``,
    DP engines) with the unit of each (``unit_index``: its index in the step's ``units``, who was
    clipped), and how many were not finite (``nonfinite_units``) or clipped (``clipped_units``).

    The engines hand the losses and norms over as tensors where they were computed
    (:meth:`add_losses`, :meth:`add_norms`), and they are read to the host in one copy (per
    device) the first time any of them is read. On CUDA each read of a tensor's values waits for all the work
    queued before it: read in the middle of a step, it would make the host wait for the backward
    pass before queueing the clipping, the noise and the optimizer, where it can queue them while
    the device still works. The training loop reads them after its optimizer step."""

    def __init__(self, *, num_units: int = 0, num_examples: int = 0):
        self.num_units, self.num_examples = num_units, num_examples
        # in order: ("losses", values) or ("norms", values, units or None, clipping norm), the
        # values a tensor until read, then a list of floats
        self._parts: list[list] = []

    def add_losses(self, losses: Tensor | Sequence[float]) -> None:
        """Add per-example losses (a tensor on any device, read later, or floats)."""
        self._parts.append(["losses", _later(losses)])

    def add_norms(self, norms: Tensor | Sequence[float], units: Sequence[int] | None, *,
                  max_grad_norm: float) -> None:
        """Add unit gradient norms before clipping; norm j is of the step's unit ``units[j]``.
        Without ``units`` (an engine that does not say whose norm is whose) the step's per-unit
        record is unknown: ``unit_index`` stops matching ``unit_norms`` and the loop records no
        per-unit clipping for the run. A norm counts as clipped when ``norm + CLIP_EPS >
        max_grad_norm``."""
        units = None if units is None else [int(u) for u in units]
        count = norms.numel() if isinstance(norms, Tensor) else len(norms)
        if units is not None and len(units) != count:
            raise ValueError(f"{count} unit norms for {len(units)} units")
        self._parts.append(["norms", _later(norms), units, float(max_grad_norm)])

    def merge(self, part: StepStats, units: Sequence[int]) -> None:
        """Add ``part``, the statistics of a sub-batch whose unit ``j`` is ``units[j]`` here."""
        self.num_examples += part.num_examples
        for entry in part._parts:
            if entry[0] == "norms" and entry[2] is not None:
                entry = [*entry[:2], [units[j] for j in entry[2]], entry[3]]
            self._parts.append(entry)

    def _read(self, kind: str) -> list[list]:
        """This kind's entries, their values read to the host (every pending one, in one copy
        per device)."""
        by_device: dict[torch.device, list[list]] = {}
        for entry in self._parts:
            if isinstance(entry[1], Tensor):
                by_device.setdefault(entry[1].device, []).append(entry)
        for pending in by_device.values():
            values = torch.cat([entry[1].detach().reshape(-1).float() for entry in pending]).cpu().tolist()
            start = 0
            for entry in pending:
                size = entry[1].numel()
                entry[1], start = values[start : start + size], start + size
        return [entry for entry in self._parts if entry[0] == kind]

    # read-only (tuples: an engine adds through add_losses and add_norms)
    @property
    def losses(self) -> tuple[float, ...]:
        return tuple(x for entry in self._read("losses") for x in entry[1])

    @property
    def unit_norms(self) -> tuple[float, ...]:
        return tuple(x for entry in self._read("norms") for x in entry[1])

    @property
    def unit_index(self) -> tuple[int, ...]:
        return tuple(u for entry in self._read("norms") if entry[2] is not None for u in entry[2])

    @property
    def nonfinite_units(self) -> int:
        return sum(1 for x in self.unit_norms if not math.isfinite(x))

    @property
    def clipped_units(self) -> int:
        return sum(1 for entry in self._read("norms") for x in entry[1] if x + CLIP_EPS > entry[3])


def _later(values: Tensor | Sequence[float]) -> Tensor | list[float]:
    return values if isinstance(values, Tensor) else [float(x) for x in values]


# --------------------------------------------------------------------------- engines


def zero_sums(params: dict[str, Tensor]) -> dict[str, Tensor]:
    """A float32 zero sum per parameter of ``params``: views of one buffer per device, in the
    parameters' order (one allocation and one fill, not one per parameter; on an accelerator
    the noise, secure or seeded, is one draw into the buffer: :func:`dpaudit.train.sampling.one_buffer`)."""
    by_device: dict[torch.device, list[str]] = {}
    for name, p in params.items():
        by_device.setdefault(p.device, []).append(name)
    zeros: dict[str, Tensor] = {}
    for device, names in by_device.items():
        shapes = [params[name].shape for name in names]
        flat = torch.zeros(sum(shape.numel() for shape in shapes), dtype=torch.float32, device=device)
        for name, shape, part in zip(names, shapes, flat.split([shape.numel() for shape in shapes])):
            zeros[name] = part.view(shape)
    return {name: zeros[name] for name in params}


class GradientEngine:
    """Template of one step: ``summed_gradients`` -> ``add_noise`` -> ``normalize``.

    With gradient canaries attached (:meth:`attach_canaries`), each step also draws the
    canaries' block and puts it through the engine's own ``add_noise`` before ``normalize``
    (:meth:`canary_step`, :mod:`dpaudit.train.gradient_canaries`)."""

    private = False
    canaries: GradientCanaries | None = None

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        expected_batch_size: int,
        microbatch_size: int,
        pad_id: int,
        device: torch.device | str = "cpu",
        autocast_dtype: torch.dtype | None = None,
        noise_multiplier: float = 0.0,
        max_grad_norm: float = math.inf,
    ):
        if expected_batch_size < 1:
            raise ValueError(f"expected batch size must be positive, got {expected_batch_size}")
        if microbatch_size < 1:
            raise ValueError(f"micro-batch size must be positive, got {microbatch_size}")
        if noise_multiplier < 0 or not max_grad_norm > 0:
            raise ValueError("noise multiplier must be >= 0 and the clipping norm > 0")
        self.model = model
        self.expected_batch_size = int(expected_batch_size)
        self.microbatch_size = int(microbatch_size)
        self.pad_id = int(pad_id)
        self.device = torch.device(device)
        self.autocast_dtype = autocast_dtype
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.params = trainable_parameters(model)
        if not self.params:
            raise ValueError("the model has no trainable parameters")

    # -- the template --------------------------------------------------------

    def step(self, units: Sequence[Sequence[Tensor]], generator: torch.Generator | None = None) -> StepStats:
        """Leave the update direction for ``units`` (each a list of 1-D token tensors) in
        ``p.grad``; return what the step saw."""
        summed, stats = self.summed_gradients(units)
        noisy = self.add_noise(summed, generator)
        self.canary_step(generator)
        update = self.normalize(noisy, len(units))
        for name, p in self.params.items():
            p.grad = update[name].to(p.dtype)
        return stats

    def attach_canaries(self, canaries: GradientCanaries) -> None:
        """Run ``canaries`` alongside every step from now on (:meth:`canary_step`)."""
        if CANARY_KEY in self.params:
            raise ValueError(f"a parameter is named {CANARY_KEY!r}, the gradient canaries' key")
        self.canaries = canaries

    def canary_step(self, generator: torch.Generator | None) -> None:
        """This step's canary block, as the clipped sum of the canaries' own coordinates
        (:data:`CANARY_KEY`), through this engine's ``add_noise`` with the canaries' noise
        source (:meth:`~dpaudit.train.gradient_canaries.GradientCanaries.noise_source`), then
        to their scores: what the mechanism releases for them, before any division. Nothing
        without canaries. A call of its own, after the parameters' noise: in reproducible
        mode the canaries draw their noise from a stream of their own, so the parameters'
        noise, and the model, are those of a run without canaries."""
        if self.canaries is None:
            return
        block = self.canaries.block(device=self.device)
        released = self.add_noise({CANARY_KEY: block}, self.canaries.noise_source(generator))
        self.canaries.observe(released[CANARY_KEY])

    def summed_gradients(self, units: Sequence[Sequence[Tensor]]) -> tuple[dict[str, Tensor], StepStats]:
        raise NotImplementedError

    def add_noise(self, summed: dict[str, Tensor], generator: torch.Generator | None) -> dict[str, Tensor]:
        return summed

    def normalize(self, noisy: dict[str, Tensor], realised_batch_size: int) -> dict[str, Tensor]:
        # in place, as add_noise: the sums are this step's own (one operation for all of them)
        torch._foreach_div_(list(noisy.values()), float(self.expected_batch_size))
        return noisy

    def close(self) -> None:
        """Undo what the engine changed on the model."""

    # -- helpers -------------------------------------------------------------

    def zeros(self) -> dict[str, Tensor]:
        return zero_sums(self.params)

    def microbatches(self, items: list, size: int | None = None) -> Iterable[list]:
        size = size or self.microbatch_size
        for start in range(0, len(items), size):
            yield items[start : start + size]


class NonPrivateEngine(GradientEngine):
    """Ordinary back-propagation of the summed per-example losses; no clipping, no noise.
    Divided by the (expected = actual, for the shuffle sampler) batch size, this is the
    mean per-example loss gradient."""

    def summed_gradients(self, units):
        stats = StepStats(num_units=len(units))
        sequences = sorted((seq for unit in units for seq in unit), key=len, reverse=True)
        stats.num_examples = len(sequences)
        for p in self.params.values():
            p.grad = None
        for chunk in self.microbatches(sequences):
            batch = collate(chunk, pad_id=self.pad_id, device=self.device)
            with autocast_context(self.device, self.autocast_dtype):
                losses = example_losses(forward_logits(self.model, batch), batch.labels)
            losses.sum().backward()
            stats.add_losses(losses.detach())
        summed = {}
        for name, p in self.params.items():
            summed[name] = p.grad.float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
            p.grad = None
        return summed, stats


class DPSGDEngine(GradientEngine):
    """DP-SGD: per-unit gradients (``torch.func``, micro-batched), each clipped to norm C,
    summed, plus Gaussian noise of standard deviation sigma * C per coordinate, divided by
    the expected batch size."""

    private = True
    eager_vmap = True  # set up the torch.func path (and eager attention) at construction

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self._mask_mode = "2d"
        self._restore_attention = lambda: None
        self._grad_fn = None
        if self.eager_vmap:
            self._setup_vmap()

    def _setup_vmap(self) -> None:
        """Eager attention and the vmapped gradient functions, once."""
        if self._grad_fn is not None:
            return
        self._restore_attention = _use_eager_attention(self.model)
        self._grad_fn = {
            mode: vmap(grad_and_value(self._loss_fn(mode)), in_dims=(None, 0, 0, 0), randomness="different")
            for mode in ("2d", "4d")
        }

    def close(self) -> None:
        self._restore_attention()

    # -- per-example gradients -------------------------------------------------

    def _loss_fn(self, mode: str):
        model = self.model

        def loss(params: dict[str, Tensor], input_ids: Tensor, mask: Tensor, labels: Tensor) -> Tensor:
            length = input_ids.shape[0]
            positions = torch.arange(length, device=input_ids.device)
            if mode == "2d":
                attention = mask.unsqueeze(0)
            else:  # additive causal + padding mask, (1, 1, L, L)
                causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
                allowed = causal & mask.bool().unsqueeze(0)
                dtype = self.autocast_dtype or next(iter(params.values())).dtype
                attention = torch.zeros(length, length, dtype=dtype, device=input_ids.device)
                attention = attention.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]
            output = functional_call(
                model,
                params,
                args=(),
                kwargs={
                    "input_ids": input_ids.unsqueeze(0),
                    "attention_mask": attention,
                    "position_ids": positions.unsqueeze(0),
                    "use_cache": False,
                },
            )
            total, count = token_nll(_logits(output)[0], labels)
            return total / count.clamp(min=1)

        return loss

    def per_example_gradients(self, batch: Batch) -> tuple[dict[str, Tensor], Tensor]:
        """Gradients of each example's loss, ``{name: (m, *shape)}``, and the losses (m,)."""
        self._setup_vmap()
        params = {name: p.detach() for name, p in self.params.items()}
        with autocast_context(self.device, self.autocast_dtype):
            try:
                grads, losses = self._grad_fn[self._mask_mode](params, batch.input_ids, batch.attention_mask, batch.labels)
            except RuntimeError as err:
                if self._mask_mode != "2d" or "vmap" not in str(err):
                    raise
                self._mask_mode = "4d"  # the model's mask code branches on data
                grads, losses = self._grad_fn["4d"](params, batch.input_ids, batch.attention_mask, batch.labels)
        return {name: g.float() for name, g in grads.items()}, losses.detach().float()

    # -- clipping ---------------------------------------------------------------

    def clip_factors(self, norms: Tensor) -> Tensor:
        return (self.max_grad_norm / (norms + CLIP_EPS)).clamp(max=1.0)

    def clipped_sum(self, unit_grads: dict[str, Tensor], total: dict[str, Tensor], stats: StepStats,
                    units: Sequence[int] | None = None) -> None:
        """Clip each row of ``unit_grads`` (one row per complete unit, row j the step's unit
        ``units[j]``) and add to ``total``."""
        first = next(iter(unit_grads.values()))
        if first.shape[0] == 0:
            return
        squares = torch.zeros(first.shape[0], dtype=torch.float32, device=first.device)
        for g in unit_grads.values():
            squares += g.reshape(g.shape[0], -1).pow(2).sum(1)
        norms = squares.sqrt()
        factors = self.clip_factors(norms)
        for name, g in unit_grads.items():
            total[name] += torch.einsum("k,k...->...", factors, g)
        self.record_norms(norms, stats, units)

    def record_norms(self, norms: Tensor, stats: StepStats, units: Sequence[int] | None = None) -> None:
        """Add the units' gradient norms (before clipping) to the step's statistics, clipped at
        this engine's norm (:meth:`StepStats.add_norms`)."""
        stats.add_norms(norms, units, max_grad_norm=self.max_grad_norm)

    def summed_gradients(self, units):
        return self._summed(units, self.clipped_sum)

    def _summed(self, units, accumulate) -> tuple[dict[str, Tensor], StepStats]:
        """Per-unit gradients (sum over a unit's examples) handed to ``accumulate(unit_grads,
        total, stats, units)`` in chunks of complete units (row j of ``unit_grads`` is the
        step's unit ``units[j]``); memory stays at O(micro-batch x parameters) because a
        unit that spans two micro-batches is carried over, never all units at once."""
        stats = StepStats(num_units=len(units))
        total = self.zeros()
        # one row per example, tagged with its unit; a unit's rows are contiguous
        if all(len(unit) == 1 for unit in units):
            order = sorted(range(len(units)), key=lambda u: len(units[u][0]), reverse=True)
            rows = [(u, units[u][0]) for u in order]
        else:
            rows = [(u, seq) for u, unit in enumerate(units) for seq in sorted(unit, key=len, reverse=True)]
        stats.num_examples = len(rows)
        carry: dict[str, Tensor] | None = None
        for start in range(0, len(rows), self.microbatch_size):
            chunk = rows[start : start + self.microbatch_size]
            following = rows[start + self.microbatch_size][0] if start + self.microbatch_size < len(rows) else None
            batch = collate([seq for _, seq in chunk], pad_id=self.pad_id, device=self.device)
            grads, losses = self.per_example_gradients(batch)
            stats.add_losses(losses)
            tags = [u for u, _ in chunk]
            here = list(dict.fromkeys(tags))  # the units of unit_grads' rows, in order
            if len(set(tags)) == len(tags):
                unit_grads = grads
            else:
                local, index = {}, []
                for u in tags:
                    index.append(local.setdefault(u, len(local)))
                index_t = to_device(torch.tensor(index), self.device)
                unit_grads = {
                    name: torch.zeros((len(local), *g.shape[1:]), dtype=g.dtype, device=g.device).index_add_(0, index_t, g)
                    for name, g in grads.items()
                }
            if carry is not None:  # the first unit here began in the previous micro-batch
                for name in unit_grads:
                    unit_grads[name][0] += carry[name]
                carry = None
            if following is not None and following == tags[-1]:  # the last unit goes on
                carry = {name: g[-1].clone() for name, g in unit_grads.items()}
                unit_grads = {name: g[:-1] for name, g in unit_grads.items()}
                here = here[:-1]
            accumulate(unit_grads, total, stats, here)
        return total, stats

    # -- noise --------------------------------------------------------------------

    def noise_std(self) -> float:
        if self.noise_multiplier == 0:
            return 0.0  # also with C = infinity (0 * inf is nan)
        return self.noise_multiplier * self.max_grad_norm

    def add_noise(self, summed, generator):
        std = self.noise_std()
        if std == 0:
            return summed
        # in place: ``summed`` is this step's own (one pass and no new tensor per parameter)
        if isinstance(generator, sampling.SecureGenerator):  # secure mode: ChaCha20 noise, the sum snapped to a grid
            generator.add_noise_all_(list(summed.values()), std=std)
            return summed
        flat = sampling.one_buffer(list(summed.values())) if sampling.one_draw(self.device) else None
        if flat is not None:  # on an accelerator the sums' one buffer (zero_sums) gets one draw
            flat.add_(torch.randn(flat.shape, generator=generator, device=flat.device), alpha=std)
            return summed
        for g in summed.values():
            g.add_(torch.randn(g.shape, generator=generator, device=g.device, dtype=g.dtype), alpha=std)
        return summed


# --------------------------------------------------------------------------- attention


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    if hasattr(model, "get_base_model"):  # peft
        return model.get_base_model()
    return model


def _use_eager_attention(model: torch.nn.Module):
    """Switch a transformers model to eager attention; return a function that undoes it."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current in (None, "eager") or not hasattr(base, "set_attn_implementation"):
        return lambda: None
    try:
        base.set_attn_implementation("eager")
    except (ValueError, ImportError, AttributeError, NotImplementedError):
        return lambda: None

    def restore() -> None:
        with contextlib.suppress(ValueError, ImportError, AttributeError, NotImplementedError):
            base.set_attn_implementation(current)

    return restore
