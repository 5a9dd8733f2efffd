"""The stages of a run, one module each, and :func:`run`, which chains them.

prepare -> train (base, then every model; with ``fleet.workers`` above 1 side by side with the
fleet's models, :mod:`dpaudit.stages.pool`) -> fleet -> attack -> extract -> the threat-model
ladder (``audit.ladder.enabled`` only) -> multi-run audit (``audit.mode: multi_run`` only) ->
report.
Every stage reads and writes only through :class:`dpaudit.rundir.RunDir`; a stage whose
artifacts are in place is skipped, so rerunning :func:`run` on the same directory resumes.
A model that fails is recorded in its ``error.json`` and the run goes on with the others.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.progress import log_file
from dpaudit.rundir import RunDir
from dpaudit.stages.artifacts import record_failure, write_manifest

log = logging.getLogger(__name__)

__all__ = ["RunResult", "attack_run", "check_config", "run"]


@dataclass
class RunResult:
    """What :func:`run` did: the run directory, the report (None when not built) and the
    models that failed (name -> message)."""

    rundir: RunDir
    report: dict[str, Any] | None = None
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


def open_run(config: Config, out: str | Path, *, force: bool = False, command: list[str] | None = None) -> RunDir:
    """Create the run directory, or reopen it for a resume when it holds the same config."""
    from dpaudit.stages.prepare import derive_seeds

    rundir = RunDir(out)
    if force and rundir.root.exists():
        shutil.rmtree(rundir.root)
    if rundir.exists():
        stored = rundir.config_path.read_text(encoding="utf-8")
        if stored != config.to_yaml():
            raise InputError(f"{rundir.root} holds a run with another config: rerun with the same config to "
                             f"resume it, or pass --force to start over")
        log.info("resuming the run in %s", rundir.root)
        return rundir
    if rundir.root.exists() and any(rundir.root.iterdir()):
        raise InputError(f"{rundir.root} exists and is not a dpaudit run directory (pass --force to replace it)")
    rundir.root.mkdir(parents=True, exist_ok=True)
    write_manifest(rundir, seeds={"run": config.seed, **derive_seeds(config.seed)}, command=command)
    rundir.write_config(config)  # last: its presence makes the directory a run
    return rundir


def run(config: Config, *, out: str | Path, force: bool = False, until: str = "report",
        command: list[str] | None = None) -> RunResult:
    """Train every model of ``config``, attack them and write the report, in ``out``.

    ``until="train"`` stops after training (``dpaudit train``), ``until="attack"`` after the
    fleet and attack stages (``dpaudit validate``: no extraction, no report). Rerunning with
    the same config on the same ``out`` resumes; ``force=True`` starts over.
    """
    if until not in ("train", "attack", "report"):
        raise InputError(f"until must be train, attack or report, got {until!r}")
    check_config(config)
    fresh = force or not RunDir(out).exists()
    rundir = open_run(config, out, force=force, command=command)
    with log_file(rundir.log_path):
        return _run(rundir, config, until=until, fresh=fresh)


def check_config(config: Config) -> None:
    """Input errors that need no data, found before anything is written: the attack settings
    (:func:`dpaudit.attacks.check_settings`), every model's trainer imports, and a trainer
    that claims DP gets exactly one of noise_multiplier and target_epsilon."""
    from dpaudit.attacks import check_settings
    from dpaudit.plugins import load_trainer

    check_settings(attacks=config.attack.attacks, params=config.attack.params, audit_attack=config.audit.attack)
    for name in config.model_names():
        train = config.for_model(name).train
        trainer = load_trainer(train.trainer)
        if getattr(trainer, "claims_dp", False) and (train.dp.noise_multiplier is None) == (train.dp.target_epsilon is None):
            which = "both" if train.dp.noise_multiplier is not None else "neither"
            where = f"model {name}: " if len(config.models) > 1 else ""
            raise InputError(f"{where}{train.trainer} is a DP trainer: train.dp needs exactly one of noise_multiplier "
                             f"and target_epsilon, got {which}")


def _run(rundir: RunDir, config: Config, *, until: str, fresh: bool) -> RunResult:
    from dpaudit.stages.prepare import derive_seeds, load_prepared, prepare
    from dpaudit.stages.pool import train_side_by_side
    from dpaudit.stages.train import train_base, train_models

    seeds = derive_seeds(config.seed)
    try:
        prepare(rundir, config, seeds)
    except BaseException:
        if fresh:  # bad data: leave nothing behind
            shutil.rmtree(rundir.root, ignore_errors=True)
        raise
    data = load_prepared(rundir, config, seeds)
    train_base(rundir, config, data, seed=seeds["train"])
    apart = train_side_by_side(rundir, config, data, fleet=until != "train")
    train_models(rundir, config, data, seed=seeds["train"], skip=apart)
    errors = {n: rundir.model(n).read_error() for n in config.model_names()}
    result = RunResult(rundir, failed={n: f"train: {e['message']}" for n, e in errors.items()
                                       if e is not None and e["stage"] == "train"})
    if until == "train":
        return result
    result.failed.update(attack_run(rundir, config=config, data=data, extract=until == "report").failed)
    if until == "attack":
        return result
    from dpaudit.stages.report import build_report

    result.report = build_report(rundir)
    return result


def _fail(result: RunResult, md, stage: str, err: BaseException) -> None:
    record_failure(md, stage=stage, error=err)
    result.failed[md.name] = f"{stage}: {err}"


def attack_run(rundir: RunDir | str | Path, *, config: Config | None = None, data=None,
               attacks: Sequence[str] | None = None, extract: bool = True) -> RunResult:
    """Fleet, attack and (unless ``extract=False``) extract stages for every trained model of
    a run directory, and the multi-run audit (``audit.mode: multi_run``) of the models it names."""
    from dpaudit.attacks import available_attacks
    from dpaudit.stages.attack import attack_model, attack_texts, reference_signals, run_delta
    from dpaudit.stages.extract import extract_model
    from dpaudit.stages.fleet import train_reference_fleet
    from dpaudit.stages.prepare import derive_seeds, load_prepared

    unknown = sorted(set(attacks or ()) - set(available_attacks()))
    if unknown:
        raise InputError(f"unknown attack(s) {', '.join(unknown)}: known are {', '.join(available_attacks())}")
    rundir = RunDir(rundir) if not isinstance(rundir, RunDir) else rundir
    rundir.check()
    config = config or rundir.read_config()
    data = data or load_prepared(rundir, config, derive_seeds(config.seed))
    fleet = train_reference_fleet(rundir, config, data)
    texts, record_labels, canary_labels = attack_texts(data)
    references, keep = reference_signals(rundir, config, fleet, texts, data.tokenizer)
    result = RunResult(rundir)
    delta = run_delta(rundir, config.model_names())
    for name in config.model_names():
        md = rundir.model(name)
        if not md.is_trained():
            continue
        try:
            if attacks is not None or not md.attacked():
                attack_model(rundir, config, md, texts=texts, record_labels=record_labels,
                             canary_labels=canary_labels, references=references, keep=keep, attacks=attacks,
                             default_delta=delta, tokenizer=data.tokenizer)
            if extract:
                extract_model(rundir, config, md, tokenizer=data.tokenizer)
            md.clear_error()
        except Exception as err:  # noqa: BLE001
            _fail(result, md, "attack", err)
    if config.audit.ladder.enabled:
        from dpaudit.stages.ladder import ladder_run

        ladder_run(rundir, config, run=run)
    if config.audit.mode == "multi_run":
        from dpaudit.stages.multi_run import multi_run_model

        for name in config.audit.models or config.model_names():
            md = rundir.model(name)
            if not md.is_trained() or name in result.failed:
                continue
            try:
                multi_run_model(rundir, config, name, data, default_delta=delta)
            except Exception as err:  # noqa: BLE001
                _fail(result, md, "multi_run", err)
    return result
