"""Ladder stage: the threat-model ladder of every DP model of a run (``audit.ladder.enabled``).

For each DP model, three sound one-run bounds on its claim (epsilon, delta, unit), each at
``audit.significance / 3`` so that the model's verdict holds at ``audit.significance``
jointly (:mod:`dpaudit.audit.ladder`):

- ``released``: the model's own canaries, scored on the model (the attack stage's bounds);
- ``input_space``: a twin of the model, trained by the model's own trainer with the same
  claim in ``dpaudit validate``'s isolated design: ``audit.ladder.input_space_canaries``
  fresh-token canaries (``new_token_bare``, its pool sized to them), only the input embedding
  training (so only their rows move; a tied output layer is untied and frozen), full batch
  (q = 1) for ``TWIN_STEPS`` steps, plain SGD at learning rate 0.01, no evaluation (its loss
  says nothing of the canaries), from the run's base model
  grown by the canaries' tokens, on a corpus of
  ``audit.ladder.twin_patients`` patients (only the canaries matter); scored by the base-
  calibrated reference attack on the twin's final model;
- ``white_box``: ``audit.ladder.gradient_canaries`` Dirac gradient canaries inside the twin's
  DP-SGD run (:mod:`dpaudit.train.gradient_canaries`), scored from every step's noisy sum,
  refused when their inclusions do not follow the claimed sampler, or when they ran another
  (T, q) than the DP record claims (then the model's verdict is violated).

The twins are a run of their own in ``RUN/ladder/`` (resumable like any run); the rungs go
to ``models/NAME/ladder.json``. A model whose trainer the toolkit cannot rerun (a user's own
loop, :class:`dpaudit.Audit`: ``reruns = False``) has no twin: its ``input_space`` rung is
refused and its ``white_box`` rung is its own run's gradient canaries.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.audit.ladder import RUNGS, Rung
from dpaudit.audit.results import BoundResult
from dpaudit.config import Config, TrainConfig, load_config
from dpaudit.plugins import reruns
from dpaudit.progress import Progress
from dpaudit.rundir import RunDir, staged_directory
from dpaudit.stages.artifacts import read_dp_record, read_ladder, write_ladder

log = logging.getLogger(__name__)

TWIN_DIR = "ladder"
# At q = 1 a run of T steps is the Gaussian mechanism with mu = sqrt(T) / sigma, and at a fixed
# epsilon that mu does not depend on T: the twin's power is the same at any T, its cost is not.
TWIN_STEPS = 3
TWIN_MICROBATCH = 64  # the canaries are 2 tokens long: large micro-batches, few Python steps


def rung_significance(config: Config) -> float:
    """The significance of each rung: ``audit.significance`` shared by the ladder's rungs
    (all of it when there is no ladder)."""
    return config.audit.significance / (len(RUNGS) if config.audit.ladder.enabled else 1)


def ladder_run(rundir: RunDir, config: Config, *, run: Callable[..., Any]) -> None:
    """``models/NAME/ladder.json`` for every trained DP model that lacks one. ``run`` is
    :func:`dpaudit.stages.run`, which trains and attacks the twins (passed in: the run calls
    this stage)."""
    if not config.audit.ladder.enabled:
        return
    records = {n: read_dp_record(rundir.model(n)) for n in config.model_names() if rundir.model(n).is_trained()}
    names = [n for n, r in records.items() if r is not None and r.private and read_ladder(rundir.model(n)) is None]
    if not names:
        return
    rerun = [n for n in names if reruns(config.for_model(n).train.trainer)]
    twin = _train_twins(rundir, config, {n: records[n] for n in rerun}, run=run) if rerun else None
    twin_cfg = twin.read_config() if twin is not None else None
    with Progress(total=len(names), desc="ladder", unit="model") as bar:
        for name in names:
            own = [] if name in rerun else [
                Rung(rung="input_space", bound=None, attack=None, significance=None, ideal=None, ideal_range=None,
                     num_canaries=0, regime={}, refused="the model's trainer (a user's own loop) cannot be rerun as an isolated twin"),
                white_box_rung(rundir, config, name)]
            rungs = [released_rung(rundir, config, name, records[name]), *(own or _twin_rungs(twin, twin_cfg, name))]
            write_ladder(rundir.model(name), rungs)
            log.info("ladder of %s: %s", name, ", ".join(
                f"{r.rung} {r.epsilon:.2f} (ideal {r.ideal:.2f})" if r.bound is not None else f"{r.rung} refused"
                for r in rungs))
            bar.update(1)


# --------------------------------------------------------------------------- the twins


def _twin_canary_set(rundir: RunDir, config: Config) -> Path:
    """``RUN/ladder/canaries.yaml``: the isolated set (``new_token_bare``) with a pool of just
    the tokens the rung's ``input_space_canaries`` canaries use (each token in one canary), so
    that the twins' vocabulary grows by what the rung needs at any m, and ``dpaudit validate``'s
    set keeps its own pool."""
    import yaml

    from dpaudit.canaries import load_canary_spec
    from dpaudit.stages.isolated import ISOLATED_CANARIES

    spec = load_canary_spec(ISOLATED_CANARIES)
    secret = spec["secret"]
    spec = {**spec, "secret": {**secret, "pool_size": config.audit.ladder.input_space_canaries * secret["length"]}}
    path = rundir.root / TWIN_DIR / "canaries.yaml"
    text = yaml.safe_dump(spec, sort_keys=False)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def _twin_base(rundir: RunDir, config: Config, canary_set: Path) -> Path | None:
    """``RUN/ladder/base``: the model every model of the run starts from, its embedding grown
    by the tokens of ``canary_set``, so that the twins start from it and the reference attack
    calibrates by it. Every row of a token the pretrained model lacks, the twins' and the
    run's own new-token canaries', gets one value at which those tokens take at most 1% of the
    next-token probability after a twin canary's first token
    (:func:`dpaudit.models.mute_token_rows`): the twins' signal lies on their input rows and
    comes back through that prediction, which the run's isolated rows
    (:func:`dpaudit.models.isolate_token_rows`), or rows at the pretrained rows' mean on some
    bases, would take and leave their gradients far below the clipping norm. None without a
    starting model."""
    from dpaudit.canaries import add_canary_tokens, canary_token_ids
    from dpaudit.data.tokenizer import load_tokenizer
    from dpaudit.models import grow_vocabulary, load_model, mute_token_rows, save_model

    out = rundir.root / TWIN_DIR / "base"
    if (out / "config.json").is_file():
        return out
    start = rundir.base_dir if rundir.base_complete() else config.model.base_model
    if start is None:
        return None
    trust = config.model.trust_remote_code
    tokenizer = load_tokenizer(start, trust_remote_code=trust)
    add_canary_tokens(tokenizer, str(canary_set))
    twins, run_pool = canary_token_ids(tokenizer, str(canary_set)), canary_token_ids(tokenizer, config.canaries.set)
    with staged_directory(out) as stage:
        model = load_model(start, trust_remote_code=trust)
        grow_vocabulary(model, len(tokenizer))
        left = mute_token_rows(model, token_ids=sorted({*twins, *run_pool}), example_ids=twins[:2])
        if left > 0.05:
            log.warning("twins' base: the new tokens keep %.2f of the next-token probability after a twin canary's "
                        "first token; its gradient may fall below the clipping norm", left)
        save_model(model, tokenizer, stage)
    return out  # the twins' reference too (dpaudit.stages.attack.start_model finds it)


def twin_config(config: Config, records: dict, *, base: Path, canary_set: Path, batch_sizes: dict[str, int]) -> Config:
    """The run of the twins: for each DP model, its own trainer and claim (epsilon at its
    delta, its unit) in the isolated design (the module docstring), with ``canary_set``."""
    from dpaudit.stages.isolated import ISOLATED_TRAINABLE, LINEAR_TRAIN

    lad = config.audit.ladder
    raw = config.to_dict()
    raw["data"]["num_patients"] = lad.twin_patients
    raw["canaries"] = {"set": str(canary_set), "num": lad.input_space_canaries, "repetitions": 1,
                       "inclusion_prob": 0.5, "secrets": {"num": 0}}
    raw["model"].update(base_model=str(base), architecture=None, trainable=ISOLATED_TRAINABLE,
                        lora={"enabled": False})
    raw["pretrain"]["enabled"] = False
    raw["fleet"]["num_models"] = 0
    raw["attack"] = {**raw["attack"], "attacks": ["reference"], "params": {}}
    raw["audit"] = {"mode": "one_run", "significance": rung_significance(config), "ladder": {"enabled": False}}
    models = []
    for name, record in records.items():
        train = dataclasses.asdict(config.for_model(name).train)
        dp = {**train["dp"], "noise_multiplier": None, "target_epsilon": record.epsilon(), "delta": record.delta,
              "unit": record.unit, "gradient_canaries": lad.gradient_canaries}
        models.append({"name": name, "train": {**train, **LINEAR_TRAIN, "weight_decay": 0.0, "schedule": "constant",
                                                "warmup_steps": 0, "dp": dp, "steps": TWIN_STEPS,
                                                "batch_size": batch_sizes[record.unit], "eval_every": 10**9,
                                                "max_eval_examples": 0, "microbatch_size": TWIN_MICROBATCH}})
    raw["models"] = models
    return load_config(raw)


def _train_twins(rundir: RunDir, config: Config, records: dict, *, run: Callable[..., Any]) -> RunDir | None:
    """Train (or resume) the twins in ``RUN/ladder/``; None without a base model to start from."""
    from dpaudit.stages.isolated import full_batch_size

    canary_set = _twin_canary_set(rundir, config)
    base = _twin_base(rundir, config, canary_set)
    if base is None:
        return None
    probe = twin_config(config, records, base=base, canary_set=canary_set,
                        batch_sizes=dict.fromkeys(("example", "user"), 1))
    sizes = {unit: full_batch_size(dataclasses.replace(probe, train=dataclasses.replace(
        probe.train, dp=dataclasses.replace(probe.train.dp, unit=unit))))
        for unit in sorted({r.unit for r in records.values()})}
    twin = twin_config(config, records, base=base, canary_set=canary_set, batch_sizes={**dict.fromkeys(("example", "user"), 1), **sizes})
    result = run(twin, out=rundir.root / TWIN_DIR / "run", until="attack")
    if result.failed:
        log.warning("twin runs failed: %s", "; ".join(f"{k}: {v}" for k, v in result.failed.items()))
    return result.rundir


# --------------------------------------------------------------------------- the rungs


def _regime(record) -> dict:
    return {"noise_multiplier": record.noise_multiplier, "sample_rate": record.sample_rate, "steps": record.steps,
            "epsilon": record.epsilon(), "delta": record.delta, "unit": record.unit}


def _best_canary_bound(md) -> tuple[str | None, object | None, int]:
    """(attack, best sound canary bound, number of attacks) of a model's attack results."""
    best, attack, attacks = None, None, 0
    for name, r in md.read_results().items():
        bounds = (r["splits"].get("canaries") or {}).get("epsilon_lower_bounds") or {}
        if bounds:
            attacks += 1
        for method, b in bounds.items():
            result = BoundResult.from_dict({"method": method, **b})
            if result.sound and (best is None or result.epsilon > best.epsilon):
                best, attack = result, name
    return attack, best, attacks


