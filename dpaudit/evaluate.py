"""Attack stages: score candidates with every membership attack and measure the result.

``attack_run`` attacks a trained run directory on two splits: member vs held-out records,
and included vs excluded canaries (the latter also gives empirical epsilon lower bounds).
``audit_model`` is the black-box audit of a released model from two text files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.rundir import check_run_dir, manifest, read_json, write_json_atomic, write_npz_atomic

log = logging.getLogger(__name__)

FPRS = (0.1, 0.01, 0.001)
DEFAULT_DELTA = 1e-5  # for canary bounds of a non-private run, where no delta was chosen
SIGNIFICANCE = 0.05  # of the largest bound over all attacks (Bonferroni over the attacks)


# --------------------------------------------------------------------------- inputs


def read_texts(path: str | Path) -> list[str]:
    """Texts from jsonl (a ``text`` field per line) or txt (one text per line)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"text file not found: {path}")
    texts: list[str] = []
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
    if not texts:
        raise InputError(f"{path} holds no texts")
    return texts


# --------------------------------------------------------------------------- scoring


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
    scores: np.ndarray, labels: np.ndarray, *, bounds_delta: float | None, seed: int, significance: float = SIGNIFICANCE
) -> dict[str, Any]:
    """AUC (with a bootstrap interval), TPR at FPR, balanced accuracy; with ``bounds_delta``
    also the empirical epsilon lower bounds of canary audits at ``significance``."""
    from dpaudit.audit import CanaryScores

    labels = np.asarray(labels, dtype=bool)
    cs = CanaryScores(in_scores=scores[labels], out_scores=scores[~labels], seed=seed)
    ci = cs.bootstrap_ci("auc", num_samples=200, confidence=0.95, seed=seed)
    out: dict[str, Any] = {
        "auc": float(cs.auc()),
        "auc_ci": [ci.low, ci.high],
        "tpr_at_fpr": {str(a): _tpr(cs.tpr_at_fpr(a)) for a in FPRS},
        "balanced_accuracy": float(cs.balanced_accuracy()),
        "num_in": int(labels.sum()),
        "num_out": int((~labels).sum()),
    }
    if bounds_delta is not None:
        out["epsilon_lower_bounds"] = {
            "one_run": cs.epsilon_one_run(delta=bounds_delta, significance=significance).to_dict(),
            "one_run_fdp": cs.epsilon_one_run_fdp(delta=bounds_delta, significance=significance).to_dict(),
            "gdp": cs.epsilon_gdp(delta=bounds_delta, significance=significance).to_dict(),
        }
    return out


def _tpr(result) -> float | None:
    value = getattr(result, "value", result)
    return None if value is None or (isinstance(value, float) and np.isnan(value)) else float(value)


def write_results(out: Path, name: str, params: dict, splits: dict[str, tuple[np.ndarray, np.ndarray, dict]]) -> None:
    """``results/<attack>.json`` (metrics) and ``results/<attack>.npz`` (scores and labels)."""
    results = out / "results"
    results.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        results / f"{name}.json",
        {"schema_version": 1, "attack": name, "params": params, "splits": {k: v[2] for k, v in splits.items()}},
    )
    arrays = {}
    for split, (scores, labels, _) in splits.items():
        arrays[f"{split}_scores"] = np.asarray(scores, dtype=np.float64)
        arrays[f"{split}_labels"] = np.asarray(labels, dtype=bool)
    write_npz_atomic(results / f"{name}.npz", **arrays)


# --------------------------------------------------------------------------- stages


def attack_run(run_dir: str | Path, *, attacks: Sequence[str] | None = None, progress: bool = True) -> dict[str, Any]:
    """``dpaudit attack``: signals of the target (and reference fleet), then the attacks
    named in ``attacks`` (else in the run's ``attack.attacks``, else every runnable one)
    with the run's ``attack.params``, on member vs held-out records and on included vs
    excluded canaries."""
    from dpaudit.attacks import AttackInputs, get_attack
    from dpaudit.config import load_config
    from dpaudit.data.tokenizer import load_tokenizer
    from dpaudit.models import load_model
    from dpaudit.signals import cached_signals

    run_dir = check_run_dir(run_dir)
    config = load_config(run_dir / "config.resolved.yaml")
    candidates = [json.loads(x) for x in (run_dir / "candidates.jsonl").read_text().splitlines() if x.strip()]
    canaries = read_json(run_dir / "canaries.json")["canaries"]
    texts = [c["text"] for c in candidates] + [c["text"] for c in canaries]
    n_records = len(candidates)
    record_labels = np.array([c["role"] == "member" for c in candidates])
    canary_labels = np.array([c["included"] for c in canaries], dtype=bool)

    kw = dict(batch_size=config.attack.batch_size, max_length=config.data.max_length,
              device=config.train.device, progress=progress)
    tokenizer = load_tokenizer(run_dir / "model")
    model = load_model(run_dir / "model")
    target = cached_signals(run_dir, "target", model, tokenizer, texts, model_id=_model_id(run_dir / "model"), **kw)
    if canaries:
        write_extraction(run_dir, model, tokenizer, canaries, batch_size=kw["batch_size"], device=kw["device"])
    del model
    references, keep = [], None
    if config.fleet.num_models > 0:
        keep, ref_dirs = _fleet(run_dir, config, candidates, canaries, tokenizer)
        for j, ref_dir in enumerate(ref_dirs):
            references.append(cached_signals(run_dir, f"reference-{j:03d}", load_model(ref_dir), tokenizer, texts,
                                             model_id=_model_id(ref_dir), **kw))
        keep = keep[: len(references)]
    inputs = AttackInputs(target=target, texts=texts, references=tuple(references), reference_keep=keep)
    params = config.attack.params
    scores = run_attacks(inputs, names=attacks if attacks is not None else config.attack.attacks or None, params=params)

    delta = _run_delta(run_dir)
    significance = SIGNIFICANCE / len(scores)  # the max over attacks holds at SIGNIFICANCE
    summary = {}
    for name, s in scores.items():
        records = split_metrics(s[:n_records], record_labels, bounds_delta=None, seed=config.seed)
        splits = {"members": (s[:n_records], record_labels, records)}
        if canary_labels.any() and not canary_labels.all():
            canary = split_metrics(s[n_records:], canary_labels, bounds_delta=delta, seed=config.seed,
                                   significance=significance)
            splits["canaries"] = (s[n_records:], canary_labels, canary)
        write_results(run_dir, name, get_attack(name, **params.get(name, {})).get_params(), splits)
        summary[name] = records
    return summary


