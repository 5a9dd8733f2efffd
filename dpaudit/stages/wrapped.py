"""Wrapped stage: the run directory of a user's own training loop, audited by
:class:`dpaudit.Audit` (:mod:`dpaudit.wrap`; the taps in :mod:`dpaudit.adapters.loop`).

It writes what the prepare and train stages write for a model the toolkit trained, so that
``dpaudit attack`` and ``dpaudit report`` work on it unchanged:

- ``config.yaml`` and the manifest (:func:`dpaudit.stages.open_run`): one model, ``loop``,
  whose trainer is :data:`dpaudit.adapters.loop.USER_LOOP` (a loop the toolkit cannot rerun);
  the threat-model ladder enabled, so that the attack stage writes its rungs;
- ``data/``: the members (a sample of the rows the loop drew), the held-out texts the user
  gave, the input canaries (each in with probability 1/2) and the tokenizer;
- ``base/``: the model as the loop started (the reference attack calibrates by it);
- ``models/loop/``: the trained model and the loop's :class:`~dpaudit.train.TrainingRecord`
  (the claim's DP record, the sampler, step and noise checks, the gradient canaries, the log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpaudit.config import Config, load_config
from dpaudit.rundir import RunDir, staged_directory
from dpaudit.stages.artifacts import write_data, write_training

MODEL = "loop"


def wrapped_config(*, seed: int, max_length: int, canary_set: str, num_canaries: int, gradient_canaries: int,
                   epsilon: float, delta: float, max_grad_norm: float | None, trainer: str) -> Config:
    """The config of a wrapped run: the claim (epsilon at delta, per example), its canaries,
    one model, the ladder on (input space refused: the loop cannot be rerun as a twin)."""
    dp = {"target_epsilon": epsilon, "delta": delta, "gradient_canaries": gradient_canaries}
    if max_grad_norm is not None:
        dp["max_grad_norm"] = max_grad_norm
    return load_config({
        "seed": seed,
        "data": {"source": "user loop", "max_length": max_length},
        "canaries": {"set": canary_set, "num": num_canaries, "secrets": {"num": 0}},
        "train": {"trainer": trainer, "dp": dp},
        "models": [{"name": MODEL}],
        "audit": {"ladder": {"enabled": True, "gradient_canaries": max(1, gradient_canaries)}},
    })


def write_wrapped_run(out: str | Path, *, config: Config, model, tokenizer, record, candidates: list[dict[str, Any]],
                      canaries: list, spec: dict, at_start, force: bool = False,
                      command: list[str] | None = None) -> RunDir:
    """Write the run directory ``out`` (the module docstring). ``at_start``: a context
    manager inside which ``model`` holds the weights the loop started from."""
    from dpaudit.models import save_model
    from dpaudit.stages import open_run

    rundir = open_run(config, out, force=force, command=command)
    members = sorted({c["unit_id"] for c in candidates if c["role"] == "member"})
    heldout = sorted({c["unit_id"] for c in candidates if c["role"] == "heldout"})
    split = {"seed": config.seed, "holdout_fraction": len(heldout) / max(1, len(members) + len(heldout)),
             "member_units": members, "heldout_units": heldout}
    if not rundir.data_complete():
        with staged_directory(rundir.data_dir) as stage:
            write_data(stage, split=split, candidates=candidates, public=[], canaries=canaries, spec=spec,
                       tokenizer=tokenizer)
    if not rundir.base_complete():
        with at_start(), staged_directory(rundir.base_dir) as stage:
            save_model(model, tokenizer, stage)
    md = rundir.model(MODEL)
    if not md.is_trained():
        with staged_directory(md.root) as stage:
            write_training(stage, record)
            save_model(model, tokenizer, stage / "model")
    return rundir
