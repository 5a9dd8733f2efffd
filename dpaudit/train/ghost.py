"""Ghost clipping with book-keeping: DP-SGD's clipped sum from one forward and one backward pass.

DP-SGD (Abadi et al. 2016) needs each unit's gradient norm ||g_u|| and then the sum of the
clipped gradients sum_u min(1, C / ||g_u||) g_u. :class:`~dpaudit.train.engine.DPSGDEngine`
materializes every per-example gradient with ``torch.func.vmap``: memory and time of B copies
of the model's gradient. :class:`GhostClippingEngine` gets the same two quantities without
them, for the layers that carry nearly all of a transformer's weights:

- A linear layer y_t = W a_t (+ b) of one example has the weight gradient
  G = sum_t g_t a_t^T (g_t = dL/dy_t), whose squared norm is
  ||G||^2 = sum_{t,s} (a_t . a_s)(g_t . g_s): two T x T Gram matrices instead of the p x d
  gradient ("ghost clipping", Li et al. 2021, "Large language models can be strong
  differentially private learners", arXiv 2110.05679). GPT-2's ``Conv1D`` is the same with
  W transposed. An embedding is a linear layer of one-hot inputs: (a_t . a_s) becomes
  [x_t = x_s] (rows of ``padding_idx`` get no gradient).
- Tied weights (GPT-2's input embedding and output layer share one matrix): the example's
  gradient is the sum of both uses, so its squared norm has the cross term
  2 <G_emb, G_head> = 2 sum_{t,s} h_s[x_t] (e_t . a_s) (h_s = dL/dlogits_s, e_t = dL/dembedding_t,
  a_s = the output layer's input). Every pair of uses of one parameter gets its cross term.
- Per layer, ghost or materialized (the idea of mixed ghost clipping, Bu et al. 2022, arXiv
  2205.10683). Materializing a layer's per-example gradients from the same saved factors is
  one batched matrix product, the flops of the non-private weight gradient, while a ghost norm
  costs T^2 (p + d) more; so a layer is materialized when its per-example gradient (p d
  numbers) is no larger than what book-keeping holds for it anyway (input and output
  gradient, T (p + d)), and ghosted otherwise (long sequences, large vocabularies).
- Book-keeping (Bu et al. 2023, "Differentially private optimization on large model at small
  cost", arXiv 2210.00038): the layer inputs a_t and output gradients g_t of the one backward
  pass are kept, so the clipped sum sum_i c_i G_i = sum_{i,t} (c_i g_it) a_it^T is one more
  matrix product once the clip factors c_i are known, with no second backward pass.
- Other layers with trainable parameters get per-example gradients materialized, cheaply:
  LayerNorm in closed form, any other module (RMSNorm, OPT's learned position embedding, ...)
  by ``torch.func`` vmap of the vector-Jacobian product of that one module, from its saved
  inputs and output gradient.
- The backward pass computes no parameter gradients at all: the trainable parameters are
  switched to ``requires_grad=False`` for the step, and every needed gradient is built from
  the saved factors.

Per-user clipping (``unit: user``). A user's gradient is the sum of its examples' gradients;
its squared norm is the ghost norm of the user's token sequences laid end to end (the same
formula over every pair of the user's tokens), so the user norm is DERIVED, not materialized:
units are packed whole into micro-batches. A user with more rows than ``microbatch_size`` does
not fit one micro-batch; such users go through the materializing ``torch.func`` path of
:class:`~dpaudit.train.engine.DPSGDEngine`, which carries a unit over micro-batches.

Coverage is checked, not assumed: on its first micro-batch the engine watches every torch call
(a ``TorchFunctionMode``) and verifies that each trainable parameter is used only inside the
module that owns it (a weight used outside, e.g. ``hidden @ embed.weight.T`` in a parent's
forward, would get no gradient). It also checks that no saved input was modified in place.
Should either fail, ``train.dp.engine: auto`` falls back to the ``vmap`` engine (a warning);
``engine: ghost`` is an error. Assumed, as by every per-example method: the batch is the first
dimension, examples do not interact in the forward pass (no batch norm), and the modules
recomputed for their per-example gradients (the "other layers") hold no dropout.

Precision: under autocast (bf16 on GPU) the Gram matrices and the book-keeping products run in
the autocast dtype, and products of Grams, norms and the summed gradient in float32.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from dpaudit.devices import to_device
from dpaudit.errors import InputError
from dpaudit.train.engine import (
    DPSGDEngine,
    StepStats,
    autocast_context,
    collate,
    example_losses,
    forward_logits,
)

try:  # GPT-2's linear layer with transposed weights
    from transformers.pytorch_utils import Conv1D
except ImportError:  # pragma: no cover - transformers is a dependency
    Conv1D = None

ENGINES = ("auto", "ghost", "vmap")
log = logging.getLogger(__name__)


class GhostUnsupported(RuntimeError):
    """The model uses a trainable parameter in a way that ghost clipping does not cover."""


def layer_kind(module: nn.Module) -> str | None:
    """``linear``, ``conv1d`` or ``embedding`` for the layers with a ghost norm (their own,
    unmodified forward), ``generic`` for any other module with trainable parameters of its
    own (per-example gradients materialized), None for a module without any."""
    if not any(p.requires_grad for p in module.parameters(recurse=False)):
        return None
    kind = type(module)
    if isinstance(module, nn.Linear) and kind.forward is nn.Linear.forward:
        return "linear"
    if Conv1D is not None and isinstance(module, Conv1D) and kind.forward is Conv1D.forward:
        return "conv1d"
    if (isinstance(module, nn.Embedding) and kind.forward is nn.Embedding.forward and module.max_norm is None
            and not module.sparse and not module.scale_grad_by_freq):
        return "embedding"
    return "generic"


# --------------------------------------------------------------------------- captured uses


@dataclass
class _Use:
    """One call of a hooked module in the forward pass and, after backward, its output gradient."""

    module: nn.Module
    kind: str
    inputs: Any  # layer input (linear, conv1d), token ids (embedding), (args, kwargs) (generic)
    versions: list[int]
    grad: Tensor | None = None


@dataclass
class _Factor:
    """A weight gradient of the form sum_t u_t v_t^T per row: ``u`` is (B, T, R) dense or
    (B, T) row indices of a one-hot (an embedding, ``valid`` masks padding_idx, ``masked``: the
    embedding has one); ``v`` (B, T, C)."""

    u: Tensor
    v: Tensor
    valid: Tensor | None = None
    masked: bool = False

    def rows(self, v: Tensor | None = None, *, width: int | None = None) -> tuple[Tensor, Tensor]:
        """A one-hot factor's row indices and the matching rows of ``v`` (default its own),
        token-flat, zero at padding_idx (which gets no gradient: zeros, not a boolean
        selection, whose data-dependent size would make the host wait for the device); with
        ``width`` the indices are offset by ``width`` per batch row (rows of a (B width, C) matrix)."""
        v = self.v if v is None else v
        index = self.u if width is None else torch.arange(self.u.shape[0], device=self.u.device)[:, None] * width + self.u
        if self.masked:
            v = torch.where(self.valid.unsqueeze(-1), v, 0)
        return index.reshape(-1), v.reshape(-1, v.shape[-1])

    @property
    def onehot(self) -> bool:
        return self.valid is not None


@dataclass
class _Layout:
    """How the rows of a micro-batch form units: ``row_unit`` (B,) and, per unit size n, the
    units of that size and their rows (contiguous)."""

    row_unit: Tensor
    num_units: int
    groups: list[tuple[Tensor, Tensor, int]] = field(default_factory=list)  # (unit ids, row ids, n)
    singletons: bool = True

    @classmethod
    def of(cls, sizes: list[int], device) -> _Layout:
        """The layout of units of ``sizes`` rows, its indices on ``device`` (made there for
        units of one row, else copied without waiting: :func:`~dpaudit.devices.to_device`)."""
        if all(n == 1 for n in sizes):
            rows = torch.arange(len(sizes), device=device)
            return cls(row_unit=rows, num_units=len(sizes), groups=[(rows, rows, 1)])
        row_unit = to_device(torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)), device)
        layout = cls(row_unit=row_unit, num_units=len(sizes), singletons=False)
        starts = [0]
        for n in sizes[:-1]:
            starts.append(starts[-1] + n)
        for n in sorted(set(sizes)):
            units = [k for k, m in enumerate(sizes) if m == n]
            rows = [starts[k] + j for k in units for j in range(n)]
            layout.groups.append((to_device(torch.tensor(units), device), to_device(torch.tensor(rows), device), n))
        return layout

    def to_units(self, rows: Tensor) -> Tensor:
        """Sum per-row tensors (B, ...) into per-unit ones (K, ...)."""
        if self.singletons:
            return rows
        return torch.zeros((self.num_units, *rows.shape[1:]), dtype=rows.dtype, device=rows.device).index_add_(
            0, self.row_unit, rows)

    def sequences(self, x: Tensor, *, stacked: bool = False) -> list[Tensor]:
        """Per unit size, ``x`` (B, T, ...) with each unit's rows laid end to end: (K_n, n T, ...);
        ``stacked``: L layers' tensors (L, B, T, ...), laid out as (L K_n, n T, ...)."""
        if self.singletons:
            return [x.flatten(0, 1) if stacked else x]
        x = x if stacked else x.unsqueeze(0)
        return [x[:, rows].reshape(x.shape[0] * len(units), n * x.shape[2], *x.shape[3:])
                for units, rows, n in self.groups]


