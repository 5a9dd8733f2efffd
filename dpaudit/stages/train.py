"""Train stage: the base model on the public data (when ``pretrain.enabled``), then every
model of the run, each fine-tuning the base on the private members plus the included
canaries with its own ``train`` section (``models[i].train`` over ``train``); with
``fleet.workers`` above 1, side by side (:mod:`dpaudit.stages.pool`).

A model trains into a staging directory that is renamed to ``models/NAME/`` only when its
weights are saved, so an interrupted run retrains exactly the models not in place.
:func:`train_and_save` is the one trainer call (call, check, save) of the toolkit: the run's
models, its base and the fleet's models all go through it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.progress import label
from dpaudit.rundir import ModelDir, RunDir, staged_directory
from dpaudit.seeds import derive_seed, name_key
from dpaudit.stages.artifacts import record_failure, write_training
from dpaudit.stages.prepare import PreparedData

log = logging.getLogger(__name__)

def model_seed(train_seed: int, name: str) -> int:
    """The training seed of model ``name``: one child of the run's train seed per name."""
    return derive_seed([train_seed, name_key(name)])


def effective_config(rundir: RunDir, config: Config, name: str | None) -> Config:
    """The config model ``name`` trains with (``None``: the run's own ``train``, as the
    reference fleet uses); it fine-tunes the run's base model when there is one."""
    cfg = config.for_model(name) if name is not None else config
    if config.trains_base() or rundir.base_complete():
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, base_model=str(rundir.base_dir.resolve()),
                                                                 architecture=None))
    return cfg


def train_and_save(directory: Path, *, dataset, tokenizer, seed: int, config: Config, eval_dataset=None,
                   weights: Path | None = None):
    """Call ``config.train.trainer`` on ``dataset`` (with a :class:`~dpaudit.train.TrainingRecord`
    to fill, and ``directory`` as its ``run_dir``), check that it returned a causal LM with
    finite weights, and save its record into ``directory`` and the model and tokenizer into
    ``weights`` (default: ``directory``). Returns the model."""
    from dpaudit.models import save_model
    from dpaudit.plugins import call_trainer, load_trainer
    from dpaudit.train import TrainingRecord

    spec = config.train.trainer
    trainer = load_trainer(spec)
    record = TrainingRecord(checkpoint=lambda step, model, tok: save_checkpoint(
        model, tok, directory / "checkpoints" / f"step-{step}"))
    model = call_trainer(trainer, dataset, tokenizer, seed=seed, config=config, record=record, run_dir=directory,
                         eval_dataset=eval_dataset)
    if not hasattr(model, "save_pretrained") or not hasattr(model, "forward"):
        raise InputError(f"trainer {spec} returned {type(model).__name__}, not a causal LM")
    broken = [n for n, p in model.named_parameters() if not bool(p.detach().isfinite().all())]
    if broken:
        raise InputError(f"trainer {spec} returned a model with NaN or infinite weights "
                         f"({len(broken)} tensors, the first {broken[0]})")
    write_training(directory, record)
    save_model(model, tokenizer, weights if weights is not None else directory)
    return model


def save_checkpoint(model, tokenizer, directory: Path) -> None:
    """``save_pretrained`` of the model (adapters only with LoRA) and of the tokenizer."""
    with staged_directory(directory) as stage:
        model.save_pretrained(stage, safe_serialization=True)
        tokenizer.save_pretrained(stage)


