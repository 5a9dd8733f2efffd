"""The report as data: one dict assembled from a run directory's artifacts, no drawing.

:func:`assemble` reads a run (or an ``audit-model`` output) only through
:class:`dpaudit.rundir.RunDir` / :class:`~dpaudit.rundir.ModelDir` and returns a
:class:`ReportData`: the JSON-ready ``report`` dict (``report.json``, schema version 2),
the score arrays the ROC figure needs, and the per-row tables (``tables/*.csv``), which are
never inlined in the HTML.

Per model (``report["models"][i]``; see ``MODEL_KEYS``):

- ``dp``: what was protected, read from ``dp_event.json``; the accountant's epsilon is
  *recomputed* from the recorded DpEvent (:func:`dpaudit.accounting.epsilon_from_record`).
  No ``dp_event.json`` (a plug-in trainer that wrote none, an ``audit-model`` output):
  privacy "unknown", ``enabled`` null, never "trained without DP".
- ``utility``: held-out perplexity at the last evaluation and at step 0 (before training);
  ``learned`` = the loss on its training rows went down (null without a step-0 record, and
  when not every parameter trains: ``model.trainable``).
- ``attacks`` (members vs held-out) and ``canary_attacks`` (included vs excluded canaries,
  with their epsilon bounds as written by the attack stage).
- ``audit``: the best *sound* bound (Steinke et al. 2023 one-run, Clopper-Pearson) as chosen
  by :func:`dpaudit.audit.decide`, the one-run ceiling for these canaries
  (:func:`dpaudit.audit.one_run_ceiling`), and, kept apart under ``estimates``, the epsilons
  of the methods that assume a Gaussian trade-off curve or independent channels (not sound bounds).
- ``verdict``: :meth:`dpaudit.audit.Verdict.to_dict`.

Run-level ``step_audit``: the white-box audit of one DP-SGD step (``dpaudit validate --step
--out RUN``, :mod:`dpaudit.stages.validate_step`) when one was run into the directory, else null.
- ``multi_run``: the multi-run audit (``audit.mode: multi_run``; null otherwise) as
  :mod:`dpaudit.stages.multi_run` wrote it (Clopper-Pearson bound, GDP estimate, ceiling and
  verdict over K runs with the canary and K without), without the per-run scores.

Privacy of the report: member texts (canary ``text`` / ``prefix``, free-text fields of
``extraction.json``) enter only with ``include_texts=True``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable
from dpaudit.rundir import ModelDir, RunDir

SCHEMA_VERSION = 2
REPORT_FPRS = ("0.1", "0.01", "0.001")
# DESIGN.md section 4: TPR at FPR a needs about 10 / a non-members to mean anything.
MIN_NONMEMBERS_TIMES_FPR = 10.0
# Online LiRA fits per-text "in" and "out" means; with fewer reference models than this on
# either side, the report warns. Measured on the demo data: with one in and one out model
# its TPR at 1% FPR was 0.002 against 0.073 for the loss attack; with 2-3 in and 13-14 out
# it was 0.085 against 0.027.
MIN_ONLINE_MODELS = 2
# relative difference between the logged and the recomputed epsilon that is flagged
MISMATCH_RTOL = 1e-4
# String fields of extraction records that are never member text.
SAFE_STRING_KEYS = frozenset({"id", "canary_id", "kind", "secret", "method", "strategy", "status", "split", "field"})
UNIT_ADJACENCY = {
    "example": "add or remove one note (one training example)",
    "user": "add or remove one patient (all of that patient's notes)",
}
UNIT_LABEL = {"example": "note-level", "user": "patient-level"}

MODEL_KEYS = ("name", "error", "privacy", "dp", "utility", "train_checks", "attacks", "canary_attacks",
              "audit", "extraction", "verdict", "multi_run", "warnings")
DP_KEYS = ("enabled", "noise_multiplier", "sample_rate", "steps", "max_grad_norm", "unit", "delta", "epsilon",
           "accountant", "expected_batch_size", "num_units", "trainer")

__all__ = ["SCHEMA_VERSION", "ReportData", "assemble", "MODEL_KEYS", "DP_KEYS", "REPORT_FPRS"]


@dataclass
class ReportData:
    """What :func:`assemble` returns: the report dict, ROC arrays and per-row tables."""

    report: dict[str, Any]
    # roc[model][attack][split] = (in_scores, out_scores)
    roc: dict[str, dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]] = field(default_factory=dict)
    # tables[stem] = (columns, rows): written to tables/STEM.csv
    tables: dict[str, tuple[list[str], list[dict[str, Any]]]] = field(default_factory=dict)


# --------------------------------------------------------------------------- small helpers


def _num(x: Any) -> float | None:
    """A finite float, or None for anything else (null, NaN, a string, a bool)."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _int(x: Any) -> int | None:
    v = _num(x)
    return int(v) if v is not None else None


