"""Attack stage: signals of a model (and of the shared reference fleet), every membership
attack, and their metrics on two splits: member vs held-out records, and included vs
excluded canaries; the latter also gives empirical epsilon lower bounds.

Scores are higher for members (DESIGN.md, section 4). Signals are cached, so rerunning the
stage after an interrupt only recomputes the attacks, which are cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.rundir import ModelDir, RunDir
from dpaudit.stages.artifacts import read_dp_record, read_tokenizer
from dpaudit.stages.ladder import rung_significance
from dpaudit.stages.signal_cache import cached_signals

log = logging.getLogger(__name__)

FPRS = (0.1, 0.01, 0.001)
DEFAULT_DELTA = 1e-5  # for canary bounds of a run without DP models, where no delta was chosen
SIGNIFICANCE = 0.05  # of the largest bound over all attacks (Bonferroni over the attacks)


def run_attacks(
    inputs, *, names: Sequence[str] | None, params: dict[str, dict[str, Any]] | None = None
) -> dict[str, np.ndarray]:
    """Scores (higher = member) of each named attack, or of every attack the inputs allow;
    ``params[name]`` holds keyword parameters of attack ``name`` (defaults otherwise)."""
    from dpaudit.attacks import available_attacks, get_attack, runnable_attacks

    if names is None:
        names = runnable_attacks(inputs)
    else:
        unknown = sorted(set(names) - set(available_attacks()))
        if unknown:
            raise InputError(f"unknown attack(s) {', '.join(unknown)}: known are {', '.join(available_attacks())}")
    scores = {}
    for name in names:
        attack = get_attack(name, **(params or {}).get(name, {}))
        if not attack.can_run(inputs):
            raise InputError(f"attack {name!r} needs {', '.join(sorted(attack.requires))}, which this audit lacks")
        scores[name] = attack.score(inputs)
    return scores


def split_metrics(
    scores: np.ndarray, labels: np.ndarray, *, bounds_delta: float | None, seed: int, significance: float = SIGNIFICANCE,
    inclusion_prob: float = 0.5, claimed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """AUC (with a bootstrap interval), TPR at FPR, balanced accuracy; with ``bounds_delta``
    also the epsilon lower bounds of a canary audit at ``significance``, each.

    The one-run bounds (Steinke et al. 2023, arXiv 2305.08846; the estimates of Mahloujifar
    et al. 2024, arXiv 2410.22235, and Xiang et al. 2025, arXiv 2509.08704) assume each canary went in with probability 1/2; at any other
    ``inclusion_prob`` they are not computed (a guess "in" is right more often than the
    analysis allows, so null scores would give a positive bound) and the split says why.
    ``claimed`` (the DP-SGD parameters of :func:`dpaudit.accounting.dpsgd_parameters`) adds
    the test of the guesses against the claimed trade-off curve (``claimed_curve``)."""
    from dpaudit.audit import CanaryScores, claimed_curve_bound

    labels = np.asarray(labels, dtype=bool)
    cs = CanaryScores.from_labels(scores=scores, is_member=labels, seed=seed)
    ci = cs.bootstrap_ci("auc", num_samples=200, confidence=0.95, seed=seed)
    out: dict[str, Any] = {
        "auc": float(cs.auc()),
        "auc_ci": [ci.low, ci.high],
        "tpr_at_fpr": {str(a): cs.tpr_at_fpr(a).value for a in FPRS},
        "balanced_accuracy": float(cs.balanced_accuracy()),
        "num_in": int(labels.sum()),
        "num_out": int((~labels).sum()),
    }
    if bounds_delta is not None:
        methods = ("one_run", "one_run_fdp", "order_statistics", "gdp") if inclusion_prob == 0.5 else ("gdp",)
        out["epsilon_lower_bounds"] = {
            name: cs.bound(name, delta=bounds_delta, significance=significance).to_dict() for name in methods
        }
        if claimed is not None and inclusion_prob == 0.5:
            out["epsilon_lower_bounds"]["claimed_curve"] = claimed_curve_bound(
                cs, **claimed, delta=bounds_delta, significance=significance).to_dict()
        if inclusion_prob != 0.5:
            out["one_run_refused"] = (f"canaries went in with probability {inclusion_prob:g}; the one-run bounds "
                                      f"hold only at 1/2 (canaries.inclusion_prob)")
    return out


def model_id(model_dir: Path) -> str:
    """Identity of saved weights for a signal cache that lives beside them: file name, size
    and modification time (not the path, so a copied run directory keeps its cache)."""
    parts = []
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts) or Path(model_dir).name


def attack_texts(data) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The texts every model is scored on (records, then canaries), and the labels of both
    splits, from the run's :class:`~dpaudit.stages.prepare.PreparedData`."""
    candidates, canaries = data.candidates, data.canaries
    texts = [c["text"] for c in candidates] + [c.text for c in canaries]
    return texts, np.array([c["role"] == "member" for c in candidates]), np.array([c.included for c in canaries], bool)


