"""Faults injected into the objects Opacus's ``make_private`` returns, for the audits' tests.
NEVER use them to train. Each is a step plug-in of :func:`dpaudit.adapters.opacus.make_step`
whose ``tamper`` changes one object before the step:

=============================  ================================================================
``tenth_noise_MODE``           the optimizer's ``noise_multiplier`` divided by 10 after
                               ``make_private`` (the accountant still sees the claimed one)
``half_linear_norm_ghost``     ghost clipping's per-sample gradient norm of every ``nn.Linear``
                               halved: those layers' share of a gradient counts half when the
                               clipping factor is computed
``half_embedding_norm_ghost``  the same for ``nn.Embedding``
``half_conv1d_norm_ghost``     the same for GPT-2's ``Conv1D``, whose norm ghost clipping takes
                               of the per-sample gradients of Opacus's functorch grad sampler
``module_bound_ghost``         ghost clipping's bound kept in the module (which clips) set to
                               10 C while the optimizer (which adds noise) keeps C
=============================  ================================================================

From the repository root they are ``tests.adapters.opacus_faults:NAME`` for ``dpaudit validate
--step`` (:data:`FAULTS` by name). ``train_half_linear_norm_ghost`` is the ``nn.Linear`` fault
in a trainer plug-in of :func:`dpaudit.adapters.opacus.make_trainer`, for ``dpaudit validate
--trainer``: the black-box audit of the model it trains.
"""

from __future__ import annotations

from torch import nn

from dpaudit.adapters.opacus import Private, make_step, make_trainer


def _tenth_noise(private: Private) -> None:
    private.optimizer.noise_multiplier /= 10


def _halved(sampler):
    return lambda layer, activations, backprops: {
        p: x / 2 for p, x in sampler(layer, activations, backprops).items()}


def _half_norm(kind: type[nn.Module]):
    def tamper(private: Private) -> None:  # this module only: the class's registry is untouched
        samplers = dict(type(private.module).NORM_SAMPLERS)
        private.module.NORM_SAMPLERS = {**samplers, kind: _halved(samplers[kind])}

    return tamper


def _half_conv1d_norm(private: Private) -> None:
    from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
    from transformers.pytorch_utils import Conv1D

    private.module.GRAD_SAMPLERS = {**type(private.module).GRAD_SAMPLERS,
                                    Conv1D: _halved(ft_compute_per_sample_gradient)}


def _module_bound(private: Private) -> None:
    private.module.max_grad_norm = 10 * private.optimizer.max_grad_norm


FAULTS = {name: make_step(mode, "flat", tamper=tamper, name=name) for name, mode, tamper in (
    ("tenth_noise_hooks", "hooks", _tenth_noise),
    ("tenth_noise_functorch", "functorch", _tenth_noise),
    ("tenth_noise_ghost", "ghost", _tenth_noise),
    ("half_linear_norm_ghost", "ghost", _half_norm(nn.Linear)),
    ("half_embedding_norm_ghost", "ghost", _half_norm(nn.Embedding)),
    ("half_conv1d_norm_ghost", "ghost", _half_conv1d_norm),
    ("module_bound_ghost", "ghost", _module_bound),
)}
globals().update(FAULTS)  # tests.adapters.opacus_faults:NAME on the command line

train_half_linear_norm_ghost = make_trainer("ghost", "flat", tamper=_half_norm(nn.Linear),
                                            name="tests.adapters.opacus_faults:train_half_linear_norm_ghost")