def _rate(k: Any, n: Any) -> float | None:
    k, n = _int(k), _int(n)
    return k / n if k is not None and n else None


# --------------------------------------------------------------------------- privacy


def _privacy(md: ModelDir, warn) -> tuple[str, dict[str, Any], Any]:
    """(privacy, dp dict, accountant callable delta -> epsilon or None)."""
    dp = dict.fromkeys(DP_KEYS)
    dp.update(epsilon_logged=None, target_epsilon=None, sampler=None, noise=None, adjacency=None, sampling_scheme=None,
              group_epsilon=None, last_iterate_epsilon=None)
    try:
        record = md.read_dp_event()
    except InputError as err:
        warn(f"dp_event.json unreadable: {err}; privacy unknown")
        record = None
    if record is None:
        return "unknown", dp, None
    event = record.get("event") if isinstance(record.get("event"), Mapping) else {}
    non_private = event.get("type") == "non_private"
    for k in ("noise_multiplier", "sample_rate", "max_grad_norm", "delta", "target_epsilon"):
        dp[k] = _num(record.get(k))
    for k in ("steps", "expected_batch_size", "num_units"):
        dp[k] = _int(record.get(k))
    for k in ("unit", "accountant", "trainer", "sampler", "noise"):
        dp[k] = record.get(k) if isinstance(record.get(k), str) else None
    dp["enabled"] = not non_private
    dp["adjacency"] = UNIT_ADJACENCY.get(dp["unit"] or "", dp["unit"])
    dp["sampling_scheme"] = _sampling_scheme(event, dp["sampler"])
    if non_private:
        return "non_private", dp, None
    dp["epsilon_logged"] = _num(record.get("epsilon"))
    if dp["noise"] == "reproducible":
        warn("trained in reproducible mode (train.dp.reproducible: true): its noise and batches follow from the "
             "run seed, so the model is fine for an audit and not fit for release")
    from dpaudit.accounting import epsilon_from_record

    def accountant(delta: float) -> float:
        return float(epsilon_from_record(record, delta=delta))

    try:
        dp["epsilon"] = float(epsilon_from_record(record))
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
    return "dp", dp, accountant


def _sampling_scheme(event: Mapping[str, Any], sampler: str | None) -> str | None:
    """The sampling of the DpEvent chain (``self_composed`` -> ``*_sampled`` -> ...)."""
    ev = event
    while isinstance(ev, Mapping):
        kind = ev.get("type")
        if isinstance(kind, str) and kind.endswith("_sampled"):
            return kind.replace("_", " ")
        ev = ev.get("event")
    return sampler


# --------------------------------------------------------------------------- utility


