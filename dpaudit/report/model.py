"""One model's entry of the report, from its :class:`~dpaudit.report.snapshot.ModelSnapshot`.

- ``dp``: what was protected, from its :class:`~dpaudit.accounting.DpRecord`; the accountant's
  epsilon is *recomputed* from the recorded event. No record (a plug-in trainer that wrote
  none, an ``audit-model`` output): privacy "unknown", ``enabled`` null, never "trained
  without DP".
- ``utility``: held-out perplexity at the last evaluation and at step 0 (before training: the
  base model a fine-tune starts from); ``learned`` = the held-out loss went down by at least
  1% (the fine-tune earned some utility); ``fit_training_rows`` = the loss on its training rows
  (canaries included) went down, the gate of the verdict (a model that fit nothing memorized
  nothing); each null without a step-0 record, and when not every parameter trains
  (``model.trainable``).
- ``attacks`` (members vs held-out) and ``canary_attacks`` (included vs excluded canaries,
  with their epsilon bounds as written by the attack stage).
- ``audit`` and ``verdict``: the claim, the ceilings and the verdict as
  :func:`dpaudit.audit.assess` decides them; the best *sound* bound, and, kept apart under
  ``estimates``, the epsilons of the methods that assume a Gaussian trade-off curve or
  independent channels (not sound bounds).
- ``rungs``: the threat-model ladder of a DP model (:mod:`dpaudit.audit.ladder`), one
  :meth:`~dpaudit.audit.ladder.Rung.to_dict` per rung in ``RUNGS`` order (its ``ideal``: a
  perfect attack on a run that keeps the claim), with the ``ceiling`` of its bound (every
  guess right); empty without one. With rungs, the verdict takes the released model's canary
  bounds and each other rung's bound (counted at the rung's significance), and its ceiling is
  the largest of them all: the strongest rung is what could have seen a violation. With
  canaries repeated at note level, the released canaries are held to the group's epsilon and
  the other rungs (single canaries) to the per-unit one, each with its own ceiling: violated
  when either is, at the union of their significances. A white-box rung refused because its
  gradient canaries ran another (T, q) than the DP record claims is a violation: the
  accounting is not of the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dpaudit.audit.results import BoundResult
from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable
from dpaudit.report.extraction import extraction_summary, patient_epsilons
from dpaudit.report.schema import (
    DP_KEYS,
    MIN_NONMEMBERS_TIMES_FPR,
    MISMATCH_RTOL,
    REPORT_FPRS,
    UNIT_ADJACENCY,
)
from dpaudit.report.snapshot import ModelSnapshot, Unreadable
from dpaudit.report.values import integer, num

__all__ = ["model_entry"]


# --------------------------------------------------------------------------- privacy


def _privacy(record, warn) -> tuple[str, dict[str, Any], Any]:
    """(privacy, dp dict, accountant callable delta -> epsilon or None) of a DP record."""
    from dpaudit.accounting import event_to_dict

    dp = dict.fromkeys(DP_KEYS)
    dp.update(epsilon_logged=None, target_epsilon=None, sampler=None, noise=None, adjacency=None, sampling_scheme=None,
              group_epsilon=None, last_iterate_epsilon=None)
    if isinstance(record, Unreadable):
        warn(f"dp_event.json unreadable: {record}; privacy unknown")
        record = None
    if record is None:
        return "unknown", dp, None
    for k in ("noise_multiplier", "sample_rate", "max_grad_norm", "delta", "target_epsilon"):
        dp[k] = num(getattr(record, k))
    for k in ("steps", "expected_batch_size", "num_units"):
        dp[k] = integer(getattr(record, k))
    for k in ("unit", "accountant", "trainer", "sampler", "noise"):
        dp[k] = getattr(record, k)
    dp["enabled"] = record.private
    dp["adjacency"] = UNIT_ADJACENCY.get(dp["unit"] or "", dp["unit"])
    dp["sampling_scheme"] = _sampling_scheme(event_to_dict(record.event), dp["sampler"])
    if not record.private:
        return "non_private", dp, None
    dp["epsilon_logged"] = num(record.logged_epsilon)
    if dp["noise"] == "reproducible":
        warn("trained in reproducible mode (train.dp.reproducible: true): its noise and batches follow from the "
             "run seed, so the model is fine for an audit and not fit for release")
    try:
        dp["epsilon"] = float(record.epsilon())
    except Exception as err:  # noqa: BLE001 - a bad event must not stop the report
        warn(f"accountant epsilon not recomputed from the DpEvent ({type(err).__name__}: {err}); "
             f"the logged value {dp['epsilon_logged']} is shown unverified")
        dp["epsilon"] = dp["epsilon_logged"]
        dp["epsilon_recomputed"] = False
        return "dp", dp, None
    dp["epsilon_recomputed"] = True
    logged = dp["epsilon_logged"]
    if logged is not None and dp["epsilon"] is not None and \
            abs(logged - dp["epsilon"]) > MISMATCH_RTOL * max(abs(logged), abs(dp["epsilon"]), 1e-12):
        warn(f"logged epsilon {logged:.6g} differs from the one recomputed from the DpEvent "
             f"{dp['epsilon']:.6g}; the recomputed value is used")
    return "dp", dp, record


def _utility(records: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [r for r in records if num(r.get("heldout_loss")) is not None]
    step0 = next((r for r in evals if integer(r.get("step")) == 0), None)
    last = evals[-1] if evals else None
    out = {
        "heldout_perplexity": num(last.get("heldout_perplexity")) if last else None,
        "heldout_loss": num(last.get("heldout_loss")) if last else None,
        "initial_heldout_perplexity": num(step0.get("heldout_perplexity")) if step0 else None,
        "initial_heldout_loss": num(step0.get("heldout_loss")) if step0 else None,
        "final_train_loss": next((num(r.get("train_loss")) for r in reversed(records)
                                  if num(r.get("train_loss")) is not None), None),
        "steps_logged": max((integer(r.get("step")) or 0 for r in records), default=None),
        "initial_train_loss": None,
        "train_eval_loss": None,
        "learned": None,
        "fit_training_rows": None,
    }
    return out



def _train_checks(checks, warn) -> dict[str, Any] | None:
    if isinstance(checks, Unreadable):
        warn(str(checks))
        return None
    if not isinstance(checks, Mapping):
        return None
    batch = checks.get("batch_size") if isinstance(checks.get("batch_size"), Mapping) else {}
    out = {
        "ok": checks.get("ok"),
        "sampler": checks.get("sampler"),
        "batch_size_consistent": batch.get("consistent"),
        "batch_size_mean": num(batch.get("mean")),
        "batch_size_expected_mean": num(batch.get("expected_mean")),
        "batch_size_reference": batch.get("reference"),
        "all_parameters_moved": (checks.get("parameters") or {}).get("all_moved")
        if isinstance(checks.get("parameters"), Mapping) else None,
        "non_finite": checks.get("non_finite") if isinstance(checks.get("non_finite"), Mapping) else None,
    }
    if checks.get("ok") is False:
        warn("the trainer's own checks failed (train_checks.json: ok = false)")
    if batch.get("consistent") is False:
        warn(f"the realised batch sizes do not fit {batch.get('reference')}: the sampler may not be Poisson")
    return out



def _split_summary(split: Mapping[str, Any]) -> dict[str, Any]:
    num_out = integer(split.get("num_out"))
    raw = split.get("tpr_at_fpr") if isinstance(split.get("tpr_at_fpr"), Mapping) else {}
    by_value = {}
    for k, v in raw.items():
        try:
            by_value[format(float(k), "g")] = v
        except (TypeError, ValueError):
            continue
    tpr = {}
    for key in REPORT_FPRS:
        v = num(by_value.get(key))
        if v is not None and (num_out is None or num_out * float(key) < MIN_NONMEMBERS_TIMES_FPR - 1e-9):
            v = None  # too few non-members to estimate this FPR: never print a number (or a 0)
        tpr[key] = v
    ci = split.get("auc_ci")
    auc_ci = [num(ci[0]), num(ci[1])] if isinstance(ci, (list, tuple)) and len(ci) == 2 else None
    return {
        "auc": num(split.get("auc")),
        "auc_ci": auc_ci if auc_ci and None not in auc_ci else None,
        "tpr_at_fpr": tpr,
        "balanced_accuracy": num(split.get("balanced_accuracy")),
        "num_in": integer(split.get("num_in")),
        "num_out": num_out,
    }




def _attacks(results, warn) -> tuple[dict, dict, list, dict]:
    """(attacks, canary_attacks, [(attack, BoundResult)], roc arrays)."""
    attacks, canary_attacks, bounds, roc = {}, {}, [], {}
    if isinstance(results, Unreadable):
        warn(str(results))
        results = {}
    for name, r in results.items():
        splits = r["splits"]
        roc[name] = {}
        for split, (scores, labels) in r["arrays"].items():
            scores = np.asarray(scores, dtype=float)
            labels = np.asarray(labels, dtype=bool)
            if scores.shape == labels.shape and labels.any() and (~labels).any():
                roc[name][split] = (scores[labels], scores[~labels])
        if isinstance(splits.get("members"), Mapping):
            attacks[name] = {**_split_summary(splits["members"]), "params": r["params"]}
        canaries = splits.get("canaries")
        if isinstance(canaries, Mapping):
            raw = canaries.get("epsilon_lower_bounds") if isinstance(canaries.get("epsilon_lower_bounds"), Mapping) else {}
            kept = {}
            for method, b in raw.items():
                if not isinstance(b, Mapping) or num(b.get("epsilon")) is None:
                    warn(f"{name}/{method}: epsilon bound is missing or not finite; skipped")
                    continue
                try:
                    br = BoundResult.from_dict({"method": method, **b})
                except (InputError, TypeError, ValueError) as err:
                    warn(f"{name}/{method}: unreadable bound ({err}); skipped")
                    continue
                kept[method] = {**jsonable(b), "method": method, "sound": br.sound}
                bounds.append((name, br))
            canary_attacks[name] = {**_split_summary(canaries), "bounds": kept}
    return attacks, canary_attacks, bounds, roc



def _sampling_scheme(event: Mapping[str, Any], sampler: str | None) -> str | None:
    """The sampling of the DpEvent chain (``self_composed`` -> ``*_sampled`` -> ...)."""
    ev = event
    while isinstance(ev, Mapping):
        kind = ev.get("type")
        if isinstance(kind, str) and kind.endswith("_sampled"):
            return kind.replace("_", " ")
        ev = ev.get("event")
    return sampler


# --------------------------------------------------------------------------- the claim and the audit


def _claim(privacy: str, dp: dict, record, repetitions: int):
    """The claim the canaries are held to (:class:`dpaudit.audit.Claim`): the record's, a
    group's for r copies of a canary at note level (then also what the report says of it);
    the logged epsilon when the accountant could not recompute it."""
    from dpaudit.audit import Claim

    if privacy == "non_private":
        return Claim("non_private", epsilon=float("inf")), None
    if privacy == "unknown":
        return Claim.unknown(), None
    if record is None:  # the accountant failed: the logged claim, unverified
        return Claim("dp", epsilon=dp["epsilon"], delta=dp["delta"]), None
    claim = Claim.of_record(record, group_size=repetitions)
    if claim.group_size == 1:
        return claim, None
    dp["group_epsilon"] = claim.epsilon
    return claim, (f"each canary is repeated {repetitions} times at note level, so the audit measures a group of "
                   f"{repetitions} notes: it is held to the group's epsilon {claim.epsilon:.3g}, not the per-note "
                   f"{dp['epsilon']:.3g} (which the ladder's other rungs, of single canaries, keep)")


def _audit(bounds, verdict, ceilings: dict[str, float], ceiling: float | None) -> dict[str, Any]:
    """The audit's summary: the reported sound bound (the verdict's), every sound canary
    method's ceiling, the verdict's ceiling, and the estimates that are not sound bounds."""
    audit = {k: getattr(verdict, k) for k in ("epsilon_lower_bound", "method", "attack", "delta", "significance")}
    audit["confidence"] = None if verdict.significance is None else 1.0 - verdict.significance
    for k in ("num_canaries", "num_guesses", "num_correct"):
        audit[k] = getattr(verdict, k)
    audit.update(ceiling=ceiling, ceilings=ceilings,
                 estimates={f"{a}/{b.method}": b.epsilon for a, b in bounds if not b.sound},
                 num_sound_bounds=sum(1 for _, b in bounds if b.sound))
    return audit


def _last_iterate(dp: dict, step_weights, warn) -> float | None:
    """The last-iterate heuristic epsilon (:func:`dpaudit.accounting.last_iterate_epsilon`)
    at the run's delta, with the step weights of the toolkit's own loop (a plug-in's update
    rule is unknown: plain SGD at a constant rate is assumed)."""
    from dpaudit.accounting import last_iterate_epsilon

    try:
        return last_iterate_epsilon(noise_multiplier=dp["noise_multiplier"], sample_rate=dp["sample_rate"],
                                    steps=dp["steps"], delta=dp["delta"],
                                    step_weights=list(step_weights) if step_weights is not None else None)
    except InputError as err:
        warn(f"last-iterate heuristic not computed: {err}")
        return None


def _rungs(ladder, privacy: str, warn) -> list:
    """The model's rungs in ``RUNGS`` order; none without a ladder, or without a DP claim
    for them to test."""
    from dpaudit.audit.ladder import RUNGS

    if isinstance(ladder, Unreadable):
        warn(f"ladder.json unreadable: {ladder}; the threat-model ladder is not reported")
        return []
    if not ladder:
        return []
    if privacy != "dp":
        warn("ladder.json ignored: the model has no DP claim for its rungs to test")
        return []
    return sorted(ladder, key=lambda r: list(RUNGS).index(r.rung))


def _rung_bound(r):
    """A rung's bound at the rung's significance (its union over the tests it tried)."""
    return r.bound if r.significance is None else dataclasses.replace(r.bound, significance=r.significance)


def _parts(bounds, rungs, claim, record) -> list[tuple[list, list, Any, tuple[str, str] | None]]:
    """The parts of the verdict, each (bounds, tests, claim, remedy), with the rungs that ran:
    the canary bounds (the released rung's own tests) and each other rung's bound, in
    ``bounds`` at the rung's significance (the union the verdict sums) and in ``tests`` as the
    test ran (at its share of it: what its ceiling is of). Their ceiling is the testability
    ceiling (every guess right), never a rung's ideal (what a perfect attack shows on a run that
    keeps its claim, below the claim). One part, held to ``claim``; two when ``claim`` is a
    group's (canaries repeated at note level): the released canaries held to it, and the other
    rungs, single canaries in a twin trained at the per-unit claim, to the record's per-unit
    claim."""
    from dpaudit.audit import Claim

    ran = [r for r in rungs if r.bound is not None and r.rung != "released"]
    if not ran:
        return [(list(bounds), list(bounds), claim, None)]
    pairs, tests = [(r.rung, _rung_bound(r)) for r in ran], [(r.rung, r.bound) for r in ran]
    todo = "add canaries" if any(r.rung == "white_box" for r in ran) else "add canaries, or run the white-box rung"
    remedy = ("the ceiling of its strongest rung", todo)
    if claim.group_size == 1:
        return [(list(bounds) + pairs, list(bounds) + tests, claim, remedy)]
    return [(list(bounds), list(bounds), claim, None), (pairs, tests, Claim.of_record(record), remedy)]


def _verdict(parts, *, learned, checks, record, mismatch, warn):
    """(verdict, ceilings, ceiling) of the parts of :func:`_parts`, each decided by
    :func:`dpaudit.audit.assess` against its own claim and ceiling: violated when a part is,
    else consistent when a part is, else inconclusive (the rungs' reason: the strongest rung is
    what could have seen a violation), at the union of every part's significance."""
    from dpaudit.audit import Status, assess, ceilings

    verdicts, found = [], {}
    for pairs, tests, claim, remedy in parts:
        own = ceilings(tests, claim=claim, warn=warn)
        for method, value in own.items():
            found[method] = max(found.get(method, value), value)
        verdicts.append(assess(bounds=pairs, claim=claim, learned=learned, ceiling=max(own.values(), default=None),
                               checks=checks, record=record, remedy=remedy, mismatch=mismatch))
    order = [Status.VIOLATED, Status.CONSISTENT, Status.INCONCLUSIVE, Status.NO_CLAIM]
    verdict = min(reversed(verdicts), key=lambda v: order.index(v.status))
    sigs = [v.significance for v in verdicts if v.significance is not None]
    significance = min(1.0, sum(sigs)) if sigs else None
    if significance != verdict.significance:  # the other part's tests count in the union too
        verdict = dataclasses.replace(verdict, significance=significance, reason=(
            f"{verdict.reason} The canaries' tests (held to the group's epsilon) and the rungs' (held to the "
            f"per-unit epsilon) hold jointly at {1.0 - significance:.0%} confidence (union bound)."))
    return verdict, found, max(found.values(), default=None)