def canary_rung(rung: str, *, bound, attack: str | None, attacks: int, record, config: Config, num_canaries: int,
                cost_s: float | None, refused: str, train: TrainConfig | None = None) -> Rung:
    """A rung of input canaries: its best sound ``bound`` (over ``attacks`` attacks, each at
    the rung's significance shared out), against the final-model ideal of its regime (the
    record's sigma, q and T, and the optimizer and schedule of ``train`` when the toolkit's
    loop trained the model: else plain SGD at a constant rate), with the same tests and
    significance per attack."""
    from dpaudit.audit.ladder import ideal_bounds
    from dpaudit.train.plan import optimizer_response

    regime = _regime(record) if record is not None else {}
    if bound is None:
        return Rung(rung=rung, bound=None, attack=None, significance=None, ideal=None, ideal_range=None,
                    num_canaries=num_canaries, regime=regime, cost_s=cost_s, refused=refused)
    ideal = None
    if record is not None and record.dpsgd_parameters is not None:
        optimizer = None if train is None else optimizer_response(train, record.steps)
        if optimizer is not None:
            regime.update(optimizer=train.optimizer, schedule=train.schedule)
        ideal = ideal_bounds(**record.dpsgd_parameters, num_canaries=num_canaries, delta=bound.delta,
                             significance=rung_significance(config) / max(1, attacks),
                             methods=("one_run", "claimed_curve"), trials=config.audit.ladder.trials,
                             seed=config.seed, optimizer=optimizer)
    return Rung(rung=rung, bound=bound, attack=attack, significance=rung_significance(config),
                ideal=None if ideal is None else float(np.median(ideal)),
                ideal_range=None if ideal is None else (min(ideal), max(ideal)), num_canaries=num_canaries,
                regime=regime, cost_s=cost_s)