def train_base(rundir: RunDir, config: Config, data: PreparedData, *, seed: int) -> None:
    """``base/``, the model every model of the run fine-tunes: a non-private model trained on
    the public records only, or, when the run has new-token canaries and the user's
    ``model.base_model`` lacks them, that model grown to hold them (which each model would
    otherwise do with random rows of its own, and no reference would hold). The canaries' rows
    are then set for the run's design (:func:`_set_canary_rows`)."""
    from dpaudit.models import grow_vocabulary, load_model, load_model_config, save_model

    if rundir.base_complete():
        return
    example = next((c for c in data.canaries if c.kind == "new_token"), None)
    if config.trains_base():
        if data.public_set is None:
            raise InputError("pretrain.enabled but the run has no public records (data.public_fraction)")
        cfg = dataclasses.replace(config, train=config.pretrain_train())
        with label("base"), staged_directory(rundir.base_dir) as stage:
            model = train_and_save(stage, dataset=data.public_set, tokenizer=data.tokenizer,
                                   seed=model_seed(seed, "base"), config=cfg, eval_dataset=data.eval_set)
            if example is not None and config.model.trainable == "all":
                _set_canary_rows(model, config, data, example)
                save_model(model, data.tokenizer, stage)
        return
    user, trust = config.model.base_model, config.model.trust_remote_code
    if (user is None or example is None
            or getattr(load_model_config(user, trust_remote_code=trust), "vocab_size", 0) >= len(data.tokenizer)):
        return
    with label("base"), staged_directory(rundir.base_dir) as stage:
        model = load_model(user, trust_remote_code=trust)
        grow_vocabulary(model, len(data.tokenizer))
        _set_canary_rows(model, config, data, example)
        save_model(model, data.tokenizer, stage)


def _set_canary_rows(model, config: Config, data: PreparedData, example) -> None:
    """One shared value for the rows of the new-token canaries' pool, at the positions of
    ``example`` (a canary of the run). When every parameter trains, the rows a canary's
    gradient lands on are its output rows: isolated (:func:`dpaudit.models.isolate_token_rows`),
    they take the next-token mass after its first token, so that its gradient stays off the
    shared weights (pretraining never sees those tokens, and its softmax pushes all their rows
    one way, which the canaries would share). When only the input embedding trains
    (``validate``'s isolated design), a canary's signal must come back through the hidden
    state: muted (:func:`dpaudit.models.mute_token_rows`), they leave it that mass (the rows of
    a base trained by the run stay as pretraining left them)."""
    from dpaudit.canaries import canary_token_ids
    from dpaudit.models import isolate_token_rows, mute_token_rows

    tok = data.tokenizer
    pool, ids = canary_token_ids(tok, config.canaries.set), tok(example.text)["input_ids"]
    if config.model.trainable == "all":
        left = isolate_token_rows(model, token_ids=pool, example_ids=ids)
        if left > 0.01:
            log.warning("base: the new-token canaries' rows could not be isolated: the base leaves %.2f of the "
                        "next-token probability off them where a canary predicts one, so their gradients share "
                        "that part of the shared weights", left)
        return
    kept = mute_token_rows(model, token_ids=pool, example_ids=ids)
    if kept > 0.05:
        log.warning("base: the new-token canaries keep %.2f of the next-token probability after a canary's first "
                    "token; their gradients may fall below the clipping norm", kept)


def train_models(rundir: RunDir, config: Config, data: PreparedData, *, seed: int, skip: Sequence[str] = ()) -> None:
    """Every model of the run not yet trained, but those of ``skip`` (trained elsewhere:
    :mod:`dpaudit.stages.pool`), in this process (:func:`train_or_record`)."""
    for name in config.model_names():
        if name not in skip and not rundir.model(name).is_trained():
            train_or_record(rundir, config, name, data, seed=seed)


def train_or_record(rundir: RunDir, config: Config, name: str, data: PreparedData, *, seed: int) -> None:
    """:func:`train_model`; a model that fails has its ``error.json`` (stage ``train``), and the
    run goes on with the others."""
    md = rundir.model(name)
    try:
        train_model(rundir, config, name, data, seed=seed)
        md.clear_error()
    except Exception as err:  # noqa: BLE001 - a model fails alone; its error.json says why
        record_failure(md, stage="train", error=err)


def train_model(rundir: RunDir, config: Config, name: str, data: PreparedData, *, seed: int) -> ModelDir:
    """``models/NAME/``: model ``name`` trained on the members plus the included canaries."""
    md = rundir.model(name)
    if md.is_trained():
        return md
    cfg = effective_config(rundir, config, name)
    with label(name), staged_directory(md.root) as stage:
        train_and_save(stage, dataset=data.train_set, tokenizer=data.tokenizer, seed=model_seed(seed, name),
                       config=cfg, eval_dataset=data.eval_set, weights=stage / "model")
    return md
