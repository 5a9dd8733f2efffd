"""``dpaudit.Audit``: audit a training loop as it is, with three added lines.

::

    audit = dpaudit.Audit(claim=dict(epsilon=4, delta=1e-5, unit="example"), out="runs/mine",
                          tokenizer=tokenizer, heldout=heldout_texts)
    loader = audit.wrap_loader(loader)           # input canaries in its batches, inclusion recorded
    optimizer = audit.wrap_optimizer(optimizer)  # gradient canaries in the clipped sum, before the noise
    ...the loop, unchanged...
    audit.finish(model, tokenizer)               # the run directory

then ``dpaudit attack runs/mine`` and ``dpaudit report runs/mine`` give the verdict, the
threat-model ladder's rungs and the report. A Hugging Face ``Trainer`` takes
``callbacks=[audit.callback()]`` instead of the two wraps.

The audit is the one-run audit of Steinke, Nasr and Jagielski 2023 ("Privacy Auditing with
One (1) Training Run", arXiv 2305.08846): canaries each in with probability 1/2, input-space
canaries scored on the released model, and white-box gradient canaries (Dirac gradients of
norm C added to the clipped sum before the noise, each in every step with the loader's
Poisson rate) scored from every noisy release. The taps are in :mod:`dpaudit.adapters.loop`;
the run directory is written by :mod:`dpaudit.stages.wrapped`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError

__all__ = ["Audit"]


class Audit:
    """The audit of one training loop (the module docstring).

    Keyword-only: ``claim`` (a mapping: ``epsilon``, ``delta``, ``unit="example"``, and
    optionally the ``steps`` and Poisson ``sample_rate`` the claim was accounted with, and its
    ``accountant``, ``pld`` or ``rdp``); ``out``, the run directory to write (``force=True``
    replaces one); ``tokenizer``, the loop's (the canaries are its tokens); ``heldout``,
    texts the loop never trains on, from the same source (the membership attacks'
    non-members; may be empty); ``canaries``, how many input-space canaries (each in with
    probability 1/2) from the set ``canary_set`` (``canaries/*.yaml``; its tokens must be the
    tokenizer's: no ``new_token`` set); ``gradient_canaries``, how many white-box gradient
    canaries (0: none; needs an Opacus ``DPOptimizer``); ``members``, how many of the rows the
    loop draws are kept as the attacks' members; ``max_length``, the canaries' and the
    attacks' token length; ``seed``, the seed of every draw of the audit."""

    def __init__(self, *, claim, out: str | Path, tokenizer, heldout=(), canaries: int = 64,
                 canary_set: str = "random_secret", gradient_canaries: int = 10_000, members: int = 256,
                 max_length: int = 128, seed: int = 0, force: bool = False):
        import numpy as np

        from dpaudit.adapters.loop import LoopClaim, LoopObserver, rows_of_texts
        from dpaudit.canaries import load_canary_spec, make_canaries
        from dpaudit.train.sampling import RunSeeds

        self.claim = LoopClaim.parse(claim)
        for name, value, low in (("canaries", canaries, 1), ("gradient_canaries", gradient_canaries, 0),
                                 ("members", members, 1), ("max_length", max_length, 2), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
        if tokenizer is None or not callable(tokenizer):
            raise InputError("tokenizer must be the loop's Hugging Face tokenizer (the canaries are made of its tokens)")
        if isinstance(heldout, str) or not all(isinstance(t, str) for t in heldout):
            raise InputError("heldout must be a list of texts the loop does not train on")
        self.out, self.force = Path(out), bool(force)
        if not force and self.out.exists() and any(self.out.iterdir()):
            raise InputError(f"{self.out} exists and is not empty: pass force=True to replace it, or another out")
        self.spec = load_canary_spec(canary_set)
        if self.spec["kind"] == "new_token":
            raise InputError(f"canary_set {canary_set!r} adds tokens the loop's model does not have: use "
                             "random_secret, random_secret6, random_phone or pii")
        self.tokenizer, self.heldout = tokenizer, list(heldout)
        self.seed, self.max_length, self.num_gradient_canaries = int(seed), int(max_length), int(gradient_canaries)
        self.canaries = make_canaries(spec=self.spec, num_canaries=int(canaries), seed=self.seed)
        rows = rows_of_texts(tokenizer, [c.text for c in self.canaries if c.included], max_length=self.max_length)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._observer = LoopObserver(claim=self.claim, canary_rows=rows, gradient_canaries=self.num_gradient_canaries,
                                      seeds=RunSeeds.from_seed(self.seed), pad_id=pad or 0, members=int(members))
        self.run_dir = None

    def __repr__(self) -> str:
        return f"Audit(claim={self.claim}, out={str(self.out)!r})"

    def wrap_loader(self, loader):
        """The loop's data loader (a ``torch.utils.data.DataLoader`` of mapping batches with
        ``input_ids`` and ``attention_mask``; Opacus's ``DPDataLoader`` for Poisson sampling),
        with each included input canary added to each batch independently with the loader's
        rate q, as one more record would be. Every batch's size is recorded and tested against
        Binomial(N, q) when the audit finishes: a shuffling loader is flagged."""
        return self._observer.wrap_loader(loader)

    def wrap_optimizer(self, optimizer):
        """``optimizer``, tapped in place and returned. An Opacus ``DPOptimizer``: after each
        ``add_noise`` the gradient canaries' block (C at the coordinates of the canaries this
        step includes) goes through the same ``add_noise`` and its noisy release is recorded
        (Steinke et al. 2023, arXiv 2305.08846, Sect. 6), and the noise it added is measured.
        Any other optimizer's steps are counted, and the audit records that it adds no noise."""
        return self._observer.wrap_optimizer(optimizer)

    def callback(self):
        """A ``transformers.TrainerCallback`` that taps the ``Trainer``'s training loader (in
        place: ``dataloader_num_workers=0``) and optimizer when training begins; pass it as
        ``Trainer(..., callbacks=[audit.callback()])``, then call :meth:`finish`."""
        from transformers import TrainerCallback

        observer = self._observer

        class AuditCallback(TrainerCallback):
            def on_train_begin(self, args, state, control, *, train_dataloader=None, optimizer=None, **kwargs):
                if train_dataloader is None or optimizer is None:
                    raise InputError("the Trainer gave the audit's callback no training loader or optimizer")
                observer.tap_loader(train_dataloader)
                observer.wrap_optimizer(optimizer)

        return AuditCallback()

    def finish(self, model, tokenizer=None, *, command: list[str] | None = None) -> Path:
        """Write the run directory (:mod:`dpaudit.stages.wrapped`) from what the wrappers saw
        and the trained ``model`` (an Opacus ``GradSampleModule`` is unwrapped); returns its
        path. The optimizer works untapped afterwards."""
        from dpaudit.adapters.loop import USER_LOOP, rows_of_texts
        from dpaudit.stages.wrapped import wrapped_config, write_wrapped_run

        if self.run_dir is not None:
            raise InputError(f"this audit is finished already (its run is {self.run_dir})")
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        import torch

        while isinstance(getattr(model, "_module", None), torch.nn.Module):
            model = model._module  # Opacus's GradSampleModule around the user's model
        if not hasattr(model, "save_pretrained"):
            raise InputError(f"finish() takes the trained Hugging Face model, got {type(model).__name__}")
        obs = self._observer
        if obs.loader is None or obs.optimizer is None or not obs.steps:
            raise InputError("finish() needs a trained loop: wrap its loader and optimizer (audit.wrap_loader, "
                             "audit.wrap_optimizer, or audit.callback() for a Trainer) and train before finishing")
        members = obs.member_rows()
        # the held-out texts cut as the loop's rows were (at their longest), so that length tells no member apart
        longest = max((len(r) for r in members), default=self.max_length)
        heldout_rows = rows_of_texts(tokenizer, self.heldout, max_length=min(longest, self.max_length))
        candidates = [{"text": tokenizer.decode(row, skip_special_tokens=True), "unit_id": f"{role}-{i:05d}",
                       "role": role} for role, rows in (("member", members), ("heldout", heldout_rows))
                      for i, row in enumerate(rows)]
        candidates = [c for c in candidates if c["text"]]
        log = obs.evaluations(model, members=[torch.as_tensor(r, dtype=torch.long) for r in members],
                              heldout=heldout_rows)
        record = obs.training_record(log_rows=log)
        obs.release()
        clip = getattr(obs.optimizer, "max_grad_norm", None)
        config = wrapped_config(seed=self.seed, max_length=self.max_length, canary_set=self.spec["name"],
                                num_canaries=len(self.canaries), gradient_canaries=self.num_gradient_canaries,
                                epsilon=self.claim.epsilon, delta=self.claim.delta,
                                max_grad_norm=float(clip) if isinstance(clip, (int, float)) else None, trainer=USER_LOOP)
        rundir = write_wrapped_run(self.out, config=config, model=model, tokenizer=tokenizer, record=record,
                                   candidates=candidates, canaries=self.canaries, spec=self.spec,
                                   at_start=obs.at_start, force=self.force,
                                   command=command if command is not None else sys.argv)
        self.run_dir = rundir.root
        return rundir.root

    @property
    def observed(self) -> dict[str, Any]:
        """What the wrappers saw so far: loader batches, optimizer steps, the loader's N and q."""
        obs = self._observer
        return {"batches": len(obs.sizes), "steps": obs.steps, "num_units": obs.num_units,
                "sample_rate": obs.sample_rate, "sampler": obs.sampler}
