"""The canaries of the white-box step audit (``dpaudit validate --step``), crafted for the model.

Why several. A DP-SGD step must clip each example's whole gradient, but per-sample machinery
computes that norm layer by layer, with its own code for each kind of layer (Opacus has one
for ``nn.Linear``, one for embeddings, one for layer norms, ...; ghost clipping likewise). A
mistake in the code of one kind shows only on a canary with enough gradient in that kind:

- a kind left out of clipping (its raw per-example gradient summed) shows on any canary whose
  gradient in that kind has norm >= 10 C: the update projected on the canary's gradient
  restricted to that kind moves by that norm instead of at most C;
- a kind whose per-example norm is computed wrongly (at a times its value; a = 0 when it is
  left out of the norm but clipped with the rest) lets the canary through with norm
  C / sqrt(1 - f (1 - a^2)), f the kind's share of the canary's squared gradient norm: a large
  excess needs a canary whose gradient lies almost wholly in that kind (at half the norm, 2 C
  at f = 1 but 1.26 C at f = 1/2).

So there is one canary per kind, each the same crafted row (tokens the audited batch does not
use) at a starting model of its own: a perturbation of the model under audit that makes that
kind dominate the row's gradient. Perturbing the parameters is fair: a step that is the
Gaussian mechanism with sensitivity C is (1/S)-GDP at any parameters, and each canary is its
own pair of neighbouring batches (D, D + canary) with its own runs (the validator chooses the
canary together with the statistic on half of the runs, see
:func:`dpaudit.audit.two_sample.mu_bound_over_pairs`). Crafting the input alone cannot do it:
the row's gradient in the embedding, the biases and the residual stream are tied to one another
whatever the tokens. The perturbations (found by measuring the kinds' shares on tiny GPT-2,
Llama, OPT and GPT-NeoX models, tied and untied; each share is at least 0.97 there, and is
reported for the model audited):

=========  =============================================  ============================================
canary     starting model                                 why its kind dominates
=========  =============================================  ============================================
spread     as given                                       none is favoured: every kind has a share
embedding  embeddings x 1e-3, other norms' gains x 100    a tiny residual stream: the first norm
                                                          layer's 1 / std amplifies the gradient of
                                                          its input, the embedding rows
weights    embeddings x 100, other norms' gains x 100,    large inputs to the attention and MLP
           an untied output layer x 10                    layers: their weight gradients (output
                                                          gradient x input) grow, the rest shrinks
output     embeddings x 1000 (untied output layer only)   a huge residual stream: every gradient
                                                          before the final norm shrinks, the output
                                                          layer's stays
bias       other norms (gain and bias) x 0; biases set    every layer input is 0, so no weight or
           to 0; layers fed by a norm x 0, the other      norm gets a gradient; a bias gets its
           linear layers x 100; embeddings x 1e-2         output's gradient, amplified by the x 100
                                                          layer after it
norm       the final norm's gain and bias set to 0        nothing before it gets a gradient and the
                                                          output layer's input is 0: the gradient
                                                          lies in the final norm alone
=========  =============================================  ============================================

"Final norm" is the last norm layer of the forward pass, "other norms" the rest; "layers fed by
a norm" are the linear layers (``nn.Linear``, GPT-2's ``Conv1D``) whose input is a norm layer's
output (query, key, value, the MLP's first layer), found by hooks on one forward pass. A knob
then raises the gradient until its kind's part has norm >= ``NORM_FACTOR`` x C (the whole
gradient for ``spread``): the final norm's gain (the gradient of everything before it and of the
output layer grows about linearly with it), for ``norm`` the output layer (the final norm's
gradient grows linearly with it). A canary is skipped, with the reason, when the model lacks its
kind or the knob cannot reach the norm.

The statistics of a canary (:class:`Statistics`): the update projected on -g / ||g||, on g
restricted to each kind present (the embeddings, the attention weights, the MLP weights, the
output layer, the biases, the norm layers), and to each tensor.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from dpaudit.train.engine import collate, example_losses, forward_logits, trainable_parameters

try:  # GPT-2's linear layer with transposed weights
    from transformers.pytorch_utils import Conv1D
except ImportError:  # pragma: no cover - transformers is a dependency
    Conv1D = nn.Linear

NORM_FACTOR = 10.0  # the canary's gradient (its kind's part) has norm at least this many times C
KNOB_STEPS = 20
LINEAR = (nn.Linear, Conv1D)
KIND_LABELS = {"embedding": "the embeddings", "attention": "the attention weights", "mlp": "the MLP weights",
               "output": "the output layer", "bias": "the biases", "norm": "the norm layers",
               "other": "the other parameters"}

__all__ = ["KIND_LABELS", "NORM_FACTOR", "RECIPES", "Canary", "Recipe", "Statistics", "canary_gradient",
           "design_canaries", "iter_canaries", "parameter_kinds"]


@dataclass(frozen=True)
class Recipe:
    """One canary: multiply the parameters of each role (see :func:`_roles`) by ``scale[role]``,
    then the ``knob`` role until the gradient's part in ``kinds`` (all of it when empty) has
    norm >= NORM_FACTOR x C."""

    name: str
    kinds: tuple[str, ...]
    scale: dict[str, float]
    knob: str
    description: str


RECIPES = (
    Recipe("spread", (), {}, "final_norm.weight", "the model as given, its final norm's gain raised"),
    Recipe("embedding", ("embedding",), {"embedding": 1e-3, "norm.weight": 100.0}, "final_norm.weight",
           "gradient mostly in the embeddings"),
    Recipe("weights", ("attention", "mlp"), {"embedding": 100.0, "norm.weight": 100.0, "output": 10.0},
           "final_norm.weight",
           "gradient mostly in the attention and MLP weights"),
    Recipe("output", ("output",), {"embedding": 1e3}, "final_norm.weight", "gradient mostly in the output layer"),
    Recipe("bias", ("bias",), {"norm.weight": 0.0, "norm.bias": 0.0, "bias": 0.0, "reader": 0.0, "writer": 100.0,
                               "embedding": 1e-2}, "final_norm.weight", "gradient mostly in the biases"),
    Recipe("norm", ("norm",), {"final_norm.weight": 0.0, "final_norm.bias": 0.0}, "output.weight",
           "gradient in the final norm layer alone"),
)


# --------------------------------------------------------------------------- kinds and roles


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower() and any(True for _ in module.parameters(recurse=False))


def _owners(model: nn.Module) -> dict[str, tuple[str, nn.Module, str]]:
    """Each trainable parameter (by its name in :func:`trainable_parameters`) -> (module name,
    module, attribute); a tied parameter belongs to the embedding that holds it."""
    names = {id(p): n for n, p in trainable_parameters(model).items()}
    owners: dict[str, tuple[str, nn.Module, str]] = {}
    for first_pass in (True, False):
        for module_name, module in model.named_modules():
            if first_pass != isinstance(module, nn.Embedding):
                continue
            for attr, p in module.named_parameters(recurse=False):
                name = names.get(id(p))
                if name is not None and name not in owners:
                    owners[name] = (module_name, module, attr)
    return owners


def parameter_kinds(model: nn.Module) -> dict[str, str]:
    """The kind of each trainable parameter: ``embedding`` (``nn.Embedding``, with a tied output
    layer), ``output`` (an untied output layer), ``bias`` (of a linear layer), ``attention`` or
    ``mlp`` (a linear layer's weight, by its module's name), ``norm`` (a norm layer's gain and
    bias), ``other``."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kinds = {}
    for name, (module_name, module, attr) in _owners(model).items():
        if isinstance(module, nn.Embedding):
            kinds[name] = "embedding"
        elif module is head:
            kinds[name] = "output"
        elif isinstance(module, LINEAR):
            parts = module_name.lower().split(".")
            kinds[name] = "bias" if attr == "bias" else (
                "attention" if any("attn" in s or "attention" in s for s in parts) else "mlp")
        elif _is_norm(module):
            kinds[name] = "norm"
        else:
            kinds[name] = "other"
    return kinds