def _gram(a: _Factor, b: _Factor, ua: Tensor, ub: Tensor, va: Tensor, vb: Tensor,
          ma: Tensor | None, mb: Tensor | None, dtype: torch.dtype) -> Tensor:
    """sum_{t,s} (u_t . u'_s)(v_t . v'_s) per unit, for two factors already laid out per unit."""
    gv = torch.bmm(va.to(dtype), vb.to(dtype).transpose(1, 2)).float()
    if a.onehot and b.onehot:
        gu = ((ua.unsqueeze(2) == ub.unsqueeze(1)) & ma.unsqueeze(2) & mb.unsqueeze(1)).float()
    elif a.onehot:  # u_t = e_{x_t}: u_t . u'_s = u'_s[x_t]
        index = ua.clamp(0, ub.shape[-1] - 1).unsqueeze(1).expand(-1, ub.shape[1], -1)
        gu = torch.gather(ub.float(), 2, index).transpose(1, 2) * ma.unsqueeze(2)
    elif b.onehot:
        index = ub.clamp(0, ua.shape[-1] - 1).unsqueeze(1).expand(-1, ua.shape[1], -1)
        gu = torch.gather(ua.float(), 2, index) * mb.unsqueeze(1)
    else:
        gu = torch.bmm(ua.to(dtype), ub.to(dtype).transpose(1, 2)).float()
    return (gu * gv).sum((1, 2))