def _multi_run(result, warn) -> dict[str, Any] | None:
    """``multi_run.json`` without the per-run scores (they stay in ``multi_run.npz``)."""
    if isinstance(result, Unreadable):
        warn(f"multi-run audit unreadable: {result}")
        return None
    if result is None:
        return None
    status = (result.get("verdict") or {}).get("status")
    if status == "violated":
        warn(f"the multi-run audit found a violation: {result['verdict'].get('reason')}")
    return jsonable({k: v for k, v in result.items() if k not in ("in_scores", "out_scores")})


def _error(model: ModelSnapshot) -> str | None:
    err = {"message": str(model.error)} if isinstance(model.error, Unreadable) else model.error
    if isinstance(err, Mapping):
        error = str(err.get("message") or err.get("type") or "failed")
        return f"{err['stage']}: {error}" if err.get("stage") else error
    return None if model.exists else "no model directory (not trained yet?)"


# --------------------------------------------------------------------------- one model


def model_entry(model: ModelSnapshot, *, include_texts: bool, repetitions: int,
                trainable: str) -> tuple[dict, list[str], dict, list, list, list]:
    """(entry, warnings, roc arrays, extraction rows, patient-secret rows, bound rows) of one model."""
    from dpaudit.audit import fit_from_log, learned, rung_ceiling
    from dpaudit.audit.assess import mechanism_refusal

    warnings: list[str] = []
    warn = warnings.append
    error = _error(model)
    privacy, dp, record = _privacy(model.record, warn)
    log = model.log
    if isinstance(log, Unreadable):
        warn(str(log))
        log = []
    utility = _utility(log)
    # Learned = better on held-out records than where it started (the base model): the utility
    # the fine-tune earned, which a loss on its own training rows, dominated by the canaries,
    # cannot tell (issue 29). Whether it fit its training rows (canaries included) is kept
    # apart: that is what an audit of memorization needs, and what the verdict's gate reads.
    utility["initial_train_loss"], utility["train_eval_loss"] = fit_from_log(log)
    utility["learned"] = learned(initial_loss=utility["initial_heldout_loss"], final_loss=utility["heldout_loss"],
                                 trainable=trainable)
    utility["fit_training_rows"] = learned(initial_loss=utility["initial_train_loss"],
                                           final_loss=utility["train_eval_loss"], trainable=trainable)
    checks = _train_checks(model.checks, warn)
    attacks, canary_attacks, bounds, roc = _attacks(model.results, warn)
    claim, group_note = _claim(privacy, dp, record, repetitions)
    extraction, ext_rows, patient_rows = extraction_summary(model.name, model.extraction, include_texts, warn)
    if group_note:
        warn(group_note)
    if privacy == "dp" and None not in (dp["noise_multiplier"], dp["sample_rate"], dp["steps"], dp["delta"]):
        dp["last_iterate_epsilon"] = _last_iterate(dp, model.step_weights, warn)
    for key, groups in (("notes", ((extraction or {}).get("patient_secrets") or {}).get("groups")),
                        ("repetitions", ((extraction or {}).get("secrets") or {}).get("groups"))):
        if privacy == "dp" and groups:  # a patient's k notes, or r copies of one canary: a group
            patient_epsilons(groups, dp, warn, key=key)
    if patient_rows:
        field = extraction["patient_secrets"]["field"]
        patient_rows = [{"model": model.name, "field": field, **row} for row in patient_rows]
    raw_checks = model.checks if isinstance(model.checks, Mapping) else None
    rungs = _rungs(model.ladder, privacy, warn)
    parts = _parts(bounds, rungs, claim, record)
    pairs = [pair for part in parts for pair in part[0]]
    verdict, found, ceiling = _verdict(parts, learned=utility["fit_training_rows"], checks=raw_checks, record=record,
                                       mismatch=mechanism_refusal(rungs), warn=warn)
    if not pairs and error is None and privacy != "unknown":
        warn("no canary bounds (results/*.json has no canaries split): the DP claim could not be tested")
    if utility["initial_train_loss"] is None and privacy != "unknown" and log:
        warn("no step-0 evaluation in train_log.jsonl: whether the model learned is unknown")
    entry = {"name": model.name, "error": error, "privacy": privacy, "dp": dp, "utility": utility,
             "train_checks": checks, "attacks": attacks, "canary_attacks": canary_attacks,
             "audit": _audit(pairs, verdict, found, ceiling),
             "rungs": [{**r.to_dict(), "ceiling": rung_ceiling(r, claim=claim, warn=warn)} for r in rungs],
             "extraction": extraction, "verdict": verdict.to_dict(),
             "multi_run": _multi_run(model.multi_run, warn), "warnings": warnings}
    bound_rows = [{"model": model.name, "attack": a, "method": b.method, "sound": b.sound, "epsilon": b.epsilon,
                   "delta": b.delta, "significance": b.significance, "num_canaries": b.num_canaries,
                   "num_guesses": b.num_guesses, "num_correct": b.num_correct,
                   "strategy": (b.strategy or {}).get("name") if isinstance(b.strategy, Mapping) else None}
                  for a, b in bounds]
    return jsonable(entry), warnings, roc, ext_rows, patient_rows, bound_rows
