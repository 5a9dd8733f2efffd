"""``dpaudit audit-model``: black-box membership audit of a released model from two text files.

The output directory has the layout of a run with one model (``models/NAME/results/``),
so the same report reads it. No DP claim is known for such a model: its privacy is
"unknown", never "non-private". Reference models are the user's (``--reference-model``,
"out" for every audited text) or trained here on a population (``--population FILE
--train-references N``, :mod:`dpaudit.stages.references`), or both.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.rundir import ModelDir, RunDir, staged_directory
from dpaudit.stages.artifacts import write_manifest
from dpaudit.stages.attack import run_attacks, split_metrics


def read_texts(path: str | Path) -> list[str]:
    """Texts from jsonl (a ``text`` field per line) or txt (one text per line)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"text file not found: {path}")
    texts: list[str] = []
    try:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if path.suffix in (".jsonl", ".json"):
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        raise InputError(f"{path}:{number} is not valid JSON") from None
                    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                        raise InputError(f"{path}:{number} has no string field 'text'")
                    texts.append(record["text"])
                else:
                    texts.append(line.rstrip("\n"))
    except UnicodeDecodeError as err:
        raise InputError(f"{path} is not UTF-8 text ({err.reason}): save it as UTF-8") from None
    if not texts:
        raise InputError(f"{path} holds no texts")
    return texts