def _roles(model: nn.Module, row: Tensor) -> dict[str, list[str]]:
    """Trainable parameter names by the role a recipe scales: ``embedding``, ``output.weight``
    (the output layer's weight, tied or not), ``final_norm.weight`` / ``.bias`` (the last norm
    layer of a forward pass of ``row``), ``norm.weight`` / ``.bias`` (the other norm layers),
    ``reader`` (weights of linear layers whose input is a norm layer's output), ``writer`` (the
    other linear layers' weights), ``bias`` (linear layers' biases); the output layer is none of
    the last three."""
    order, outputs, readers = [], {}, set()

    def after_norm(module, args, output):
        order.append(module)
        outputs[id(output)] = output  # kept alive: ids stay unique during the pass

    def before_linear(module, args):
        if args and id(args[0]) in outputs:
            readers.add(module)

    hooks = [m.register_forward_hook(after_norm) for m in model.modules() if _is_norm(m)]
    hooks += [m.register_forward_pre_hook(before_linear) for m in model.modules() if isinstance(m, LINEAR)]
    try:
        with torch.no_grad():
            forward_logits(model, collate([row], pad_id=0, device=row.device))
    finally:
        for h in hooks:
            h.remove()
    head = model.get_output_embeddings()
    roles: dict[str, list[str]] = {}
    for name, (_, module, attr) in _owners(model).items():
        if isinstance(module, nn.Embedding):
            role = "embedding"
        elif module is head:
            role = "output"
        elif isinstance(module, LINEAR):
            role = "bias" if attr == "bias" else ("reader" if module in readers else "writer")
        elif _is_norm(module):
            role = f"{'final_norm' if order and module is order[-1] else 'norm'}.{attr}"
        else:
            continue
        roles.setdefault(role, []).append(name)
    if head is not None and getattr(head, "weight", None) is not None:
        by_id = {id(p): n for n, p in trainable_parameters(model).items()}
        if id(head.weight) in by_id:
            roles["output.weight"] = [by_id[id(head.weight)]]
    return roles


