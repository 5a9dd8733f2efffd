"""Faults injected into the objects Opacus's ``make_private`` returns, for the step audit's
tests. NEVER use them to train. Each is a step plug-in of
:func:`dpaudit.adapters.opacus.make_step` whose ``tamper`` changes one object before the step:

=============================  ================================================================
``tenth_noise_MODE``           the optimizer's ``noise_multiplier`` divided by 10 after
                               ``make_private`` (the accountant still sees the claimed one)
``half_embedding_norm_ghost``  ghost clipping's per-sample gradient norm of every
                               ``nn.Embedding`` halved: those layers' share of a gradient
                               counts half when the clipping factor is computed
``half_linear_norm_ghost``     the same for ``nn.Linear``
``module_bound_ghost``         ghost clipping's bound kept in the module (which clips) set to
                               10 C while the optimizer (which adds noise) keeps C
=============================  ================================================================
"""

from __future__ import annotations

from torch import nn

from dpaudit.adapters.opacus import Private, make_step


def _tenth_noise(private: Private) -> None:
    private.optimizer.noise_multiplier /= 10


def _half_norm(kind: type[nn.Module]):
    def tamper(private: Private) -> None:
        samplers = dict(type(private.module).NORM_SAMPLERS)
        norm_of = samplers[kind]
        samplers[kind] = lambda layer, activations, backprops: {
            p: n / 2 for p, n in norm_of(layer, activations, backprops).items()}
        private.module.NORM_SAMPLERS = samplers  # this module only: the class's registry is untouched

    return tamper


def _module_bound(private: Private) -> None:
    private.module.max_grad_norm = 10 * private.optimizer.max_grad_norm


def _named(mode: str, tamper, name: str):
    return make_step(mode, "flat", tamper=tamper, name=name)


tenth_noise_hooks = _named("hooks", _tenth_noise, "tenth_noise_hooks")
tenth_noise_functorch = _named("functorch", _tenth_noise, "tenth_noise_functorch")
tenth_noise_ghost = _named("ghost", _tenth_noise, "tenth_noise_ghost")
half_embedding_norm_ghost = _named("ghost", _half_norm(nn.Embedding), "half_embedding_norm_ghost")
half_linear_norm_ghost = _named("ghost", _half_norm(nn.Linear), "half_linear_norm_ghost")
module_bound_ghost = _named("ghost", _module_bound, "module_bound_ghost")

FAULTS = {f.__name__: f for f in (tenth_noise_hooks, tenth_noise_functorch, tenth_noise_ghost,
                                  half_embedding_norm_ghost, half_linear_norm_ghost, module_bound_ghost)}


def _half_conv1d_norm(private: Private) -> None:
    from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
    from transformers.pytorch_utils import Conv1D

    def halved(layer, activations, backprops):
        return {p: g / 2 for p, g in ft_compute_per_sample_gradient(layer, activations, backprops).items()}

    private.module.GRAD_SAMPLERS = {**type(private.module).GRAD_SAMPLERS, Conv1D: halved}


half_conv1d_norm_ghost = _named("ghost", _half_conv1d_norm, "half_conv1d_norm_ghost")
FAULTS["half_conv1d_norm_ghost"] = half_conv1d_norm_ghost