def write_extraction(run_dir: Path, model, tokenizer, canaries: list[dict], *, batch_size: int, device: str) -> None:
    """``extraction.json``: does greedy decoding from each canary's prefix emit its secret
    (k-extractability, Carlini et al. 2023)? Reported for included and excluded canaries."""
    from dpaudit.extraction import greedy_extracted

    extracted = greedy_extracted(model, tokenizer, prefixes=[c["prefix"] for c in canaries],
                                 targets=[c["secret"] for c in canaries], batch_size=batch_size, device=device)
    included = np.array([c["included"] for c in canaries], dtype=bool)
    write_json_atomic(run_dir / "extraction.json", {
        "schema_version": 1,
        "method": "greedy decoding from the canary prefix",
        "included_extracted": int(extracted[included].sum()),
        "included_total": int(included.sum()),
        "excluded_extracted": int(extracted[~included].sum()),
        "excluded_total": int((~included).sum()),
        "canaries": {c["id"]: {"extracted": bool(e)} for c, e in zip(canaries, extracted)},
    })


def _fleet(run_dir: Path, config, candidates: list[dict], canaries: list[dict], tokenizer):
    """Reference models trained like the target: records kept at the target's member rate,
    canaries at its inclusion rate and repeated as often; their keep matrix."""
    import datasets

    from dpaudit.data.corpus import tokenize_dataset
    from dpaudit.fleet import load_fleet, train_fleet

    record_rate, canary_rate = 1.0 - config.data.holdout_fraction, config.canaries.inclusion_prob
    rows = {
        "text": [c["text"] for c in candidates] + [c["text"] for c in canaries],
        "unit_id": [c["unit_id"] for c in candidates] + [c["id"] for c in canaries],
        "repetitions": [1] * len(candidates) + [int(c.get("repetitions", 1)) for c in canaries],
    }
    rates = [record_rate] * len(candidates) + [canary_rate] * len(canaries)
    dataset = tokenize_dataset(datasets.Dataset.from_dict(rows), tokenizer, max_length=config.data.max_length)
    train_fleet(fleet_dir=run_dir / "fleet", candidates=dataset, tokenizer=tokenizer, config=config, keep_fraction=rates)
    return load_fleet(run_dir / "fleet")


def _run_delta(run_dir: Path) -> float:
    path = run_dir / "dp_event.json"
    if path.is_file():
        delta = read_json(path).get("delta")
        if delta:
            return float(delta)
    return DEFAULT_DELTA


def _model_id(model_dir: Path) -> str:
    """Identity of saved weights for the signal cache: path, size and modification time."""
    parts = []
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        st = f.stat()
        parts.append(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts) or str(Path(model_dir).resolve())


def audit_model(
    model_dir: str | Path,
    *,
    members: str | Path,
    nonmembers: str | Path,
    reference_models: Sequence[str | Path] = (),
    out: str | Path,
    attacks: Sequence[str] | None = None,
    batch_size: int = 16,
    max_length: int = 512,
    device: str = "auto",
    trust_remote_code: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Black-box membership audit of a released model: every attack its inputs allow,
    measured on the given members against the given non-members."""
    from dpaudit.attacks import AttackInputs, get_attack
    from dpaudit.data.tokenizer import load_tokenizer
    from dpaudit.models import load_model
    from dpaudit.signals import compute_signals

    member_texts, nonmember_texts = read_texts(members), read_texts(nonmembers)
    texts = member_texts + nonmember_texts
    labels = np.array([True] * len(member_texts) + [False] * len(nonmember_texts))
    kw = dict(batch_size=batch_size, max_length=max_length, device=device, progress=progress)

    def signals_of(path):
        model = load_model(path, trust_remote_code=trust_remote_code)
        try:
            tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as err:
            raise InputError(f"{path} has no usable tokenizer: {str(err).splitlines()[0]}") from None
        return compute_signals(model, tokenizer, texts, **kw)

    target = signals_of(model_dir)
    references = tuple(signals_of(path) for path in reference_models)
    inputs = AttackInputs(target=target, texts=texts, references=references, reference_keep=None)
    scores = run_attacks(inputs, names=attacks)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, s in scores.items():
        metrics = split_metrics(s, labels, bounds_delta=None, seed=0)
        write_results(out, name, get_attack(name).get_params(), {"members": (s, labels, metrics)})
        summary[name] = metrics
    write_json_atomic(out / "audit_inputs.json", {
        "schema_version": 1,
        "model": str(model_dir),
        "reference_models": [str(p) for p in reference_models],
        "members": {"path": str(members), "count": len(member_texts)},
        "nonmembers": {"path": str(nonmembers), "count": len(nonmember_texts)},
        "max_length": max_length,
    })
    write_json_atomic(out / "manifest.json", manifest(seeds={}))
    return summary
