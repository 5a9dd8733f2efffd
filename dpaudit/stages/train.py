"""Train stage: the base model on the public data (when ``pretrain.enabled``), then every
model of the run, each fine-tuning the base on the private members plus the included
canaries with its own ``train`` section (``models[i].train`` over ``train``).

A model trains into a staging directory that is renamed to ``models/NAME/`` only when its
weights are saved, so an interrupted run retrains exactly the models not in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging

import numpy as np

from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.progress import label
from dpaudit.rundir import ModelDir, RunDir, staged_directory
from dpaudit.stages.prepare import PreparedData

log = logging.getLogger(__name__)


def model_seed(train_seed: int, name: str) -> int:
    """The training seed of model ``name``: one child of the run's train seed per name."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    return int(np.random.SeedSequence([train_seed, key]).generate_state(1)[0])


def effective_config(rundir: RunDir, config: Config, name: str | None) -> Config:
    """The config model ``name`` trains with (``None``: the run's own ``train``, as the
    reference fleet uses); it fine-tunes the run's base model when there is one."""
    cfg = config.for_model(name) if name is not None else config
    if config.trains_base():
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, base_model=str(rundir.base_dir.resolve())))
    return cfg


def train_base(rundir: RunDir, config: Config, data: PreparedData, *, seed: int) -> None:
    """``base/``: a non-private model trained on the public records only."""
    if not config.trains_base() or rundir.base_complete():
        return
    from dpaudit.models import save_model
    from dpaudit.train import nonprivate

    if data.public_set is None:
        raise InputError("pretrain.enabled but the run has no public records (data.public_fraction)")
    cfg = dataclasses.replace(config, train=config.pretrain_train())
    with label("base"), staged_directory(rundir.base_dir) as stage:
        model = nonprivate(data.public_set, data.tokenizer, seed=model_seed(seed, "base"), config=cfg, run_dir=stage,
                           eval_dataset=data.eval_set)
        save_model(model, data.tokenizer, stage)


def train_model(rundir: RunDir, config: Config, name: str, data: PreparedData, *, seed: int) -> ModelDir:
    """``models/NAME/``: model ``name`` trained on the members plus the included canaries."""
    from dpaudit.models import save_model
    from dpaudit.plugins import call_trainer, load_trainer

    md = rundir.model(name)
    if md.is_trained():
        return md
    cfg = effective_config(rundir, config, name)
    trainer = load_trainer(cfg.train.trainer)
    with label(name), staged_directory(md.root) as stage:
        model = call_trainer(trainer, data.train_set, data.tokenizer, seed=model_seed(seed, name), config=cfg,
                             run_dir=stage, eval_dataset=data.eval_set)
        if not hasattr(model, "save_pretrained") or not hasattr(model, "forward"):
            raise InputError(f"trainer {cfg.train.trainer} returned {type(model).__name__}, not a causal LM")
        broken = [n for n, p in model.named_parameters() if not bool(p.detach().isfinite().all())]
        if broken:
            raise InputError(f"trainer {cfg.train.trainer} returned a model with NaN or infinite weights "
                             f"({len(broken)} tensors, the first {broken[0]})")
        save_model(model, data.tokenizer, stage / "model")
    return md