class _ParamUseCheck(TorchFunctionMode):
    """Records every torch call that takes a trainable parameter outside the module owning it."""

    def __init__(self, owners: dict[int, list[nn.Module]], kinds: dict[nn.Module, str], names: dict[int, str]):
        super().__init__()
        self.owners, self.kinds, self.names = owners, kinds, names
        self.stack: list[nn.Module] = []
        self.problems: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if not any(isinstance(x, Tensor) for x in tree_flatten(result)[0]):
            return result  # metadata (dtype, shape, device): no gradient can flow
        for leaf in tree_flatten((args, kwargs))[0]:
            if isinstance(leaf, Tensor) and id(leaf) in self.owners:
                owners = self.owners[id(leaf)]
                top = self.stack[-1] if self.stack else None
                inside = (top in owners and self.kinds[top] != "generic") or any(
                    m in self.stack for m in owners if self.kinds[m] == "generic")
                if not inside and len(self.problems) < 3:
                    self.problems.append(f"{self.names[id(leaf)]} is used by {getattr(func, '__name__', func)} "
                                         f"outside its module")
        return result


# --------------------------------------------------------------------------- the engine


class GhostClippingEngine(DPSGDEngine):
    """DP-SGD with per-unit norms from ghost clipping and the clipped sum from book-keeping
    (Li et al. 2021, arXiv 2110.05679; Bu et al. 2023, arXiv 2210.00038): the same update as
    :class:`~dpaudit.train.engine.DPSGDEngine` (same clipping, noise and divisor), at about the
    cost of a non-private step. ``layers``: ``mixed`` (per layer, the cheaper of ghost norm
    and materialized gradient), ``ghost`` or ``materialize`` (every eligible layer, for tests).
    ``fallback``: on a model the engine does not cover, use the ``vmap`` engine (a warning)
    rather than raise."""

    eager_vmap = False  # the torch.func path is set up only if a step needs it

    def __init__(self, model, *, layers: Literal["mixed", "ghost", "materialize"] = "mixed",
                 fallback: bool = True, **kwargs):
        super().__init__(model, **kwargs)
        if layers not in ("mixed", "ghost", "materialize"):
            raise ValueError(f"layers must be mixed, ghost or materialize, got {layers!r}")
        self.layers = layers
        self.fallback = fallback
        self.use_vmap = False  # set when the model turned out not to be covered
        self._checked = False
        self.kinds: dict[nn.Module, str] = {}
        for module in model.modules():
            kind = layer_kind(module)
            if kind is not None:
                self.kinds[module] = kind
        self._names = {id(p): name for name, p in self.params.items()}
        # every (module, attribute) holding each trainable parameter (tied weights: several)
        self._holders: dict[int, list[tuple[nn.Module, str]]] = {}
        for module in self.kinds:
            for attr, p in module.named_parameters(recurse=False):
                if p.requires_grad:
                    self._holders.setdefault(id(p), []).append((module, attr))
        self._unsupported = next((f"{self._names[pid]} is shared by modules of different kinds"
                                  for pid, holders in self._holders.items()
                                  if len({self.kinds[m] == "generic" for m, _ in holders}) > 1
                                  or len({a for _, a in holders}) > 1), None)

    # -- the step ---------------------------------------------------------------------

    def summed_gradients(self, units):
        if self.use_vmap:
            return super().summed_gradients(units)
        try:
            if self._unsupported:
                raise GhostUnsupported(self._unsupported)
            return self._ghost_summed(units)
        except GhostUnsupported as err:
            if not self.fallback:
                raise InputError(f"train.dp.engine ghost does not cover this model: {err}; "
                                 "use train.dp.engine auto or vmap") from None
            log.warning("ghost clipping does not cover this model (%s): using the vmap engine", err)
            self.use_vmap = True
            return super().summed_gradients(units)

    def _ghost_summed(self, units) -> tuple[dict[str, Tensor], StepStats]:
        stats = StepStats(num_units=len(units))
        total = self.zeros()
        fits = [u for u in range(len(units)) if len(units[u]) <= self.microbatch_size]
        big = [u for u in range(len(units)) if len(units[u]) > self.microbatch_size]
        # pack whole units into micro-batches, longest first (less padding)
        order = sorted(fits, key=lambda u: max(len(s) for s in units[u]), reverse=True)
        chunk: list[int] = []
        rows = 0
        for u in order:
            if rows + len(units[u]) > self.microbatch_size:
                self._microbatch(units, chunk, total, stats)
                chunk, rows = [], 0
            chunk.append(u)
            rows += len(units[u])
        if chunk:
            self._microbatch(units, chunk, total, stats)
        if big:  # users with more rows than a micro-batch: the materializing path
            part, part_stats = self._summed([units[u] for u in big], self.clipped_sum)
            for name in total:
                total[name] += part[name]
            stats.merge(part_stats, big)
        return total, stats

    def _microbatch(self, units, which: list[int], total: dict[str, Tensor], stats: StepStats) -> None:
        """The clipped sum of the step's units ``which`` (whole units, one micro-batch)."""
        chunk = [sorted(units[u], key=len, reverse=True) for u in which]
        sequences = [seq for unit in chunk for seq in unit]
        stats.num_examples += len(sequences)
        batch = collate(sequences, pad_id=self.pad_id, device=self.device)
        self._rows = len(sequences)
        layout = _Layout.of([len(unit) for unit in chunk], self.device)
        uses = self._forward_backward(batch, stats)
        norms2, vectors, materialized, factors, stacked = self._norms(
            uses, layout, tokens=max(len(u) for u in chunk) * batch.input_ids.shape[1])
        del uses  # what the clipped sum needs of them is in the results
        norms = norms2.sqrt()
        clip = self.clip_factors(norms)
        with torch.no_grad():
            if vectors is not None:  # one product for every vector parameter, added to their sums at once
                names, rows = vectors
                summed = (clip @ rows).split([total[n].numel() for n in names])
                torch._foreach_add_([total[n] for n in names], [s.view(total[n].shape) for n, s in zip(names, summed)])
            for name, g in materialized.items():
                total[name] += (clip @ g.reshape(g.shape[0], -1)).view(g.shape[1:])
            row_clip = clip[layout.row_unit]
            for name, parts in factors.items():
                self._add_clipped_factor_sum(parts, row_clip, total[name])
            if stacked:  # their factors are in the autocast dtype (_norms)
                c = self._factor_clip(row_clip).to(self.autocast_dtype or torch.float32)[None, :, None, None]
            for names, u, v in stacked:  # L layers: one product, (L, R, C)
                sums = torch.bmm(u.flatten(1, 2).transpose(1, 2), (v * c).flatten(1, 2))
                torch._foreach_add_([total[n] for n in names], list(sums.float().unbind(0)))
        self.record_norms(norms, stats, which)

    # -- forward and backward with hooks ------------------------------------------------

    def _forward_backward(self, batch, stats: StepStats) -> list[_Use]:
        uses: list[_Use] = []
        handles = []

        def hook(module, args, kwargs, output):
            if not isinstance(output, Tensor):
                raise GhostUnsupported(f"{type(module).__name__} returns {type(output).__name__}, not a tensor")
            kind = self.kinds[module]
            if kind == "generic":
                inputs = (tuple(a.detach() if isinstance(a, Tensor) else a for a in args),
                          {k: v.detach() if isinstance(v, Tensor) else v for k, v in kwargs.items()})
                versions = [t._version for t in tree_flatten(inputs)[0] if isinstance(t, Tensor)]
            else:
                x = args[0] if args else kwargs["input"]
                inputs, versions = x.detach(), [x._version]
            use = _Use(module=module, kind=kind, inputs=inputs, versions=versions)
            uses.append(use)
            if not output.requires_grad:  # nothing upstream trains: the gradient starts here
                output = output.detach().requires_grad_()

            def keep(grad, use=use):
                use.grad = grad if use.grad is None else use.grad + grad

            output.register_hook(keep)
            return output

        frozen = list(self.params.values())
        check = None
        if not self._checked:
            owners = {pid: [m for m, _ in holders] for pid, holders in self._holders.items()}
            check = _ParamUseCheck(owners, self.kinds, self._names)

            def enter(module, args) -> None:
                check.stack.append(module)

            def leave(module, args, output) -> None:
                check.stack.pop()

            for module in self.model.modules():
                handles.append(module.register_forward_pre_hook(enter))
                handles.append(module.register_forward_hook(leave))
        try:
            for module in self.kinds:
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
            for p in frozen:
                p.requires_grad_(False)
            with autocast_context(self.device, self.autocast_dtype):
                if check is not None:
                    with check:
                        logits = forward_logits(self.model, batch)
                    if check.problems:
                        raise GhostUnsupported("; ".join(check.problems))
                    self._checked = True
                else:
                    logits = forward_logits(self.model, batch)
                losses = example_losses(logits, batch.labels)
            del logits
            losses.sum().backward()
        finally:
            for p in frozen:
                p.requires_grad_(True)
            for handle in handles:
                handle.remove()
        stats.add_losses(losses.detach())
        for use in uses:
            now = [t._version for t in tree_flatten(use.inputs)[0] if isinstance(t, Tensor)] \
                if use.kind == "generic" else [use.inputs._version]
            if now != use.versions:
                raise GhostUnsupported(f"an input of {type(use.module).__name__} is modified in place after use")
        return uses

    # -- norms ------------------------------------------------------------------------

    def _factors(self, use: _Use, attr: str) -> _Factor | Tensor:
        """The weight gradient of one use as factors, or the bias gradient per row (B, p)."""
        g = self._by_row(use.grad)
        if attr == "bias":
            return g.sum(1, dtype=torch.float32)
        if use.kind == "embedding":
            x = use.inputs.reshape(g.shape[0], -1)
            pad = use.module.padding_idx
            valid = torch.ones_like(x, dtype=torch.bool) if pad is None else x != pad
            return _Factor(u=x, v=g, valid=valid, masked=pad is not None)
        a = self._by_row(use.inputs)
        return _Factor(u=g, v=a) if use.kind == "linear" else _Factor(u=a, v=g)

    def _by_row(self, x: Tensor) -> Tensor:
        """(B, T, p) from a layer's (B, ..., p) or token-flattened (B T, p) tensor (batch first)."""
        if x.shape[0] % self._rows:
            raise GhostUnsupported(f"a layer sees a leading dimension {x.shape[0]} that is not a multiple of "
                                   f"the {self._rows} rows of the batch")
        return x.reshape(self._rows, -1, x.shape[-1])

    def _materialize(self, parts: list[_Factor], shape: torch.Size) -> Tensor:
        """Per-row gradients (B, R, C), summed over the uses ``parts`` (in place)."""
        dtype = self.autocast_dtype or torch.float32
        rows, width = shape
        dense = [f for f in parts if not f.onehot]
        out = None
        for f in dense:
            u, v = f.u.to(dtype).transpose(1, 2), f.v.to(dtype)
            out = torch.bmm(u, v).float() if out is None else out.baddbmm_(u.float(), v.float())
        for f in parts:
            if f.onehot:
                batch = f.u.shape[0]
                if out is None:
                    out = torch.zeros((batch, rows, width), dtype=torch.float32, device=f.v.device)
                index, values = f.rows(width=rows)
                out.view(batch * rows, width).index_add_(0, index, values.float())
        return out

    def _norms(self, uses: list[_Use], layout: _Layout, *, tokens: int):
        """Squared per-unit norms (K,); the vector parameters (biases, normalization gains, a
        generic module's own) as their names and their per-unit gradients side by side, (K,
        their numels summed), or None; the per-unit gradients of the materialized weights (K, R,
        C); the factors of the ghosted ones; and, where :meth:`_stacks`, those of the ghosted
        layers of one dense use each, stacked by shape: (names, u, v). The vectors' norms come
        from one reduction over all of them, and their clipped sum from one product (few
        operations whatever the depth: on an accelerator each is a kernel launch)."""
        dtype = self.autocast_dtype or torch.float32
        norms2 = torch.zeros(layout.num_units, dtype=torch.float32, device=self.device)
        vectors: dict[str, Tensor] = {}
        materialized: dict[str, Tensor] = {}
        ghosted: dict[str, list[_Factor]] = {}
        # layers of one use of dense factors, by their shapes: their factors stacked (names, u, v)
        stack = self._stacks()
        alike: dict[tuple, list[tuple[str, _Factor]]] = {}
        stacked: list[tuple[list[str], Tensor, Tensor]] = []
        grams: list[list[Tensor]] = [[] for _ in layout.groups]  # the ghosted layers' squared norms, per unit size
        by_module: dict[nn.Module, list[_Use]] = {}
        for use in uses:
            if use.grad is None:  # the output did not reach the loss: zero gradient
                continue
            by_module.setdefault(use.module, []).append(use)

        def add(into: dict[str, Tensor], name: str, rows: Tensor) -> None:
            units = layout.to_units(rows)
            into[name] = units if name not in into else into[name] + units

        with torch.no_grad():
            for module, module_uses in by_module.items():
                if self.kinds[module] == "generic":
                    for use in module_uses:
                        for name, rows in self._generic_rows(use).items():
                            add(vectors, name, rows.flatten(1))
            for pid, holders in self._holders.items():
                if self.kinds[holders[0][0]] == "generic":
                    continue  # done above (a generic module's own parameters)
                name = self._names[pid]
                parts = [self._factors(use, attr) for m, attr in holders for use in by_module.get(m, [])]
                if not parts:
                    continue
                if holders[0][1] == "bias":
                    add(vectors, name, sum(parts[1:], parts[0]).flatten(1))
                    continue
                shape = self.params[name].shape
                # mixed: materialize when the per-example gradient is no larger than what book-keeping
                # holds for the layer anyway (its input and output gradient, T (R + C) per example)
                held = sum(tokens * (1 if f.onehot else f.u.shape[-1]) + tokens * f.v.shape[-1] for f in parts)
                ghost = self.layers == "ghost" or (self.layers == "mixed" and shape[0] * shape[1] > held)
                if not ghost:
                    add(materialized, name, self._materialize(parts, shape))
                    continue
                if stack and len(parts) == 1 and not parts[0].onehot:  # with the layers of its shapes, below
                    f = parts[0]
                    alike.setdefault((f.u.shape, f.v.shape, f.u.dtype, f.v.dtype), []).append((name, f))
                    continue
                ghosted[name] = parts
                laid = [(layout.sequences(f.u), layout.sequences(f.v),
                         layout.sequences(f.valid) if f.onehot else [None] * len(layout.groups)) for f in parts]
                for i, a in enumerate(parts):
                    for j in range(i, len(parts)):
                        for group in range(len(layout.groups)):
                            ua, va, ma = (x[group] for x in laid[i])
                            ub, vb, mb = (x[group] for x in laid[j])
                            value = _gram(a, parts[j], ua, ub, va, vb, ma, mb, dtype)
                            grams[group].append(value if i == j else 2 * value)
            for bucket in alike.values():  # one product per factor and unit size for all layers of one shape
                names, layer_factors = zip(*bucket)
                u = torch.stack([f.u for f in layer_factors]).to(dtype)
                v = torch.stack([f.v for f in layer_factors]).to(dtype)
                for group, (lu, lv) in enumerate(zip(layout.sequences(u, stacked=True),
                                                     layout.sequences(v, stacked=True))):
                    value = torch.bmm(lu, lu.transpose(1, 2)).float() * torch.bmm(lv, lv.transpose(1, 2)).float()
                    grams[group].append(value.sum((1, 2)).view(len(names), -1).sum(0))
                stacked.append((list(names), u, v))
            for (units, _, _), values in zip(layout.groups, grams):  # one addition per unit size
                if values:
                    norms2.index_add_(0, units, torch.stack(values).sum(0))
            laid_out = (list(vectors), torch.cat(list(vectors.values()), 1)) if vectors else None
            if laid_out is not None:
                norms2 += laid_out[1].square().sum(1)
            for g in materialized.values():
                norms2 += torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).square()
        return norms2, laid_out, materialized, ghosted, stacked

    def _generic_rows(self, use: _Use) -> dict[str, Tensor]:
        """Per-row gradients of a generic module's own parameters: vmap over the rows of the
        vector-Jacobian product of the module alone, at its saved inputs."""
        module = use.module
        params = {n: p.detach() for n, p in module.named_parameters(recurse=False) if id(p) in self._names}
        args, kwargs = use.inputs
        if type(module).forward is nn.LayerNorm.forward and len(module.normalized_shape) == 1 and args:
            # closed form: d/dweight = sum_t g_t * xhat_t, d/dbias = sum_t g_t
            g = self._by_row(use.grad).float()
            rows = {"bias": g.sum(1)}
            if "weight" in params:
                xhat = nn.functional.layer_norm(self._by_row(args[0]).float(), module.normalized_shape, eps=module.eps)
                rows["weight"] = (g * xhat).sum(1)
            return {self._names[id(p)]: rows[n] for n, p in module.named_parameters(recurse=False) if n in params}
        batch = use.grad.shape[0]  # the rows, or the rows' tokens for a token-flattened input
        if batch % self._rows:
            raise GhostUnsupported(f"{type(module).__name__} sees a leading dimension {batch} that is not a "
                                   f"multiple of the {self._rows} rows of the batch")

        def batched(x):
            return isinstance(x, Tensor) and x.dim() > 0 and x.shape[0] == batch

        arg_dims = tuple(0 if batched(a) else None for a in args)
        kw_keys = [k for k, v in kwargs.items() if batched(v)]
        fixed = {k: v for k, v in kwargs.items() if k not in kw_keys}

        def one(row_args, row_kwargs, grad):
            def f(p):
                full_args = tuple(a.unsqueeze(0) if d == 0 else a for a, d in zip(row_args, arg_dims))
                return functional_call(module, p, full_args, {**fixed, **{k: v.unsqueeze(0) for k, v in row_kwargs.items()}})

            out, pullback = vjp(f, params)
            return pullback(grad.unsqueeze(0).to(out.dtype))[0]

        with torch.enable_grad(), autocast_context(self.device, self.autocast_dtype):
            grads = vmap(one, in_dims=(arg_dims, 0, 0), randomness="different")(
                args, {k: kwargs[k] for k in kw_keys}, use.grad)
        return {self._names[id(p)]: grads[n].float().reshape(self._rows, -1, *p.shape).sum(1)
                for n, p in module.named_parameters(recurse=False) if n in grads}

    def _stacks(self) -> bool:
        """Whether the ghosted layers of one shape share their Gram products and their clipped
        sum's product, their factors stacked: on an accelerator, where every product is a
        kernel launch whatever its size (``benchmarks/profile_dp_step.py --launches``); not on
        a CPU, where the stacked copies and the sums written apart from the step's cost more
        memory traffic than the calls they save."""
        return self.device.type != "cpu"

    # -- the clipped sum ------------------------------------------------------------------

    def _factor_clip(self, row_clip: Tensor) -> Tensor:
        """The clip factors for a sum of ghosted factors. In low precision the norm came from
        Gram matrices and the sum comes from another product, both rounded, and c_i is rounded
        too (up to 2^-8 up in bfloat16): (1 - 2^-7) c_i keeps a unit's clipped gradient within
        C (clipping below C is sound; the two products disagree by about 3e-4)."""
        return row_clip if (self.autocast_dtype or torch.float32) == torch.float32 else row_clip * (1 - 2**-7)

    def _add_clipped_factor_sum(self, parts: list[_Factor], row_clip: Tensor, out: Tensor) -> None:
        """Add sum_i c_i sum_t u_it v_it^T over every use of a ghosted parameter to ``out``
        (book-keeping): one product over the micro-batch's tokens per use."""
        dtype = self.autocast_dtype or torch.float32
        row_clip = self._factor_clip(row_clip)
        for f in parts:
            v = f.v.to(dtype) * row_clip.to(dtype)[:, None, None]
            if f.onehot:
                index, values = f.rows(v)
                out.index_add_(0, index, values.float())
                continue
            u, v = f.u.to(dtype).flatten(0, 1), v.flatten(0, 1)
            if u.dtype == out.dtype:
                out.addmm_(u.T, v)
            else:
                out += (u.T @ v).float()