# --------------------------------------------------------------------------- gradients and statistics


def canary_gradient(model: nn.Module, row: Tensor) -> dict[str, Tensor]:
    """Gradient of the row's own loss (mean NLL of its predicted tokens, as the engines compute
    it) at ``model``, by trainable parameter name, in float32."""
    batch = collate([row], pad_id=0, device=row.device)
    params = trainable_parameters(model)
    model.zero_grad(set_to_none=True)
    example_losses(forward_logits(model, batch), batch.labels).sum().backward()
    grads = {name: (p.grad.detach().clone().float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32))
             for name, p in params.items()}
    model.zero_grad(set_to_none=True)
    return grads


def _squared_by_kind(grads: dict[str, Tensor], kinds: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, g in grads.items():
        out[kinds[name]] = out.get(kinds[name], 0.0) + float(g.double().pow(2).sum())
    return out


class Statistics:
    """The candidate statistics of one canary, gradient g: the projection of an update on
    -g / ||g|| (``all parameters``), on -g restricted to each kind with a gradient (labelled
    as :data:`KIND_LABELS`), and to each tensor with a gradient (its name). Computed from one
    dot product per tensor: no dense direction is ever built."""

    def __init__(self, grads: dict[str, Tensor], kinds: dict[str, str]):
        self.names, self._grads = list(grads), grads
        squares = np.array([float(grads[n].double().pow(2).sum()) for n in self.names])
        groups = [("all parameters", [True] * len(self.names))]
        for kind, label in KIND_LABELS.items():
            groups.append((label, [kinds[n] == kind for n in self.names]))
        groups += [(n, [m == n for m in self.names]) for n in self.names]
        self.labels, rows = [], []
        for label, mask in groups:
            mask = np.array(mask, dtype=bool)
            total = squares[mask].sum()
            if total > 0:
                self.labels.append(label)
                rows.append(np.where(mask, 1.0 / np.sqrt(total), 0.0))
        self._weights = np.stack(rows)

    def __len__(self) -> int:
        return len(self.labels)

    def project(self, update: dict[str, Tensor]) -> np.ndarray:
        """The statistics of ``update`` (by parameter name), in float64."""
        dots = np.array([-float(torch.dot(update[n].reshape(-1).double(), self._grads[n].reshape(-1).double()))
                         for n in self.names])
        return self._weights @ dots


# --------------------------------------------------------------------------- the canaries


@dataclass
class Canary:
    """One canary: its recipe, its starting model, the row's gradient there and its statistics."""

    recipe: Recipe
    model: nn.Module
    grads: dict[str, Tensor]
    statistics: Statistics
    norm: float
    kind_norm: float
    shares: dict[str, float]
    knob: float

    @property
    def name(self) -> str:
        return self.recipe.name

    def summary(self) -> dict:
        return {"name": self.name, "description": self.recipe.description, "kinds": list(self.recipe.kinds),
                "gradient_norm": self.norm, "kind_gradient_norm": self.kind_norm, "shares": self.shares,
                "knob": {"role": self.recipe.knob, "factor": self.knob}, "num_statistics": len(self.statistics)}


def iter_canaries(model: nn.Module, row: Tensor, *, max_grad_norm: float,
                  names: Sequence[str] | None = None) -> Iterator[tuple[str, Canary | str]]:
    """``(name, canary)`` for each recipe of :data:`RECIPES` (those in ``names``, default all)
    for ``model`` (left unchanged) and the crafted ``row`` (1-D token ids), or ``(name, why
    not)``; one at a time, so that only one perturbed copy of the model need live at once."""
    unknown = sorted(set(names or ()) - {r.name for r in RECIPES})
    if unknown:
        raise ValueError(f"unknown canaries {unknown}: expected some of {[r.name for r in RECIPES]}")
    kinds, roles = parameter_kinds(model), _roles(model, row)
    for recipe in RECIPES:
        if names is None or recipe.name in names:
            reason = _missing(recipe, kinds, roles)
            yield recipe.name, reason or _make(recipe, model, row, kinds, roles, NORM_FACTOR * max_grad_norm)


def design_canaries(model: nn.Module, row: Tensor, *, max_grad_norm: float,
                    names: Sequence[str] | None = None) -> tuple[list[Canary], dict[str, str]]:
    """:func:`iter_canaries` as a list of the canaries and the skipped ones with the reason."""
    made = list(iter_canaries(model, row, max_grad_norm=max_grad_norm, names=names))
    return ([k for _, k in made if isinstance(k, Canary)],
            {name: k for name, k in made if isinstance(k, str)})


def _missing(recipe: Recipe, kinds: dict[str, str], roles: dict[str, list[str]]) -> str | None:
    if recipe.name == "output" and "output" not in kinds.values():
        return "the model has no output layer of its own (tied to the input embedding)"
    if recipe.kinds and not any(k in recipe.kinds for k in kinds.values()):
        return f"the model has no {' or '.join(KIND_LABELS[k].removeprefix('the ') for k in recipe.kinds)}"
    if not roles.get(recipe.knob):
        return f"the model has no {recipe.knob.replace('_', ' ').replace('.weight', ' weight')} to raise the gradient"
    return None


def _make(recipe: Recipe, model: nn.Module, row: Tensor, kinds: dict[str, str], roles: dict[str, list[str]],
          target: float) -> Canary | str:
    """The canary of ``recipe``, or why it could not be made."""
    m = copy.deepcopy(model)
    params = dict(m.named_parameters())
    with torch.no_grad():
        for role, factor in recipe.scale.items():
            for n in roles.get(role, ()):
                params[n].mul_(factor)

    def part(grads):
        squares = _squared_by_kind(grads, kinds)
        return float(np.sqrt(sum(v for k, v in squares.items() if not recipe.kinds or k in recipe.kinds)))

    grads, knob = canary_gradient(m, row), 1.0
    for _ in range(KNOB_STEPS):  # the gradient grows about linearly with the knob
        norm = part(grads)
        if not np.isfinite(norm) or norm >= target:
            break
        factor = min(1e3, 1.2 * target / max(norm, 1e-12))
        with torch.no_grad():
            for n in roles[recipe.knob]:
                params[n].mul_(factor)
        knob *= factor
        grads = canary_gradient(m, row)
    norm = part(grads)
    if not np.isfinite(norm) or not all(bool(torch.isfinite(g).all()) for g in grads.values()):
        return "its gradient is not finite"
    if norm < target:
        return f"could not raise its gradient to {target:g} (NORM_FACTOR x C): reached {norm:.3g}"
    squares = _squared_by_kind(grads, kinds)
    total = sum(squares.values())
    return Canary(recipe=recipe, model=m, grads=grads, statistics=Statistics(grads, kinds), norm=float(np.sqrt(total)),
                  kind_norm=norm, shares={k: v / total for k, v in sorted(squares.items())}, knob=knob)