def train_seconds(md) -> float | None:
    """Seconds the model of ``md`` took to train, from its training log (None without one)."""
    log_ = md.read_train_log()
    return log_[-1].get("elapsed_s") if log_ else None


def released_rung(rundir: RunDir, config: Config, name: str, record) -> Rung:
    """The released model's canaries: its best sound bound (the attack stage's), against the
    final-model ideal of its regime."""
    md = rundir.model(name)
    attack, bound, attacks = _best_canary_bound(md)
    return canary_rung("released", bound=bound, attack=attack, attacks=attacks, record=record, config=config,
                       num_canaries=config.canaries.num, cost_s=train_seconds(md), train=config.for_model(name).train,
                       refused="no sound canary bound (the attack stage wrote none)")


def _twin_rungs(twin: RunDir | None, config: Config | None, name: str) -> list[Rung]:
    """The input-space and white-box rungs of model ``name``'s twin (``config``: the twins')."""
    if twin is None or not twin.model(name).is_trained():
        why = "no base model to start the isolated twin from" if twin is None else "the twin did not train"
        return [Rung(rung=r, bound=None, attack=None, significance=None, ideal=None, ideal_range=None,
                     num_canaries=0, regime={}, refused=why) for r in ("input_space", "white_box")]
    return [input_space_rung(twin, config, name), white_box_rung(twin, config, name)]