# the methods that compute per-unit gradients and their clipped sum: an engine that overrides
# none of them changes only what comes after (clip factors, noise, divisor, the step's loop)
GRADIENT_PATH = ("summed_gradients", "_summed", "per_example_gradients", "clipped_sum")


def choose_engine(engine_class: type, choice: str) -> tuple[type, dict[str, Any]]:
    """The engine class for ``train.dp.engine`` and its extra keyword arguments: ``auto``
    (ghost clipping, falling back to vmap on a model it does not cover), ``ghost`` (ghost
    clipping or an error) or ``vmap`` (per-example gradients from ``torch.func``). A subclass
    of :class:`~dpaudit.train.engine.DPSGDEngine` that overrides none of
    :data:`GRADIENT_PATH` (it changes the clip factors, the noise, the divisor or the step's
    loop, as most faulty trainers do) runs on ghost clipping too, its overrides first; one that
    computes the gradients its own way, or another library's engine (Opacus), stays as it is."""
    if choice not in ENGINES:
        raise InputError(f"train.dp.engine must be one of {', '.join(ENGINES)}, got {choice!r}")
    if (choice == "vmap" or not issubclass(engine_class, DPSGDEngine)
            or any(getattr(engine_class, name) is not getattr(DPSGDEngine, name) for name in GRADIENT_PATH)):
        return engine_class, {}
    return _on_ghost(engine_class), {"fallback": choice == "auto"}


@functools.cache
def _on_ghost(engine_class: type) -> type:
    if engine_class is DPSGDEngine:
        return GhostClippingEngine
    return type(engine_class.__name__, (engine_class, GhostClippingEngine),
                {"__module__": engine_class.__module__, "__doc__": engine_class.__doc__})