def _utility(records: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [r for r in records if _num(r.get("heldout_loss")) is not None]
    step0 = next((r for r in evals if _int(r.get("step")) == 0), None)
    last = evals[-1] if evals else None
    out = {
        "heldout_perplexity": _num(last.get("heldout_perplexity")) if last else None,
        "heldout_loss": _num(last.get("heldout_loss")) if last else None,
        "initial_heldout_perplexity": _num(step0.get("heldout_perplexity")) if step0 else None,
        "initial_heldout_loss": _num(step0.get("heldout_loss")) if step0 else None,
        "final_train_loss": next((_num(r.get("train_loss")) for r in reversed(records)
                                  if _num(r.get("train_loss")) is not None), None),
        "steps_logged": max((_int(r.get("step")) or 0 for r in records), default=None),
        "initial_train_loss": None,
        "train_eval_loss": None,
        "learned": None,
    }
    return out


def _train_checks(md: ModelDir, warn) -> dict[str, Any] | None:
    try:
        checks = md.read_train_checks()
    except InputError as err:
        warn(str(err))
        return None
    if not isinstance(checks, Mapping):
        return None
    batch = checks.get("batch_size") if isinstance(checks.get("batch_size"), Mapping) else {}
    out = {
        "ok": checks.get("ok"),
        "sampler": checks.get("sampler"),
        "batch_size_consistent": batch.get("consistent"),
        "batch_size_mean": _num(batch.get("mean")),
        "batch_size_expected_mean": _num(batch.get("expected_mean")),
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


# --------------------------------------------------------------------------- attacks and bounds


def _split_summary(split: Mapping[str, Any]) -> dict[str, Any]:
    num_out = _int(split.get("num_out"))
    raw = split.get("tpr_at_fpr") if isinstance(split.get("tpr_at_fpr"), Mapping) else {}
    by_value = {}
    for k, v in raw.items():
        try:
            by_value[format(float(k), "g")] = v
        except (TypeError, ValueError):
            continue
    tpr = {}
    for key in REPORT_FPRS:
        v = _num(by_value.get(key))
        if v is not None and (num_out is None or num_out * float(key) < MIN_NONMEMBERS_TIMES_FPR - 1e-9):
            v = None  # too few non-members to estimate this FPR: never print a number (or a 0)
        tpr[key] = v
    ci = split.get("auc_ci")
    auc_ci = [_num(ci[0]), _num(ci[1])] if isinstance(ci, (list, tuple)) and len(ci) == 2 else None
    return {
        "auc": _num(split.get("auc")),
        "auc_ci": auc_ci if auc_ci and None not in auc_ci else None,
        "tpr_at_fpr": tpr,
        "balanced_accuracy": _num(split.get("balanced_accuracy")),
        "num_in": _int(split.get("num_in")),
        "num_out": num_out,
    }


def _bound_result(d: Mapping[str, Any]):
    from dpaudit.audit import BoundResult

    names = {f.name for f in dataclasses.fields(BoundResult)}
    kwargs = {k: v for k, v in d.items() if k in names}
    kwargs.setdefault("strategy", {})
    kwargs.setdefault("details", {})
    for k in ("num_guesses", "num_correct"):
        kwargs.setdefault(k, None)
    return BoundResult(**kwargs)


def _strategy(d: Any):
    from dpaudit.audit import BonferroniStrategy, SplitStrategy

    if not isinstance(d, Mapping):
        return None
    grid = d.get("grid")
    grid = tuple(tuple(g) if isinstance(g, list) else g for g in grid) if isinstance(grid, list) else None
    if d.get("name") == "split":
        return SplitStrategy(fraction=float(d.get("fraction", 0.5)), seed=int(d.get("seed", 0)), grid=grid)
    if d.get("name") == "bonferroni":
        return BonferroniStrategy(grid=grid)
    return None


def _attacks(md: ModelDir, warn) -> tuple[dict, dict, list, dict]:
    """(attacks, canary_attacks, [(attack, BoundResult)], roc arrays)."""
    attacks, canary_attacks, bounds, roc = {}, {}, [], {}
    try:
        results = md.read_results() if md.results_dir.is_dir() else {}
    except InputError as err:
        warn(str(err))
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
                if not isinstance(b, Mapping) or _num(b.get("epsilon")) is None:
                    warn(f"{name}/{method}: epsilon bound is missing or not finite; skipped")
                    continue
                try:
                    br = _bound_result({"method": method, **b})
                except (InputError, TypeError, ValueError) as err:
                    warn(f"{name}/{method}: unreadable bound ({err}); skipped")
                    continue
                kept[method] = {**jsonable(b), "method": method, "sound": br.sound}
                bounds.append((name, br))
            canary_attacks[name] = {**_split_summary(canaries), "bounds": kept}
    return attacks, canary_attacks, bounds, roc


def _audit(bounds, *, num_canaries: int | None, delta: float | None, dp: dict, warn) -> dict[str, Any]:
    """The audit's summary; its ``ceiling`` is the largest of the sound methods' ceilings
    (``ceilings``): what the audit could have shown with every guess right."""
    from dpaudit.audit import claimed_curve_ceiling, one_run_ceiling

    ceilings = {}
    for method in ("one_run", "claimed_curve"):
        ref = next((b for _, b in bounds if b.sound and b.method == method), None)
        if ref is None:
            continue
        common = dict(num_canaries=int(num_canaries or ref.num_canaries), significance=float(ref.significance),
                      delta=float(delta if delta is not None else ref.delta), strategy=_strategy(ref.strategy))
        try:
            if method == "one_run":
                ceilings[method] = float(one_run_ceiling(method="one_run", **common))
            else:
                ceilings[method] = float(claimed_curve_ceiling(
                    **common, **{k: dp[k] for k in ("noise_multiplier", "sample_rate", "steps")}))
        except (InputError, TypeError, ValueError) as err:
            warn(f"{method} ceiling not computed: {err}")
    ceiling = max(ceilings.values(), default=None)
    estimates = {f"{a}/{b.method}": b.epsilon for a, b in bounds if not b.sound}
    return {
        "epsilon_lower_bound": None, "method": None, "attack": None, "delta": None, "significance": None,
        "confidence": None, "num_canaries": None, "num_guesses": None, "num_correct": None,
        "ceiling": ceiling, "ceilings": ceilings, "estimates": estimates,
        "num_sound_bounds": sum(1 for _, b in bounds if b.sound),
    }


# --------------------------------------------------------------------------- extraction


def _extraction(md: ModelDir, include_texts: bool, warn) -> tuple[dict | None, list[dict], list[dict]]:
    """(summary, per-canary rows, patient-secret rows)."""
    try:
        ext = md.read_extraction()
    except InputError as err:
        warn(str(err))
        return None, [], []
    if not isinstance(ext, Mapping):
        return None, [], []
    summary: dict[str, Any] = {"method": ext.get("method") if isinstance(ext.get("method"), str) else None}
    for side in ("included", "excluded"):
        summary[f"{side}_extracted"] = _int(ext.get(f"{side}_extracted"))
        summary[f"{side}_total"] = _int(ext.get(f"{side}_total"))
        summary[f"{side}_rate"] = _rate(ext.get(f"{side}_extracted"), ext.get(f"{side}_total"))
    rows = []
    per = ext.get("new_token_canaries", ext.get("canaries"))  # "canaries" in files before the secret canaries
    if isinstance(per, Mapping):
        for cid, rec in per.items():
            if not isinstance(rec, Mapping):
                continue
            row = {"model": md.name, "canary_id": str(cid)}
            for k, v in rec.items():
                if isinstance(v, (Mapping, list)):
                    continue
                if isinstance(v, str) and not include_texts and k not in SAFE_STRING_KEYS:
                    continue
                row[k] = v
            rows.append(row)
    summary.update(_secret_summary(ext))
    summary["patient_secrets"] = None
    patient_rows = []
    ps = ext.get("patient_secrets")
    if isinstance(ps, Mapping) and isinstance(ps.get("groups"), list):
        groups = []
        for g in ps["groups"]:
            if not isinstance(g, Mapping):
                continue
            row = {
                "notes": _int(g.get("notes")),
                "member_patients": _int(g.get("member_patients")),
                "member_mean_logprob": _num(g.get("member_mean_logprob")),
                "heldout_mean_logprob": _num(g.get("heldout_mean_logprob")),
                "member_extracted": _num(g.get("member_extracted")),
                "heldout_extracted": _num(g.get("heldout_extracted")),
                "epsilon": None,  # the patient's guarantee, set by _patient_epsilons for a DP model
            }
            groups.append(row)
            patient_rows.append(row)  # with "model" and "field" added by _model, after "epsilon"
        summary["patient_secrets"] = {"field": str(ps.get("field")) if ps.get("field") is not None else None,
                                      "groups": groups}
    return summary, rows, patient_rows


def _secret_summary(ext: Mapping) -> dict[str, Any]:
    """``secrets`` (exposure and extraction of the secret canaries by repetition count, and
    per canary: ids and numbers only), ``pii`` and ``k_extractable`` of ``extraction.json``."""
    out: dict[str, Any] = {"secrets": None, "pii": None, "k_extractable": None}
    if isinstance(ext.get("by_repetitions"), list) and ext["by_repetitions"]:
        groups = [{"repetitions": _int(g.get("repetitions")), "num": _int(g.get("num")),
                   "mean_exposure": _num(g.get("mean_exposure")), "median_exposure": _num(g.get("median_exposure")),
                   "extracted": _num(g.get("extracted")), "extracted_sampled": _num(g.get("extracted_sampled")),
                   "epsilon": None}  # the group's guarantee, set by _patient_epsilons for a DP model
                  for g in ext["by_repetitions"] if isinstance(g, Mapping)]
        rows = [{"id": str(c.get("id")), "included": bool(c.get("included")), "repetitions": _int(c.get("repetitions")),
                 "exposure": _num(c.get("exposure")), "rank": _num(c.get("rank")), "extracted": bool(c.get("extracted")),
                 "sampled_hits": _int(c.get("sampled_hits")), "samples": _int(c.get("samples"))}
                for c in ext.get("canaries") or [] if isinstance(c, Mapping)]
        out["secrets"] = {"space_bits": _num(ext.get("space_bits")), "secret_set": str(ext.get("secret_set")),
                          "exposure_method": str(ext.get("exposure_method")), "groups": groups, "canaries": rows}
    pii = ext.get("pii")
    if isinstance(pii, Mapping):
        out["pii"] = {role: {f: {"num": _int(v.get("num")), "extracted": _int(v.get("extracted")),
                                 "fraction": _num(v.get("fraction"))}
                             for f, v in (pii.get(role) or {}).items() if isinstance(v, Mapping)}
                      for role in ("members", "heldout")}
    k = ext.get("k_extractable")
    if isinstance(k, Mapping):
        out["k_extractable"] = {"k": _int(k.get("k")), "suffix_length": _int(k.get("suffix_length")),
                                **{role: {"num": _int((k.get(role) or {}).get("num")),
                                          "fraction": _num((k.get(role) or {}).get("fraction"))}
                                   for role in ("members", "heldout")}}
    return out


def _last_iterate(rundir: RunDir, name: str, dp: dict, warn) -> float | None:
    """The last-iterate heuristic epsilon (:func:`dpaudit.accounting.last_iterate_epsilon`)
    at the run's delta, with the learning-rate schedule of the config when the toolkit's own
    loop trained the model (a plug-in's schedule is unknown: constant is assumed)."""
    from dpaudit.accounting import last_iterate_epsilon

    factors = None
    try:
        train = rundir.read_config().for_model(name).train
        if train.trainer.startswith("dpaudit.train"):
            from dpaudit.train.loop import lr_factor

            factors = [lr_factor(t, schedule=train.schedule, warmup_steps=train.warmup_steps,
                                 total_steps=dp["steps"]) for t in range(dp["steps"])]
    except (InputError, OSError, AttributeError, KeyError):
        factors = None
    try:
        return last_iterate_epsilon(noise_multiplier=dp["noise_multiplier"], sample_rate=dp["sample_rate"],
                                    steps=dp["steps"], delta=dp["delta"], lr_factors=factors)
    except InputError as err:
        warn(f"last-iterate heuristic not computed: {err}")
        return None


def _patient_epsilons(groups: list[dict], dp: dict, warn, *, key: str = "notes") -> None:
    """Set each patient-secret group's ``epsilon``: the accountant's guarantee, at the run's
    delta, for a patient with that many notes. Patient-level DP protects the patient at the
    model's epsilon whatever the count; note-level DP protects each note, so a patient with k
    notes is a group of k units (:func:`dpaudit.accounting.group_epsilon`)."""
    from dpaudit.accounting import group_epsilon

    args = {k: dp[k] for k in ("noise_multiplier", "sample_rate", "steps", "delta")}
    for g in groups:  # "epsilon" stays None where it cannot be computed
        k = g[key]
        if not k:  # secret canaries never inserted (repetitions 0)
            continue
        if dp["unit"] == "user" or k == 1:
            g["epsilon"] = dp["epsilon"]
        elif dp["unit"] == "example" and k and None not in args.values():
            try:
                g["epsilon"] = group_epsilon(**args, group_size=k)
            except InputError as err:
                warn(f"epsilon of a patient with {k} notes not computed: {err}")


def _multi_run(md: ModelDir, warn) -> dict[str, Any] | None:
    """``multi_run.json`` without the per-run scores (they stay in ``multi_run.npz``)."""
    try:
        result = md.read_multi_run()
    except InputError as err:
        warn(f"multi-run audit unreadable: {err}")
        return None
    if result is None:
        return None
    status = (result.get("verdict") or {}).get("status")
    if status == "violated":
        warn(f"the multi-run audit found a violation: {result['verdict'].get('reason')}")
    return jsonable({k: v for k, v in result.items() if k not in ("in_scores", "out_scores")})


# --------------------------------------------------------------------------- one model


def _model(rundir: RunDir, name: str, *, include_texts: bool, num_canaries: int | None, repetitions: int,
           trainable: str, report_warnings: list[str]) -> tuple[dict, dict, list, list, list]:
    from dpaudit.audit import decide, learned

    md = rundir.model(name)
    warnings: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)

    error = None
    try:
        err = md.read_error()
    except InputError as e:
        err = {"message": str(e)}
    if isinstance(err, Mapping):
        error = str(err.get("message") or err.get("type") or "failed")
        if err.get("stage"):
            error = f"{err['stage']}: {error}"
    elif not md.root.is_dir():
        error = "no model directory (not trained yet?)"

    privacy, dp, accountant = _privacy(md, warn)
    try:
        log = md.read_train_log()
    except InputError as e:
        warn(str(e))
        log = []
    utility = _utility(log)
    # Learned = fit its training rows (canaries included): a DP fine-tune of a strong public base
    # may not beat the base on held-out notes, yet learn from its private rows, which is what an
    # audit of memorization needs.
    utility["initial_train_loss"], utility["train_eval_loss"] = md.read_train_fit()
    utility["learned"] = learned(initial_loss=utility["initial_train_loss"], final_loss=utility["train_eval_loss"],
                                 trainable=trainable)
    checks = _train_checks(md, warn)
    attacks, canary_attacks, bounds, roc = _attacks(md, warn)
    audit = _audit(bounds, num_canaries=num_canaries, delta=dp["delta"], dp=dp, warn=warn)
    extraction, ext_rows, patient_rows = _extraction(md, include_texts, warn)

    if privacy == "dp" and repetitions > 1 and dp["unit"] == "example" and None not in (
            dp["noise_multiplier"], dp["sample_rate"], dp["steps"], dp["delta"]):
        # r copies of a canary are r units at note level: the audit measures a group of r, and
        # the claim it is held to is the group's epsilon, from the same DP-SGD event
        from dpaudit.accounting import group_epsilon

        def accountant(delta: float, _dp=dp) -> float:
            return group_epsilon(noise_multiplier=_dp["noise_multiplier"], sample_rate=_dp["sample_rate"],
                                 steps=_dp["steps"], delta=delta, group_size=repetitions)

        claimed = dp["group_epsilon"] = accountant(dp["delta"])
        warn(f"each canary is repeated {repetitions} times at note level, so the audit measures a group of "
             f"{repetitions} notes: it is held to the group's epsilon {claimed:.3g}, not the per-note {dp['epsilon']:.3g}")
    elif privacy == "dp":
        claimed = dp["epsilon"]
    elif privacy == "non_private":
        claimed = math.inf
    else:
        claimed = None
    if privacy == "dp" and None not in (dp["noise_multiplier"], dp["sample_rate"], dp["steps"], dp["delta"]):
        dp["last_iterate_epsilon"] = _last_iterate(rundir, name, dp, warn)
    if privacy == "dp" and extraction and extraction.get("patient_secrets"):
        _patient_epsilons(extraction["patient_secrets"]["groups"], dp, warn)
    if privacy == "dp" and extraction and extraction.get("secrets"):  # r copies of one canary: a group of r notes
        _patient_epsilons(extraction["secrets"]["groups"], dp, warn, key="repetitions")
    if patient_rows:
        field = extraction["patient_secrets"]["field"]
        patient_rows = [{"model": name, "field": field, **row} for row in patient_rows]
    verdict = decide(bounds=bounds, claimed_epsilon=claimed, accountant_epsilon=accountant,
                     ceiling=audit["ceiling"], learned=utility["learned"])
    for k in ("epsilon_lower_bound", "method", "attack", "delta", "significance", "num_canaries",
              "num_guesses", "num_correct"):
        audit[k] = getattr(verdict, k)
    audit["confidence"] = None if verdict.significance is None else 1.0 - verdict.significance
    if not bounds and error is None and privacy != "unknown":
        warn("no canary bounds (results/*.json has no canaries split): the DP claim could not be tested")
    if utility["initial_train_loss"] is None and privacy != "unknown" and log:
        warn("no step-0 evaluation in train_log.jsonl: whether the model learned is unknown")

    entry = {
        "name": name,
        "error": error,
        "privacy": privacy,
        "dp": dp,
        "utility": utility,
        "train_checks": checks,
        "attacks": attacks,
        "canary_attacks": canary_attacks,
        "audit": audit,
        "extraction": extraction,
        "verdict": verdict.to_dict(),
        "multi_run": _multi_run(md, warn),
        "warnings": warnings,
    }
    report_warnings.extend(f"{name}: {w}" for w in warnings)
    bound_rows = [{"model": name, "attack": a, "method": b.method, "sound": b.sound, "epsilon": b.epsilon,
                   "delta": b.delta, "significance": b.significance, "num_canaries": b.num_canaries,
                   "num_guesses": b.num_guesses, "num_correct": b.num_correct,
                   "strategy": (b.strategy or {}).get("name") if isinstance(b.strategy, Mapping) else None}
                  for a, b in bounds]
    return jsonable(entry), roc, ext_rows, patient_rows, bound_rows


# --------------------------------------------------------------------------- run-level parts


def _canaries(rundir: RunDir, include_texts: bool, warnings: list[str]) -> tuple[dict | None, list[dict]]:
    if not (rundir.data_dir / "canaries.json").is_file():
        return None, []
    try:
        data = rundir.read_canary_file()
    except InputError as err:
        warnings.append(str(err))
        return None, []
    items = data.get("canaries", []) if isinstance(data, Mapping) else []
    spec = data.get("spec") if isinstance(data, Mapping) and isinstance(data.get("spec"), Mapping) else {}
    rows = []
    for c in items if isinstance(items, list) else []:
        if not isinstance(c, Mapping):
            continue
        row = {"id": str(c.get("id")), "kind": c.get("kind"), "secret": c.get("secret"),
               "included": c.get("included"), "repetitions": _int(c.get("repetitions"))}
        if include_texts:
            row["prefix"] = c.get("prefix")
            row["text"] = c.get("text")
        rows.append(row)
    reps = sorted({r["repetitions"] for r in rows if r["repetitions"] is not None})
    kinds = sorted({str(r["kind"]) for r in rows if r["kind"] is not None})
    summary = {
        "count": len(rows),
        "included": sum(1 for r in rows if r["included"] is True),
        "kind": ", ".join(kinds) or None,
        "set": spec.get("name"),
        "repetitions": reps[0] if len(reps) == 1 else reps,
        "secret_space_size": data.get("secret_space_size") if isinstance(data, Mapping) else None,
        "texts_included": include_texts,
    }
    return jsonable(summary), jsonable(rows)


def _fleet(rundir: RunDir, attack_names: set[str], warnings: list[str]) -> dict | None:
    """The reference models and how many had each text in (out of) their training set."""
    try:
        fleet = rundir.read_fleet()
    except InputError as err:
        warnings.append(str(err))
        return None
    if fleet is None:
        return None
    keep, _ = fleet
    n_in = keep.sum(axis=0)
    summary = {
        "num_models": int(keep.shape[0]),
        "in_per_text_min": int(n_in.min()) if n_in.size else None,
        "out_per_text_min": int((keep.shape[0] - n_in).min()) if n_in.size else None,
    }
    fewest = min(summary["in_per_text_min"] or 0, summary["out_per_text_min"] or 0)
    if "lira_online" in attack_names and fewest < MIN_ONLINE_MODELS:
        warnings.append(
            f"lira_online: some texts have only {fewest} reference model(s) on one side (in or out of "
            f"their training set); the online attack's per-text means are then single noisy values and "
            f"its TPR at low FPR is poor: train more reference models (fleet.num_models); rmia and "
            f"lira_offline need fewer")
    return summary


def _tpr_warning(models: list[dict], warnings: list[str]) -> None:
    """One line for all the TPRs withheld for lack of non-members (not one per attack)."""
    for split, key in (("members", "attacks"), ("canaries", "canary_attacks")):
        outs = sorted({a["num_out"] for m in models for a in m[key].values() if a["num_out"] is not None})
        missing = sorted({f for m in models for a in m[key].values() for f, v in a["tpr_at_fpr"].items()
                          if v is None}, key=float)
        if outs and missing:
            warnings.append(
                f"{split}: TPR at FPR {', '.join(format(float(f) * 100, 'g') + '%' for f in missing)} "
                f"not reported for some attacks (not enough non-members: {outs[0]} held out at least, "
                f"TPR at FPR a needs about 10 / a)")


def _step_audit(rundir: RunDir, warnings: list[str]) -> dict | None:
    """The white-box step audit written by ``dpaudit validate --step --out RUN`` (its
    ``step_audit.json`` as written, see :mod:`dpaudit.stages.validate_step`), or None."""
    try:
        audit = rundir.read_step_audit()
    except InputError as err:
        warnings.append(str(err))
        return None
    if audit is not None and audit.get("verdict") not in ("violated", "consistent", "inconclusive"):
        warnings.append(f"{rundir.step_audit_path.name} has no verdict: not a step audit, not reported")
        return None
    return jsonable(audit)


# --------------------------------------------------------------------------- entry point


def assemble(rundir: RunDir, *, include_texts: bool = False, title: str | None = None) -> ReportData:
    """The report of ``rundir`` as data (see the module docstring)."""
    import dpaudit

    warnings: list[str] = []
    inputs = rundir.read_audit_inputs()
    config, trainable = None, "all"
    if rundir.config_path.is_file():
        cfg = rundir.read_config()
        names = cfg.model_names()
        config, trainable = cfg.to_dict(), cfg.model.trainable
        kind = "run"
    elif inputs is not None:
        names = rundir.model_names()
        kind = "audit-model"
    else:
        raise InputError(f"{rundir.root} is not a dpaudit run directory (no config.resolved.yaml "
                         f"and no audit_inputs.json)")
    extra = [n for n in rundir.model_names() if n not in names]
    if extra:
        warnings.append(f"models/ holds directories not in the config, not reported: {', '.join(extra)}")
    if not names:
        raise InputError(f"nothing to report in {rundir.root}: no models")

    canaries, canary_rows = _canaries(rundir, include_texts, warnings)
    num_canaries = canaries["count"] if canaries else None

    models, roc, ext_rows, patient_rows, bound_rows = [], {}, [], [], []
    for name in names:
        reps = canaries["repetitions"] if canaries and isinstance(canaries["repetitions"], int) else 1
        entry, r, e, p, b = _model(rundir, name, include_texts=include_texts, num_canaries=num_canaries,
                                   repetitions=reps, trainable=trainable, report_warnings=warnings)
        models.append(entry)
        roc[name] = r
        ext_rows += e
        patient_rows += p
        bound_rows += b
    _tpr_warning(models, warnings)
    attack_names = {a for m in models for a in m["attacks"]}
    fleet = _fleet(rundir, attack_names, warnings)
    manifest = None
    try:
        manifest = rundir.read_manifest()
    except InputError as err:
        warnings.append(str(err))

    # per-canary extraction beside the canary table, one column per model
    by_canary: dict[str, dict[str, Any]] = {}
    for row in ext_rows:
        by_canary.setdefault(row["canary_id"], {})[f"extracted[{row['model']}]"] = row.get("extracted")
    canary_table = [{**c, **by_canary.get(c["id"], {})} for c in canary_rows]

    report = {
        "schema_version": SCHEMA_VERSION,
        "dpaudit_version": dpaudit.__version__,
        "title": title or f"dpaudit report: {rundir.root.resolve().name}",
        "kind": kind,
        "include_texts": include_texts,
        "models": models,
        "fleet": fleet,
        "canaries": canaries,
        "audit_inputs": jsonable(inputs) if inputs is not None else None,
        # audit-model: the model-free classifier on the member / non-member split (dpaudit.blind)
        "blind_baseline": jsonable((inputs or {}).get("blind_baseline")),
        "step_audit": _step_audit(rundir, warnings),
        "config": jsonable(config),
        "manifest": jsonable(manifest),
        "figures": {},
        "tables": {},
        "html": "report.html",
        "warnings": list(dict.fromkeys(warnings)),
    }
    tables = {
        "models": _columns_rows(_model_rows(models)),
        "attacks": _columns_rows(_attack_rows(models)),
        "bounds": _columns_rows(jsonable(bound_rows)),
        "canaries": _columns_rows(canary_table),
        "extraction": _columns_rows(jsonable(ext_rows)),
        "patient_secrets": _columns_rows(jsonable(patient_rows)),
        "secret_canaries": _columns_rows(jsonable([{"model": m["name"], **c} for m in models
                                                   for c in ((m["extraction"] or {}).get("secrets") or {}).get("canaries", [])])),
    }
    tables = {k: v for k, v in tables.items() if v[1]}
    return ReportData(report=report, roc=roc, tables=tables)


def _columns_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    columns: list[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    return columns, rows


def _model_rows(models: list[dict]) -> list[dict]:
    rows = []
    for m in models:
        dp, a, u, v = m["dp"], m["audit"], m["utility"], m["verdict"]
        rows.append({"model": m["name"], "privacy": m["privacy"], "unit": dp["unit"], "epsilon": dp["epsilon"],
                     "delta": dp["delta"], "noise_multiplier": dp["noise_multiplier"],
                     "sample_rate": dp["sample_rate"], "steps": dp["steps"],
                     "epsilon_lower_bound": a["epsilon_lower_bound"], "bound_method": a["method"],
                     "bound_attack": a["attack"], "ceiling": a["ceiling"],
                     "heldout_perplexity": u["heldout_perplexity"], "learned": u["learned"],
                     "verdict": v["status"], "error": m["error"]})
    return rows


def _attack_rows(models: list[dict]) -> list[dict]:
    rows = []
    for m in models:
        for split, key in (("members", "attacks"), ("canaries", "canary_attacks")):
            for name, s in m[key].items():
                rows.append({"model": m["name"], "attack": name, "split": split, "auc": s["auc"],
                             "auc_ci_low": (s["auc_ci"] or [None, None])[0],
                             "auc_ci_high": (s["auc_ci"] or [None, None])[1],
                             **{f"tpr_at_fpr_{f}": s["tpr_at_fpr"][f] for f in REPORT_FPRS},
                             "num_in": s["num_in"], "num_out": s["num_out"]})
    return rows
