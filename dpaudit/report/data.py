"""The report as data: one dict assembled from a snapshot of a run directory, no drawing.

:func:`assemble` is a pure function of a :class:`~dpaudit.report.snapshot.RunSnapshot` (read
by :mod:`dpaudit.stages.report`) and returns a :class:`ReportData`: the JSON-ready ``report``
dict (``report.json``, schema version 2), the score arrays the ROC figure needs, and the
per-row tables (``tables/*.csv``), which are never inlined in the HTML.

Per model (``report["models"][i]``; see ``MODEL_KEYS``): :func:`dpaudit.report.model.model_entry`,
and its ``groups`` (who pays for the privacy, per group of people): :mod:`dpaudit.report.groups`
(``tables/groups.csv``).

Run-level ``step_audit``: the white-box audit of one DP-SGD step (``dpaudit validate --step
--out RUN``, :mod:`dpaudit.stages.validate_step`) when one was run into the directory, else null.
- ``multi_run``: the multi-run audit (``audit.mode: multi_run``; null otherwise) as
  :mod:`dpaudit.stages.multi_run` wrote it (Clopper-Pearson bound, GDP estimate, ceiling and
  verdict over K runs with the canary and K without), without the per-run scores.

Privacy of the report: member texts (canary ``text`` / ``prefix``, free-text fields of
``extraction.json``) enter only with ``include_texts=True``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable
from dpaudit.progress import Progress
from dpaudit.report.groups import GROUP_COLUMNS, group_rows, group_entries
from dpaudit.report.model import model_entry
from dpaudit.report.schema import (
    DP_KEYS,
    MIN_ONLINE_MODELS,
    MODEL_KEYS,
    REFERENCE_LOSS_GAP,
    REPORT_FPRS,
    SCHEMA_VERSION,
    SHOWN_FPRS,
    UNIT_LABEL,
)
from dpaudit.report.snapshot import RunSnapshot, Unreadable
from dpaudit.report.values import integer

__all__ = ["SCHEMA_VERSION", "ReportData", "assemble", "withheld_tprs", "MODEL_KEYS", "DP_KEYS", "REPORT_FPRS",
           "UNIT_LABEL"]


@dataclass
class ReportData:
    """What :func:`assemble` returns: the report dict, ROC arrays and per-row tables."""

    report: dict[str, Any]
    # roc[model][attack][split] = (in_scores, out_scores)
    roc: dict[str, dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]] = field(default_factory=dict)
    # tables[stem] = (columns, rows): written to tables/STEM.csv
    tables: dict[str, tuple[list[str], list[dict[str, Any]]]] = field(default_factory=dict)


# --------------------------------------------------------------------------- run-level parts


def _canaries(data, include_texts: bool, warnings: list[str]) -> tuple[dict | None, list[dict]]:
    if data is None:
        return None, []
    if isinstance(data, Unreadable):
        warnings.append(str(data))
        return None, []
    items = data.get("canaries", []) if isinstance(data, Mapping) else []
    spec = data.get("spec") if isinstance(data, Mapping) and isinstance(data.get("spec"), Mapping) else {}
    rows = []
    for c in items if isinstance(items, list) else []:
        if not isinstance(c, Mapping):
            continue
        row = {"id": str(c.get("id")), "kind": c.get("kind"), "secret": c.get("secret"),
               "included": c.get("included"), "repetitions": integer(c.get("repetitions"))}
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


def _fleet(keep, attack_names: set[str], warnings: list[str]) -> dict | None:
    """The reference models and how many had each text in (out of) their training set."""
    if isinstance(keep, Unreadable):
        warnings.append(str(keep))
        return None
    if keep is None:
        return None
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


def _references(inputs, attack_names: set[str], warnings: list[str]) -> dict | None:
    """``audit-model --train-references``: how its reference models were trained and how their
    held-out loss on the non-members compares with the target's (each on the non-members it
    did not train on); warns when one is much worse than the target (``REFERENCE_LOSS_GAP``),
    or when online LiRA has too few models on a side of some text."""
    refs = (inputs or {}).get("references")
    if not isinstance(refs, Mapping):
        return None
    rows = [r for r in refs.get("heldout_loss") or []
            if isinstance(r, Mapping) and r.get("loss") is not None and r.get("target_loss") is not None]
    gaps = np.array([r["loss"] - r["target_loss"] for r in rows], dtype=float)
    summary = {k: refs.get(k) for k in ("trained", "design", "start", "base_model", "architecture", "trainer", "train",
                                        "population", "audited_per_reference", "in_per_text", "cost_s")}
    summary.update(
        reference_loss=float(np.median([r["loss"] for r in rows])) if rows else None,
        target_loss=float(np.median([r["target_loss"] for r in rows])) if rows else None,
        loss_gap=float(np.median(gaps)) if rows else None,
        much_worse=int((gaps > REFERENCE_LOSS_GAP).sum()),
    )
    if summary["much_worse"]:
        warnings.append(
            f"reference models: {summary['much_worse']} of {len(rows)} have a held-out loss on the non-members "
            f"more than {REFERENCE_LOSS_GAP:g} nats a token above the target's (median {summary['reference_loss']:.2f} "
            f"against {summary['target_loss']:.2f}): references much worse than the target are poor stand-ins for it "
            f"and weaken LiRA and RMIA; train them like the target (--reference-config), on more population texts, "
            f"or from the target's base (--reference-base)")
    in_text, trained = refs.get("in_per_text"), refs.get("trained")
    if "lira_online" in attack_names and in_text and trained:
        fewest = min(int(in_text[0]), int(trained) - int(in_text[1]))
        if fewest < MIN_ONLINE_MODELS:
            warnings.append(
                f"lira_online: some texts have only {fewest} reference model(s) on one side (in or out of their "
                f"training set); its per-text means are then single noisy values: train more reference models "
                f"(--train-references); rmia and lira_offline need fewer")
    return jsonable(summary)


def withheld_tprs(models: Sequence[Mapping[str, Any]], key: str) -> dict[str, int | None]:
    """The shown FPRs (``SHOWN_FPRS``) at which no attack of any of ``models`` on split ``key``
    (``"attacks"`` or ``"canary_attacks"``) has a TPR (too few non-members: each withheld),
    each with the most non-members an attack had. The figure and the tables leave them out."""
    splits = [a for m in models for a in m[key].values()]
    most = max((a["num_out"] for a in splits if a["num_out"] is not None), default=None)
    return {f: most for f in SHOWN_FPRS if splits and all(a["tpr_at_fpr"].get(f) is None for a in splits)}


def _tpr_warning(models: list[dict], warnings: list[str]) -> None:
    """One line for all the TPRs withheld for lack of non-members (not one per attack); those
    withheld for every attack are said where their panel and column are left out."""
    for split, key in (("members", "attacks"), ("canaries", "canary_attacks")):
        outs = sorted({a["num_out"] for m in models for a in m[key].values() if a["num_out"] is not None})
        dropped = withheld_tprs(models, key)
        missing = sorted({f for m in models for a in m[key].values() for f, v in a["tpr_at_fpr"].items()
                          if v is None and f not in dropped}, key=float)
        if outs and missing:
            warnings.append(
                f"{split}: TPR at FPR {', '.join(format(float(f) * 100, 'g') + '%' for f in missing)} "
                f"not reported for some attacks (not enough non-members: {outs[0]} held out at least, "
                f"TPR at FPR a needs about 10 / a)")


def _step_audit(audit, warnings: list[str]) -> dict | None:
    """The white-box step audit written by ``dpaudit validate --step --out RUN`` (its
    ``step_audit.json`` as written, see :mod:`dpaudit.stages.validate_step`), or None."""
    if isinstance(audit, Unreadable):
        warnings.append(str(audit))
        return None
    if audit is not None and audit.get("verdict") not in ("violated", "consistent", "inconclusive"):
        warnings.append("step_audit.json has no verdict: not a step audit, not reported")
        return None
    return jsonable(audit)


# --------------------------------------------------------------------------- entry point


def assemble(snapshot: RunSnapshot, *, include_texts: bool = False, title: str | None = None,
             version: str | None = None) -> ReportData:
    """The report of a run's snapshot as data (see the module docstring); ``version`` is the
    toolkit's version that built it."""
    warnings: list[str] = []
    if snapshot.extra:
        warnings.append(f"models/ holds directories not in the config, not reported: {', '.join(snapshot.extra)}")
    if not snapshot.names:
        raise InputError(f"nothing to report in {snapshot.name}: no models")
    canaries, canary_rows = _canaries(snapshot.canaries, include_texts, warnings)
    reps = canaries["repetitions"] if canaries and isinstance(canaries["repetitions"], int) else 1

    models, roc, ext_rows, patient_rows, bound_rows = [], {}, [], [], []
    with Progress(total=len(snapshot.models), desc="report", unit="model") as bar:
        for model in snapshot.models:
            entry, model_warnings, r, e, p, b = model_entry(model, include_texts=include_texts, repetitions=reps,
                                                            trainable=snapshot.trainable)
            entry["groups"], group_warnings = group_entries(model, snapshot.records,
                                                            seed=int((snapshot.config or {}).get("seed") or 0))
            model_warnings.extend(group_warnings)
            warnings.extend(f"{model.name}: {w}" for w in model_warnings)
            models.append(entry)
            roc[model.name] = r
            ext_rows += e
            patient_rows += p
            bound_rows += b
            bar.update(1)
    base_groups = None
    if snapshot.base_nll is not None:  # the base model: the utility gap every fine-tune starts from
        from dpaudit.report.snapshot import ModelSnapshot

        base_groups, base_warnings = group_entries(ModelSnapshot(name="base", record_nll=snapshot.base_nll),
                                                   snapshot.records, seed=int((snapshot.config or {}).get("seed") or 0))
        warnings.extend(f"base: {w}" for w in base_warnings)
    _tpr_warning(models, warnings)
    fleet = _fleet(snapshot.fleet_keep, {a for m in models for a in m["attacks"]}, warnings)
    references = _references(snapshot.audit_inputs, {a for m in models for a in m["attacks"]}, warnings)
    manifest = snapshot.manifest
    if isinstance(manifest, Unreadable):
        warnings.append(str(manifest))
        manifest = None
    inputs = snapshot.audit_inputs
    report = {
        "schema_version": SCHEMA_VERSION,
        "dpaudit_version": version,
        "title": title or f"dpaudit report: {snapshot.name}",
        "kind": snapshot.kind,
        "include_texts": include_texts,
        "models": models,
        # per group, the base model's held-out perplexity (and ratio): what every fine-tune starts from
        "groups_base": [{k: g[k] for k in ("group", "majority", "heldout_units", "heldout_perplexity",
                                           "perplexity_ratio")} for g in base_groups] if base_groups else None,
        "fleet": fleet,
        "canaries": canaries,
        "audit_inputs": jsonable(inputs) if inputs is not None else None,
        # audit-model: the model-free classifier on the member / non-member split (dpaudit.blind)
        "blind_baseline": jsonable((inputs or {}).get("blind_baseline")),
        # audit-model --train-references: the reference models trained for the audit
        "references": references,
        "step_audit": _step_audit(snapshot.step_audit, warnings),
        "config": jsonable(snapshot.config),
        "manifest": jsonable(manifest),
        "figures": {},
        "tables": {},
        "html": "report.html",
        "warnings": list(dict.fromkeys(warnings)),
    }
    return ReportData(report=report, roc=roc, tables=_tables(models, canary_rows, ext_rows, patient_rows, bound_rows))