def reference_signals(rundir: RunDir, config, fleet, texts: list[str], tokenizer):
    """Signals of the fleet's models (cached in ``signals/``) and their keep matrix. Without a
    fleet, the base model every model fine-tunes (``base/``, or the user's ``model.base_model``)
    is the one reference, out for every text: it trained on no record and no canary, so
    calibrating by it (Watson et al. 2022, arXiv 2111.08440) keeps the canary bounds sound.
    None of either: no reference."""
    from dpaudit.models import load_model

    kw = dict(batch_size=config.attack.batch_size, max_length=config.data.max_length, device=config.train.device)
    if fleet is None:
        from dpaudit.attacks import get_attack

        wanted = config.attack.attacks
        base = start_model(rundir, config, tokenizer)
        if base is None or (wanted and not any("references" in get_attack(a).requires for a in wanted)):
            return (), None
        ref = cached_signals(rundir.root, "base", load_model(base, trust_remote_code=config.model.trust_remote_code),
                             tokenizer, texts, model_id=model_id(Path(base)) if Path(base).is_dir() else str(base), **kw)
        return (ref,), None
    keep, dirs = fleet
    refs = tuple(cached_signals(rundir.root, f"reference-{j:03d}", load_model(d), tokenizer, texts,
                                model_id=model_id(d), **kw) for j, d in enumerate(dirs))
    return refs, keep


def start_model(rundir: RunDir, config, tokenizer) -> Path | str | None:
    """The weights every model of the run starts from, when they are saved as they are: the
    run's ``base/``, or the user's ``model.base_model`` when its embedding covers the
    tokenizer (else the train stage grew it into ``base/``: a run trained before it did has
    none); None for models built fresh."""
    if rundir.base_complete():
        return rundir.base_dir
    base = config.model.base_model
    if base is None:
        return None
    from dpaudit.models import load_model_config

    rows = getattr(load_model_config(base, trust_remote_code=config.model.trust_remote_code), "vocab_size", None)
    return base if rows is not None and rows >= len(tokenizer) else None


def claimed_family(record, config) -> dict[str, Any] | None:
    """The DP-SGD parameters whose trade-off curve the canaries are tested against, or None:
    the record (a :class:`~dpaudit.accounting.DpRecord`) must be plain Poisson-sampled DP-SGD,
    each canary one protected unit (not r copies at note level, which the per-unit curve does
    not cover) and in with probability 1/2."""
    if record is None:
        return None
    group = config.canaries.repetitions > 1 and record.unit == "example"
    if group or config.canaries.inclusion_prob != 0.5:
        return None
    return record.dpsgd_parameters


def run_delta(rundir: RunDir, names: Sequence[str]) -> float:
    """The delta of canary bounds for a model without one of its own (non-private): the
    smallest delta of the run's DP models, so every point of the report stands at one delta."""
    records = [read_dp_record(rundir.model(n)) for n in names if rundir.model(n).is_trained()]
    return min((float(r.delta) for r in records if r is not None and r.delta), default=DEFAULT_DELTA)


def attack_model(rundir: RunDir, config, md: ModelDir, *, texts: list[str], record_labels: np.ndarray,
                 canary_labels: np.ndarray, references, keep, attacks: Sequence[str] | None = None,
                 default_delta: float = DEFAULT_DELTA, tokenizer=None) -> dict[str, Any]:
    """``models/NAME/results/``: every attack on one model; returns the records' metrics.
    ``tokenizer``: the run's, when the caller has it loaded already."""
    from dpaudit.attacks import AttackInputs, get_attack
    from dpaudit.models import load_model

    kw = dict(batch_size=config.attack.batch_size, max_length=config.data.max_length, device=config.train.device)
    tokenizer = tokenizer or read_tokenizer(rundir)
    target = cached_signals(md.root, "target", load_model(md.weights), tokenizer, texts,
                            model_id=model_id(md.weights), **kw)
    inputs = AttackInputs(target=target, texts=texts, references=tuple(references), reference_keep=keep)
    params = config.attack.params
    scores = run_attacks(inputs, names=attacks if attacks is not None else config.attack.attacks or None, params=params)

    record = read_dp_record(md)
    delta = float(record.delta if record is not None and record.delta else default_delta)
    claimed = claimed_family(record, config)
    # the largest sound bound over the attacks (and both sound tests) holds at the rung's significance
    significance = rung_significance(config) / (len(scores) * (2 if claimed else 1))
    n = len(record_labels)
    summary = {}
    for name, s in scores.items():
        records = split_metrics(s[:n], record_labels, bounds_delta=None, seed=config.seed)
        splits = {"members": (s[:n], record_labels, records)}
        if canary_labels.any() and not canary_labels.all():
            canary = split_metrics(s[n:], canary_labels, bounds_delta=delta, seed=config.seed, significance=significance,
                                   inclusion_prob=config.canaries.inclusion_prob, claimed=claimed)
            splits["canaries"] = (s[n:], canary_labels, canary)
        md.write_results(name, params=get_attack(name, **params.get(name, {})).get_params(), splits=splits)
        summary[name] = records
    if attacks is None:
        md.write_attack_index(sorted(scores))  # last: the stage is complete for this model
    return summary
