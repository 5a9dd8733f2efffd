"""Multi-run audit stage (``audit.mode: multi_run``): the classic audit over many trainings.

For an audited model, K models are trained with one canary and K without it (Jagielski,
Ullman, Oprea 2020, "Auditing Differentially Private Machine Learning: How Private is
Private SGD?", arXiv 2006.07709; Nasr et al. 2023, "Tight Auditing of Differentially
Private Machine Learning", arXiv 2302.07956). Every run uses the audited model's own
trainer and training rows (the members plus the run's other included canaries); the only
difference between the two sides is the canary. The canary's attack score in each run
(``audit.attack``, the loss by default: higher = member) is one trial, so the K "in" scores
and K "out" scores give a Clopper-Pearson bound (sound for any (epsilon, delta)-DP
mechanism) and a Gaussian-DP estimate, through :class:`dpaudit.audit.CanaryScores` with its
default Bonferroni strategy over FPR thresholds (no uncorrected maximum).

What each trial assumes:

- one trial = one training run with its own seed (:func:`dpaudit.fleet.model_seed` of a
  seed of its own); the runs of a side are independent and identically distributed, so
  the false positives and false negatives at a threshold fixed by the out scores' order
  statistics are binomial, as the Clopper-Pearson bound needs. One canary per run: the
  scores of several canaries of the same run are not independent trials, so they are not
  counted as such.
- the noise multiplier and the number of steps are pinned to the audited model's
  (``dp_event.json``), so the runs are the audited mechanism itself; the sampling rate
  q = B / N follows each run's own N, which differs between the sides by the canary's
  ``r`` rows (q changes by a factor N / (N + r)). The claim the bound is held to is the
  largest accountant epsilon of the 2K runs, recomputed from their DpEvents (the group's
  epsilon for a canary repeated r times at note level).

Artifacts: the runs in ``RUN/multi_run/NAME/`` (a fleet directory, resumable, local or
on Ray as ``fleet.executor`` says; :func:`dpaudit.stages.fleet.train_fleet`) and the result in
``models/NAME/multi_run.json|npz`` (:meth:`dpaudit.rundir.ModelDir.write_multi_run`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.rundir import RunDir, read_json
from dpaudit.stages.artifacts import read_dp_record
from dpaudit.stages.prepare import PreparedData

log = logging.getLogger(__name__)

SIGNIFICANCE = 0.05  # of each bound; the verdict rests on the Clopper-Pearson bound alone

__all__ = ["SIGNIFICANCE", "multi_run_bounds", "multi_run_design", "multi_run_model"]


def multi_run_bounds(*, in_scores, out_scores, delta: float, significance: float = SIGNIFICANCE,
                     strategy=None) -> dict[str, Any]:
    """Clopper-Pearson bound, GDP estimate and ceiling of a multi-run audit.

    ``in_scores[i]``: the canary's score (higher = member) in run ``i`` trained with it;
    ``out_scores[i]``: in run ``i`` trained without it; one independent run per score.
    Jagielski et al. 2020 (arXiv 2006.07709) for the Clopper-Pearson bound, Nasr et al.
    2023 (arXiv 2302.07956) for the GDP estimate, both from
    :class:`dpaudit.audit.CanaryScores` at the same ``strategy`` (default: Bonferroni over
    :data:`dpaudit.audit.DEFAULT_FPR_GRID`). The ceiling is the Clopper-Pearson bound the
    same strategy gives on perfectly separated scores: the most these K runs can show.
    """
    from dpaudit.audit import CanaryScores

    scores = CanaryScores(in_scores=in_scores, out_scores=out_scores, seed=0)
    common = {"delta": delta, "significance": significance, "strategy": strategy}
    perfect = CanaryScores(in_scores=np.ones(scores.num_members), out_scores=np.zeros(scores.num_nonmembers))
    return {
        "num_in": scores.num_members,
        "num_out": scores.num_nonmembers,
        "auc": float(scores.auc()),
        "clopper_pearson": scores.epsilon_clopper_pearson(**common),
        "gdp": scores.epsilon_gdp(**common),
        "ceiling": float(perfect.epsilon_clopper_pearson(**common).epsilon),
    }


def multi_run_design(data: PreparedData, *, canary_id: str | None, num_runs: int):
    """``(canary, rows, keep)``: the training rows of the 2K runs and who trains on what.

    ``rows`` holds ``text``, ``unit_id`` and ``repetitions``: the audited model's training
    rows without the canary (each once), then the canary (``repetitions`` copies).
    ``keep[j]`` keeps every row but the canary's, which runs ``0 .. K-1`` keep and runs
    ``K .. 2K-1`` do not."""
    canaries = {c.id: c for c in data.canaries}
    if not canaries:
        raise InputError("the multi-run audit needs a canary: the run has none (canaries.num)")
    if canary_id is not None and canary_id not in canaries:
        raise InputError(f"config key audit.canary names no canary of this run: {canary_id!r} "
                         f"(e.g. {', '.join(list(canaries)[:3])})")
    canary = canaries[canary_id] if canary_id is not None else data.canaries[0]
    base = [(t, u) for t, u in zip(data.train_set["text"], data.train_set["unit_id"]) if u != canary.id]
    rows = {"text": [t for t, _ in base] + [canary.text], "unit_id": [u for _, u in base] + [canary.id],
            "repetitions": [1] * len(base) + [canary.repetitions]}
    keep = np.ones((2 * num_runs, len(base) + 1), dtype=bool)
    keep[num_runs:, -1] = False
    return canary, rows, keep


def _pinned_config(config: Config, record) -> Config:
    """The audited model's config with its realised noise multiplier, delta and steps pinned
    (from its :class:`~dpaudit.accounting.DpRecord`), so every run is the audited mechanism
    (not one recalibrated to its own N)."""
    if record is None:
        return config
    train = config.train
    if record.steps:
        train = dataclasses.replace(train, steps=int(record.steps))
    if record.noise_multiplier:
        dp = dataclasses.replace(train.dp, noise_multiplier=float(record.noise_multiplier), target_epsilon=None,
                                 delta=float(record.delta) if record.delta else train.dp.delta)
        train = dataclasses.replace(train, dp=dp)
    return dataclasses.replace(config, train=train)


def _scores(model_dirs, tokenizer, text: str, config: Config) -> np.ndarray:
    """The ``audit.attack`` score of ``text`` under each model (higher = member)."""
    from dpaudit.attacks import AttackInputs, get_attack
    from dpaudit.models import load_model
    from dpaudit.signals.compute import compute_signals_many

    attack = get_attack(config.audit.attack, **config.attack.params.get(config.audit.attack, {}))
    signals = compute_signals_many((load_model(d) for d in model_dirs), tokenizer, [text], batch_size=1,
                                   max_length=config.data.max_length, device=config.train.device, progress=False)
    return np.array([float(attack.score(AttackInputs(target=s, texts=[text]))[0]) for s in signals])


def multi_run_model(rundir: RunDir, config: Config, name: str, data: PreparedData, *,
                    default_delta: float) -> dict[str, Any]:
    """``models/NAME/multi_run.json|npz``: the multi-run audit of model ``name`` (skipped when
    in place; an interrupted one resumes its fleet). ``default_delta`` is the delta of a
    non-private model's bounds. Returns the result as written."""
    import datasets

    from dpaudit.audit import Claim, assess
    from dpaudit.data.corpus import tokenize_dataset
    from dpaudit.stages.fleet import JOB_FILE, load_fleet, train_fleet
    from dpaudit.stages.train import effective_config, model_seed

    md = rundir.model(name)
    done = md.read_multi_run()
    if done is not None:
        return done
    if not md.is_trained():
        raise InputError(f"model {name} is not trained: the multi-run audit copies its training")
    k = config.audit.num_runs
    canary, rows, keep = multi_run_design(data, canary_id=config.audit.canary, num_runs=k)
    record = read_dp_record(md)
    cfg = _pinned_config(effective_config(rundir, config, name), record)
    cfg = dataclasses.replace(cfg, seed=model_seed(config.seed, f"multi_run/{name}"))  # runs of their own
    dataset = tokenize_dataset(datasets.Dataset.from_dict(rows), data.tokenizer, max_length=config.data.max_length)
    fleet_dir = rundir.multi_run_dir(name)
    log.info("multi-run audit of %s: %d runs with canary %s and %d without, in %s", name, k, canary.id, k, fleet_dir)
    start = time.perf_counter()
    train_fleet(fleet_dir=fleet_dir, candidates=dataset, tokenizer=data.tokenizer, config=cfg, keep=keep)
    wall = time.perf_counter() - start
    stored_keep, dirs = load_fleet(fleet_dir)
    if len(dirs) != 2 * k:
        raise InputError(f"the multi-run fleet in {fleet_dir} has {len(dirs)} of {2 * k} runs")
    scores = _scores(dirs, data.tokenizer, canary.text, cfg)
    included = stored_keep[:, -1]

    run_records = [read_dp_record(d) for d in dirs]  # a fleet model's run files, as a model's
    delta = float(record.delta if record is not None and record.delta else default_delta)
    claim = Claim.largest(run_records, delta=delta, group_size=canary.repetitions)
    stats = multi_run_bounds(in_scores=scores[included], out_scores=scores[~included], delta=delta)
    cp, gdp = stats["clopper_pearson"], stats["gdp"]
    verdict = assess(bounds=[(config.audit.attack, cp)], claim=claim, learned=None, ceiling=stats["ceiling"],
                     remedy=(f"the ceiling of {k} runs per side", "add runs (audit.num_runs)"))
    jobs = [read_json(d / JOB_FILE) for d in dirs]
    result = {
        "num_runs": k,
        "canary_id": canary.id,
        "canary_repetitions": canary.repetitions,
        "attack": config.audit.attack,
        "delta": delta,
        "claimed_epsilon": claim.claimed_epsilon,
        "auc": stats["auc"],
        "clopper_pearson": cp.to_dict(),
        "gdp": gdp.to_dict(),
        "ceiling": stats["ceiling"],
        "verdict": verdict.to_dict(),
        "noise_multiplier": cfg.train.dp.noise_multiplier if record is not None and record.noise_multiplier else None,
        "steps": cfg.train.steps,
        "trainer": cfg.train.trainer,
        "executor": cfg.fleet.executor,
        "seed": cfg.seed,
        "run_seeds": [j["seed"] for j in jobs],
        "train_time_s_mean": float(np.mean([j["wall_time_s"] for j in jobs])),
        "wall_time_s": round(wall, 3),
    }
    md.write_multi_run(result, in_scores=scores[included], out_scores=scores[~included])
    log.info("multi-run audit of %s: Clopper-Pearson epsilon >= %.3f (ceiling %.3f, claim %s): %s", name, cp.epsilon,
             stats["ceiling"], "none" if claim.claimed_epsilon is None else f"{claim.claimed_epsilon:.3f}", verdict.status)
    return md.read_multi_run()