def _tables(models, canary_rows, ext_rows, patient_rows, bound_rows) -> dict:
    """The per-row tables, each (columns, rows); empty ones are left out."""
    # per-canary extraction beside the canary table, one column per model
    by_canary: dict[str, dict[str, Any]] = {}
    for row in ext_rows:
        by_canary.setdefault(row["canary_id"], {})[f"extracted[{row['model']}]"] = row.get("extracted")
    canary_table = [{**c, **by_canary.get(c["id"], {})} for c in canary_rows]
    tables = {
        "models": _columns_rows(_model_rows(models)),
        "groups": (list(GROUP_COLUMNS), group_rows(models)),
        "attacks": _columns_rows(_attack_rows(models)),
        "bounds": _columns_rows(jsonable(bound_rows)),
        "canaries": _columns_rows(canary_table),
        "extraction": _columns_rows(jsonable(ext_rows)),
        "patient_secrets": _columns_rows(jsonable(patient_rows)),
        "secret_canaries": _columns_rows(jsonable([{"model": m["name"], **c} for m in models
                                                   for c in ((m["extraction"] or {}).get("secrets") or {}).get("canaries", [])])),
    }
    return {k: v for k, v in tables.items() if v[1]}


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
                     "heldout_perplexity": u["heldout_perplexity"], "learned": u["learned"], "fit_training_rows": u["fit_training_rows"],
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
