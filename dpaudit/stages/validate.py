"""``dpaudit validate``: does a DP-SGD trainer earn the (epsilon, delta) it claims?

One run with m canaries, each in with probability 1/2: the trainer is called once through
the plug-in contract, and the canaries are scored by the reference attack calibrated by the
run's base model (by every attack the inputs allow when there is no base). By default the
canaries are isolated (``new_token_bare``: two new tokens each, no token in two canaries) and
only the input embedding trains (``model.trainable: input_embeddings``), so that a canary's
gradient lies mostly on rows nothing else trains: the DP guarantee holds for any choice of
trained parameters, and without this choice the canaries' pull on each other hides each
one's own (``docs/ceilings.md``). The sound one-run bounds (Steinke et al. 2023, arXiv 2305.08846) are computed
at delta and, when the trainer records a plain DP-SGD event (q, T), so is the test against
that family's trade-off curve (Mahloujifar et al. 2024, arXiv 2410.22235: the epsilon of the
least noisy member it rejects), all corrected over the attacks, and compared with the claim by
:func:`dpaudit.audit.assess`. The trainer's own sampler checks (``train_checks.json``), when
it writes them, are part of the verdict.

``consistent`` is not a proof of privacy: the output shows the bound beside the method's
ceiling, the most m canaries could show. ``inconclusive`` says the audit could not have seen a
violation: the ceiling is at or below the claim, or the model learned nothing.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.config import Config, load_config
from dpaudit.errors import InputError
from dpaudit.rundir import RunDir
from dpaudit.stages.artifacts import read_dp_record, read_tokenizer, write_ladder
from dpaudit.stages.isolated import ISOLATED, LINEAR, full_batch_size
from dpaudit.stages.ladder import rung_significance
from dpaudit.stages.signal_cache import load_signals

MODEL = "validate"
SIGNIFICANCE = 0.05
FULL_BATCH_STEPS = 10  # validate --full-batch, unless train.steps is set (the config file or --set)
JSON_KEYS = ("verdict", "reason", "epsilon_lower_bound", "method", "significance", "num_canaries", "num_guesses",
             "num_correct", "claimed_epsilon", "delta", "ceiling", "rungs")
RUNGS = 2  # input_space (its canaries) and white_box (its gradient canaries): each at SIGNIFICANCE / 2


def validate_overrides(*, trainer: str, canaries: int | None = None, overrides: Sequence[str] = (),
                       config: str | Path = "demo") -> list[str]:
    """The ``--set`` overrides that make the preset ``config`` into the run ``validate`` makes:
    one model trained by ``trainer``, no reference fleet, no twins (the model is in the
    ladder's isolated design already, and :func:`verdict_of` writes its two rungs), and (unless
    ``overrides`` say otherwise) the audit design: :data:`ISOLATED`, and :data:`LINEAR` when the
    run starts from a base model, its own or the user's (``docs/ceilings.md``). ``dpaudit
    train`` with the same overrides trains the same model."""
    base = load_config(config, overrides=[*ISOLATED, *overrides]).starts_from_base()
    gradient = load_config(config).audit.ladder.gradient_canaries
    sets = [*ISOLATED, *(LINEAR if base else ()), "canaries.secrets.num=0", "fleet.num_models=0",
            f"train.dp.gradient_canaries={gradient}", f"audit.significance={SIGNIFICANCE / RUNGS}", *overrides,
            f"models=[{{name: {MODEL}}}]", f"train.trainer={trainer}", "audit.ladder.enabled=false"]
    if canaries is not None:
        if canaries < 2:
            raise InputError(f"--canaries must be at least 2, got {canaries}")
        sets.append(f"canaries.num={canaries}")
    return sets


def validate_config(*, trainer: str, canaries: int | None, config: str | Path, overrides: list[str]) -> Config:
    """The run ``validate`` makes (:func:`validate_overrides` on the chosen preset), checked."""
    sets = validate_overrides(trainer=trainer, canaries=canaries, overrides=overrides, config=config)
    cfg = load_config(config, overrides=sets)
    if cfg.starts_from_base() and not cfg.attack.attacks:
        # the one attack chosen in advance: the canaries' likelihood calibrated by the base model
        # (the reference without a fleet), so the bounds are corrected over one attack, not all
        cfg = dataclasses.replace(cfg, attack=dataclasses.replace(cfg.attack, attacks=["reference"]))
    if cfg.canaries.num < 2:
        raise InputError("validate needs canaries: set --canaries (at least 2)")
    if cfg.canaries.inclusion_prob != 0.5:
        raise InputError("validate's one-run bounds need canaries.inclusion_prob = 0.5")
    if cfg.canaries.repetitions > 1 and cfg.train.dp.unit == "example":
        raise InputError("canaries.repetitions > 1 at note level makes each canary a group of units, which a claim "
                         "of (epsilon, delta) per unit does not cover: use canaries.repetitions=1")
    return cfg


def validate(*, trainer: str, epsilon: float, delta: float, canaries: int | None = None,
             config: str | Path = "demo", overrides: list[str] | tuple[str, ...] = (), full_batch: bool = False,
             out: str | Path, command: list[str] | None = None) -> dict[str, Any]:
    """Train once with ``trainer``, audit the canaries, and return the verdict as a dict with
    :data:`JSON_KEYS` (plus ``run_dir``, ``checks`` and the losses that tell whether the model learned).

    ``full_batch``: every unit in every step (q = 1; ``train.steps``, default
    :data:`FULL_BATCH_STEPS`), the regime whose final model shows the most of the claim
    (``docs/ceilings.md``); the trainer's sampler then has nothing to get wrong.
    """
    from dpaudit.stages import run

    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise InputError(f"--epsilon must be a positive number, got {epsilon}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise InputError(f"--delta must be in (0, 1), got {delta}")
    cfg = validate_config(trainer=trainer, canaries=canaries, config=config, overrides=list(overrides))
    if full_batch:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=full_batch_size(cfg),
                                                                 steps=cfg.train.steps or FULL_BATCH_STEPS))
    fresh = not RunDir(out).exists()
    result = run(cfg, out=out, until="attack", command=command)
    if result.failed:
        error = result.rundir.model(MODEL).read_error() or {}
        if error.get("stage") == "train":
            if fresh:
                shutil.rmtree(result.rundir.root, ignore_errors=True)
            raise InputError(f"the trainer {trainer} failed: {error['message']}")
        raise InputError(f"the audit of {trainer}'s model failed: {result.failed[MODEL]}")
    return verdict_of(result.rundir, epsilon=epsilon, delta=delta)


def verdict_of(rundir: RunDir, *, epsilon: float, delta: float) -> dict[str, Any]:
    """The verdict on the claim (``epsilon``, ``delta``) from the saved canary scores and the
    trainer's gradient canaries (:func:`dpaudit.audit.assess`, with the trainer's DP record and
    sampler checks): two rungs of the threat-model ladder, each at half the significance, which
    also go to the model's ``ladder.json`` for its report."""
    from dpaudit.audit import CanaryScores, Claim, assess, claimed_curve_bound, learned, rung_ceiling
    from dpaudit.audit.assess import mechanism_refusal
    from dpaudit.stages.attack import claimed_family
    from dpaudit.stages.ladder import canary_rung, train_seconds, white_box_rung

    md = rundir.model(MODEL)
    results = md.read_results()
    # the trainer's DP-SGD family (q, T), when its record is plain DP-SGD: the guesses are also
    # tested against the family's curve at the claimed epsilon
    config = rundir.read_config()
    record = read_dp_record(md)
    family = claimed_family(record, config)
    tests = len(results) * (2 if family else 1)
    significance = rung_significance(config) / tests  # the best test holds at the rung's significance
    bounds = []
    for name, r in results.items():
        scores, labels = r["arrays"]["canaries"]
        cs = CanaryScores.from_labels(scores=scores, is_member=labels, seed=0)
        bounds.append((name, cs.bound("one_run", delta=delta, significance=significance)))
        if family:
            bounds.append((name, claimed_curve_bound(cs, **family, delta=delta, significance=significance)))
    attack, best = max(((a, b) for a, b in bounds), key=lambda t: t[1].epsilon, default=(None, None))
    rungs = [canary_rung("input_space", bound=best, attack=attack, attacks=len(results), record=record,
                         config=config, num_canaries=config.canaries.num, cost_s=train_seconds(md),
                         refused="no canary scores"),
             white_box_rung(rundir, config, MODEL, delta=delta)]
    write_ladder(md, rungs)
    if rungs[1].bound is not None:
        bounds.append(("white_box", dataclasses.replace(rungs[1].bound, significance=rungs[1].significance)))
    initial, final = fit_losses(rundir, md)
    checks = md.read_train_checks()
    claim = Claim.stated(epsilon=epsilon, delta=delta, family=family)
    verdict = assess(bounds=bounds, claim=claim,
                     learned=learned(initial_loss=initial, final_loss=final, trainable=config.model.trainable),
                     checks=checks, record=record, mismatch=mechanism_refusal(rungs))
    out = {k: v for k, v in verdict.to_dict().items() if k in JSON_KEYS}
    return {"verdict": verdict.status.value, **out, "claimed_epsilon": epsilon, "delta": delta,
            "exit_code": verdict.exit_code,
            "rungs": [{**r.to_dict(), "ceiling": rung_ceiling(r, claim=claim)} for r in rungs],
            "run_dir": str(rundir.root), "checks": checks, "initial_loss": initial, "final_loss": final}


def fit_losses(rundir: RunDir, md) -> tuple[float | None, float | None]:
    """The loss that tells whether the model learned, before and after training: on its
    training rows from the trainer's step-0 and last evaluations when it logged them; else
    (a plug-in without a log) the held-out records' loss against a uniform guess over the
    vocabulary, which is what an untrained model scores."""
    from dpaudit.audit import fit_from_log

    initial, final = fit_from_log(md.read_train_log())
    if initial is not None:
        return initial, final
    path = md.signals_dir / "target.npz"  # written by the attack stage
    if not path.is_file():
        return None, None
    signals = load_signals(path)
    logprob, mask = signals.logprob, signals.mask.astype(bool)
    roles = [c["role"] for c in rundir.read_candidates()]
    held = np.array([r == "heldout" for r in roles] + [False] * (len(logprob) - len(roles)))
    tokens = mask[held]
    final = float(-(logprob[held][tokens]).mean()) if tokens.any() else None
    return math.log(len(read_tokenizer(rundir))), final