def input_space_rung(twin: RunDir, config: Config, name: str) -> Rung:
    """The isolated canaries of model ``name`` of the run ``twin`` (``config``: that run's),
    against the ideal of its regime (q = 1)."""
    md = twin.model(name)
    attack, bound, attacks = _best_canary_bound(md)
    return canary_rung("input_space", bound=bound, attack=attack, attacks=attacks, record=read_dp_record(md),
                       config=config, num_canaries=config.canaries.num, cost_s=train_seconds(md),
                       refused="no sound canary bound on the twin")


def white_box_rung(twin: RunDir, config: Config, name: str, *, delta: float | None = None) -> Rung:
    """The gradient canaries of model ``name`` of the run ``twin`` (``config``: that run's):
    the claimed-curve test at ``delta`` (default: the record's) at the guess fraction
    pre-registered by simulating the claim, refused when they ran another (T, q) than the DP
    record claims (:data:`~dpaudit.audit.assess.NOT_THE_CLAIMED_MECHANISM`, which the verdict
    counts as a violation) or when their inclusions do not follow the claimed sampler."""
    from dpaudit.audit import BonferroniStrategy, CanaryScores
    from dpaudit.audit.assess import MISMATCH_RTOL, NOT_THE_CLAIMED_MECHANISM
    from dpaudit.audit.gradient_canaries import inclusion_check
    from dpaudit.audit.ladder import choose_guess_fraction, ideal_bounds, rung_bound
    from dpaudit.stages.artifacts import read_gradient_canaries

    md = twin.model(name)
    record = read_dp_record(md)
    canaries = read_gradient_canaries(md)
    regime = _regime(record) if record is not None else {}
    m = 0 if canaries is None else int(canaries.included.size)

    def refused(why: str) -> Rung:
        return Rung(rung="white_box", bound=None, attack=None, significance=None, ideal=None, ideal_range=None,
                    num_canaries=m, regime=regime, refused=why)

    if canaries is None or record is None:
        return refused("the trainer ran no gradient canaries (train.dp.gradient_canaries)")
    if record.dpsgd_parameters is None:
        return refused("the trainer's DP record is not plain DP-SGD: no claimed curve to test")
    # another (T, q) than the record's is evidence against the accounting (the verdict's
    # violation, dpaudit.report.model), whatever the inclusion check says; a failed inclusion
    # check is no evidence (it refuses honest runs at its p-value threshold)
    if canaries.steps != record.steps or not math.isclose(canaries.sample_rate, record.sample_rate,
                                                          rel_tol=MISMATCH_RTOL):
        return refused(f"the gradient canaries ran {canaries.steps} steps at q = {canaries.sample_rate:.4g}, the "
                       f"DP record claims {record.steps} at q = {record.sample_rate:.4g}: {NOT_THE_CLAIMED_MECHANISM}")
    consistent, detail = inclusion_check(canaries)
    if not consistent:
        return refused(f"the gradient canaries' inclusions do not follow the claimed sampler: {detail}")
    start = time.perf_counter()
    sig = rung_significance(config)
    common = {"noise_multiplier": record.noise_multiplier, "sample_rate": record.sample_rate, "steps": record.steps}
    delta = record.delta if delta is None else delta
    g = choose_guess_fraction(**common, num_canaries=m, delta=delta, significance=sig, seed=config.seed)
    strategy = BonferroniStrategy(grid=(g,))
    scores = np.asarray(canaries.scores, dtype=float) / record.max_grad_norm
    cs = CanaryScores.from_labels(scores=scores, is_member=canaries.included, seed=config.seed)
    bound = rung_bound(cs, methods=("claimed_curve",), **common, delta=delta, significance=sig, strategy=strategy)
    ideal = ideal_bounds(**common, num_canaries=m, delta=delta, significance=sig, methods=("claimed_curve",),
                         strategy=strategy, trials=config.audit.ladder.trials, seed=config.seed + 1)
    return Rung(rung="white_box", bound=bound, attack=None, significance=sig, ideal=float(np.median(ideal)),
                ideal_range=(min(ideal), max(ideal)), num_canaries=m, regime=regime,
                cost_s=round(time.perf_counter() - start, 3))

