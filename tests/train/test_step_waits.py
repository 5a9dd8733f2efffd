"""A training step queues all its work before the host waits for the device (issue 31).

On CUDA a read of a tensor's values (``.cpu()``, ``.item()``, ``.tolist()``, ``bool(t)``) and
an ordinary copy from the host both wait for everything queued before them. One in the middle
of a DP step makes the host wait for the backward pass before it queues the clipping, the
noise and the optimizer, so their launches add to the step's time instead of overlapping it.

Checked without a GPU: the model lives on the ``meta`` device, where tensors have shapes and no
values, so any read of values raises, and two modes flag every copy from the host that would
wait (``torch.tensor(..., device=...)``, ``.to(device)`` without ``non_blocking``). Each engine's
step, with gradient canaries, seeded or secure noise, and the optimizer's step then runs through
without either; what the step saw (its losses and norms) is read afterwards, once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from dpaudit.train import chacha
from dpaudit.train.engine import DPSGDEngine, NonPrivateEngine
from dpaudit.train.ghost import GhostClippingEngine
from dpaudit.train.gradient_canaries import GradientCanaries
from dpaudit.train.sampling import SecureGenerator

VOCAB = 61
META = torch.device("meta")


class HostCopies(TorchFunctionMode):
    """Records the host-to-device copies that wait for the device's queue."""

    def __init__(self):
        super().__init__()
        self.waits: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        device = kwargs.get("device")
        if name in ("tensor", "as_tensor") and device is not None and torch.device(device).type != "cpu":
            self.waits.append(f"torch.{name}(..., device={device})")
        with _Copies(self):
            return func(*args, **kwargs)


class _Copies(TorchDispatchMode):
    def __init__(self, record: HostCopies):
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in (torch.ops.aten._to_copy.default,) and args[0].device.type == "cpu"
                and kwargs.get("device") is not None and kwargs["device"].type != "cpu"
                and not kwargs.get("non_blocking")):
            self.record.waits.append(f"a copy to {kwargs['device']} without non_blocking")
        return func(*args, **kwargs)


def on_meta(family: str):
    if family == "gpt2":  # tied input and output embeddings, Conv1D, LayerNorm
        config = GPT2Config(vocab_size=VOCAB, n_layer=2, n_embd=16, n_head=2, n_positions=32,
                            bos_token_id=0, eos_token_id=0, attn_implementation="eager")
        cls = GPT2LMHeadModel
    else:  # untied, nn.Linear, RMSNorm (a generic module: its gradients by vmap)
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                             bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")
        cls = LlamaForCausalLM
    # eager attention: the SDPA mask code itself reads the mask (padding_mask.all()), in any step
    with META:
        return cls(config)


def units(rows_per_unit: int):
    g = torch.Generator().manual_seed(0)
    return [[torch.randint(1, VOCAB, (n + j,), generator=g) for j in range(rows_per_unit)] for n in (5, 9, 3, 7, 6)]


ENGINES = {
    "nonprivate": (NonPrivateEngine, {}),
    "ghost": (GhostClippingEngine, {"fallback": False}),
    "vmap": (DPSGDEngine, {}),
}


# (engine, rows per unit: 1 per example, 2 per user, noise)
CASES = [("nonprivate", 1, None)] + [(engine, rows, noise) for engine in ("ghost", "vmap") for rows in (1, 2)
                                     for noise in ("seeded", "secure")]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize(("engine_name", "rows_per_unit", "noise"), CASES)
def test_a_step_queues_its_work_without_waiting(family, engine_name, rows_per_unit, noise):
    cls, extra = ENGINES[engine_name]
    dp = {} if cls is NonPrivateEngine else {"noise_multiplier": 1.0, "max_grad_norm": 1.0}
    engine = cls(on_meta(family), expected_batch_size=5, microbatch_size=4, pad_id=0, device=META, **dp, **extra)
    if engine.private:
        engine.attach_canaries(GradientCanaries(num_canaries=12, sample_rate=0.5, max_grad_norm=1.0,
                                                rng=np.random.default_rng(0)))
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-3)
    # secure noise: the generator is the host's, the sums are on the device (OpenSSL's keystream, copied)
    generator = SecureGenerator() if noise == "secure" else None
    copies = HostCopies()
    with copies:
        for _ in range(2):  # the second step too: nothing is read that the first left
            if generator is not None:
                generator.next_step()
            stats = engine.step(units(rows_per_unit), generator)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    assert copies.waits == []
    with pytest.raises(NotImplementedError, match="meta"):  # the losses are read now, not in the step
        stats.losses
    if engine.private:
        with pytest.raises(NotImplementedError, match="meta"):
            engine.canaries.result()


def test_the_torch_keystream_is_made_on_the_device_without_waiting():
    copies = HostCopies()
    with copies:
        stream = chacha.TorchStream(chacha.key_tensor(bytes(32), META), (1, 2, 3), 7)
        words = stream.read(4)
        chacha.noisy_snapped(words, torch.zeros(words.numel(), device=META), std=1.0, spacing=2**-6)
    assert copies.waits == []
    assert words.device == META


def test_the_checks_see_what_they_look_for():
    """The two detectors fire on what they are meant to catch, and meta refuses reads."""
    copies = HostCopies()
    with copies:
        torch.tensor([1, 2], device=META)
        torch.arange(3).to(META)
        torch.arange(3).to(META, non_blocking=True)  # not a wait
    assert len(copies.waits) == 2
    with pytest.raises(NotImplementedError, match="meta"):
        torch.zeros(2, device=META).cpu()