def read_units(path: str | Path) -> list[str] | None:
    """The ``unit_id`` of every record of a jsonl file (one person's records share one), or
    None when a record has none (or the file is not jsonl)."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".json"):
        return None
    units = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                unit = json.loads(line).get("unit_id")
                if unit is None:
                    return None
                units.append(str(unit))
    return units


def model_free_baseline(members: list[str], nonmembers: list[str], *,
                        groups: list[str] | None = None) -> dict[str, Any]:
    """The blind baseline of the split (:func:`dpaudit.blind.blind_baseline`, grouped by
    ``groups`` when given), or ``{"auc": None, "reason"}`` when a side has too few texts (or
    groups) to cross-validate."""
    from dpaudit.blind import blind_baseline

    try:
        return blind_baseline(members=members, nonmembers=nonmembers, folds=5, seed=0, groups=groups)
    except InputError as err:
        return {"auc": None, "auc_ci": None, "shifted": None, "length_differs": None, "reason": str(err)}


def audit_model(
    model_dir: str | Path,
    *,
    members: str | Path,
    nonmembers: str | Path,
    reference_models: Sequence[str | Path] = (),
    population: str | Path | None = None,
    train_references: int = 0,
    reference_base: str | Path | None = None,
    reference_config: str | Path | None = None,
    reference_design: str = "online",
    out: str | Path,
    attacks: Sequence[str] | None = None,
    batch_size: int = 16,
    max_length: int = 512,
    device: str = "auto",
    trust_remote_code: bool = False,
    progress: bool = True,
    choose: Callable[[Any, int], int | None] | None = None,
) -> dict[str, Any]:
    """Every attack the inputs allow, measured on the given members against the given
    non-members; results in ``OUT/models/<model dir name>/results/``. Before the attacks'
    AUCs mean anything, a model-free classifier is cross-validated on the same split (the
    blind baseline of Das et al. 2024, arXiv 2406.16201), recorded in ``audit_inputs.json``
    with each attack's lift over it; no epsilon is ever derived from such a natural split.

    With ``population`` and ``train_references`` N, N reference models are trained first
    (:mod:`dpaudit.stages.references`: ``reference_design`` "online" puts every audited
    text in a random half of them, "offline" in none; ``reference_base`` and
    ``reference_config`` say how they train) into ``OUT/references/``, where a rerun finds
    them; ``audit_inputs.json["references"]`` says how, on what, and how their held-out
    loss compares with the target's. Every input is checked before anything is written.
    Before they train, their estimated cost is printed on stderr; ``choose`` (the command
    line's prompt on a terminal) is then asked ``choose(estimate, N)`` for the number to
    train: ``N``, a smaller one, or None to stop before anything is written."""
    from dpaudit.attacks import AttackInputs, get_attack
    from dpaudit.data.tokenizer import load_tokenizer
    from dpaudit.models import check_tokenizer_fits, load_model
    from dpaudit.signals.compute import compute_signals

    member_texts, nonmember_texts = read_texts(members), read_texts(nonmembers)
    texts = member_texts + nonmember_texts
    labels = np.array([True] * len(member_texts) + [False] * len(nonmember_texts))
    kw = dict(batch_size=batch_size, max_length=max_length, device=device, progress=progress)
    units = [read_units(members), read_units(nonmembers)]
    if (population is None) != (not train_references):
        raise InputError("--population FILE and --train-references N go together")

    def plan_for(num_models: int):
        from dpaudit.stages.references import plan_references

        return plan_references(
            model_dir=model_dir, num_models=num_models, population=read_texts(population),
            population_units=read_units(population), population_path=population,
            targets=[(str(members), member_texts), (str(nonmembers), nonmember_texts)],
            target_units=units[0] + units[1] if None not in units else None, base=reference_base,
            config=reference_config, design=reference_design, max_length=max_length,
            trust_remote_code=trust_remote_code)

    plan = plan_for(train_references) if population is not None else None

    def signals_of(path):
        model = load_model(path, trust_remote_code=trust_remote_code)
        try:
            tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
        except InputError:
            raise
        except (OSError, ValueError) as err:
            raise InputError(f"{path} has no usable tokenizer: {str(err).splitlines()[0]}") from None
        check_tokenizer_fits(path, tokenizer, trust_remote_code=trust_remote_code)
        return compute_signals(model, tokenizer, texts, **kw)

    target = signals_of(model_dir)
    references = tuple(signals_of(path) for path in reference_models)
    rundir = RunDir(out)
    keep, described = None, None
    if plan is not None:
        plan, own, described = _own_references(plan, plan_for, rundir=rundir, choose=choose, texts=texts,
                                               target=target, labels=labels, population=population, **kw)
        rows = np.vstack([np.zeros((len(references), len(texts)), bool), plan.target_keep()])
        keep = rows if rows.any() else None  # None: every reference is "out" for every text
        references += tuple(own)
    inputs = AttackInputs(target=target, texts=texts, references=references, reference_keep=keep)
    scores = run_attacks(inputs, names=attacks)

    rundir.root.mkdir(parents=True, exist_ok=True)
    summary = {}
    # staged: the model's results appear whole or not at all (a full disk leaves the old ones)
    with staged_directory(rundir.model(Path(model_dir).resolve().name or "model").root) as stage:
        md = ModelDir(stage)
        for name, s in scores.items():
            metrics = split_metrics(s, labels, bounds_delta=None, seed=0)
            md.write_results(name, params=get_attack(name).get_params(), splits={"members": (s, labels, metrics)})
            summary[name] = metrics
    blind = model_free_baseline(member_texts, nonmember_texts,
                                groups=units[0] + units[1] if None not in units else None)
    if blind.get("auc") is not None:  # below 0.5 the baseline is cross-validation's pessimism: chance, then
        for metrics in summary.values():
            metrics["lift_over_blind"] = metrics["auc"] - max(0.5, blind["auc"])
    rundir.write_audit_inputs({
        "blind_baseline": {**blind, "lift": {name: m.get("lift_over_blind") for name, m in summary.items()}},
        "model": str(model_dir),
        "reference_models": [str(p) for p in reference_models],
        "references": described,
        "members": {"path": str(members), "count": len(member_texts)},
        "nonmembers": {"path": str(nonmembers), "count": len(nonmember_texts)},
        "max_length": max_length,
    })
    write_manifest(rundir, seeds={"references": plan.config.seed} if plan is not None else {})
    return summary


def _own_references(plan, plan_for: Callable[[int], Any], *, rundir: RunDir, choose, texts, target,
                    labels: np.ndarray, population, **kw) -> tuple[Any, list, dict]:
    """Train (or find) the plan's reference models in ``OUT/references/`` after printing their
    cost and asking ``choose`` for their number; returns the plan as trained, the references'
    signals on ``texts`` (``kw``: the signals' settings) and what the report says of them."""
    from dpaudit.stages.references import describe, estimate_references, reference_signals, train_references

    estimate = estimate_references(plan, directory=rundir.references_dir)
    if estimate is not None:
        print(f"dpaudit audit-model: {estimate.text}", file=sys.stderr)
        chosen = choose(estimate, plan.num_models) if choose is not None and estimate.fresh else plan.num_models
        if chosen is None:
            raise InputError(f"stopped before training the reference models: nothing trained, nothing written "
                             f"in {rundir.root}")
        if chosen != plan.num_models:
            plan = plan_for(chosen)
            estimate = dataclasses.replace(estimate, seconds=(estimate.total_s / len(estimate.seconds),) * chosen)
    rundir.root.mkdir(parents=True, exist_ok=True)
    trained = train_references(plan, directory=rundir.references_dir, progress=kw["progress"], estimate=estimate)
    own = reference_signals(trained["dirs"], texts, directory=rundir.references_dir, **kw)
    described = describe(plan, trained, target=target, references=own, nonmembers=np.flatnonzero(~labels),
                         population_path=population)
    return plan, own, described
