"""Who pays for the privacy: one model's ``groups`` entry of the report, per group of people.

DP-SGD's guarantee is the same for every unit, its cost is not: clipping shrinks the atypical
units' gradients most, so a rare group loses the most utility (Bagdasaryan, Poursaeed,
Shmatikov 2019, arXiv 1905.12101), while a model trained without DP memorizes its rare
examples the most (Feldman 2020, arXiv 1906.05271; Carlini et al. 2022, "The privacy onion
effect", arXiv 2206.10469). Per group and model (``report["models"][i]["groups"]``):

- ``heldout_perplexity``: exp of the held-out records' negative log-likelihood per token (the
  target model's signals), with a percentile bootstrap over the group's held-out *units*
  (:func:`dpaudit.audit.groups.ratio_estimate`); ``perplexity_ratio``: this group's over the
  majority's (the group with the most held-out units), the two resampled independently;
- ``membership``: AUC and TPR at 1% FPR of one attack (``loss`` when it ran) on the group's
  member against its held-out records, a cluster bootstrap over units, "not enough" below
  :data:`~dpaudit.audit.groups.MIN_UNITS` units a side;
- ``extraction``: the group's patients' secrets (MRN reproduced by greedy decoding) from
  ``extraction.json``, member notes beside held-out ones;
- ``clipping``: from the trainer's per-unit record, the share of the group's sampled
  unit-steps whose gradient was clipped and the mean pre-clipping norm, each with a bootstrap
  over units; null when the trainer did not record it (non-private, third-party).

Everything is a pure function of the snapshot; NumPy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpaudit.audit.groups import (
    MIN_UNITS,
    Estimate,
    UnitClipping,
    by_unit,
    clipping,
    membership,
    perplexity_ratio,
    ratio_estimate,
)
from dpaudit.report.snapshot import ModelSnapshot, Unreadable

__all__ = ["ATTACK", "GROUP_COLUMNS", "group_entries", "group_rows", "majority"]

#: The attack whose scores are split by group (the simplest, run on every audit); another
#: one when it did not run.
ATTACK = "loss"
#: The columns of ``tables/groups.csv``.
GROUP_COLUMNS = ("model", "epsilon", "unit", "group", "heldout_units", "heldout_records",
                 "heldout_perplexity", "heldout_perplexity_low", "heldout_perplexity_high",
                 "perplexity_ratio", "perplexity_ratio_low", "perplexity_ratio_high",
                 "attack", "auc", "auc_low", "auc_high", "tpr_at_1pct_fpr", "tpr_low", "tpr_high", "membership_note",
                 "member_notes", "member_extracted_notes", "heldout_notes", "heldout_extracted_notes",
                 "clipped_share", "clipped_share_low", "clipped_share_high", "mean_norm", "mean_norm_low",
                 "mean_norm_high", "clipping_units")


def majority(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The group with the most held-out units (ties: the first name), None without groups."""
    units: dict[str, set] = {}
    for r in records:
        if r.get("group") is not None and r.get("role") == "heldout":
            units.setdefault(str(r["group"]), set()).add(r["unit_id"])
    return max(sorted(units), key=lambda g: len(units[g])) if units else None


def _attack_scores(results, n: int) -> tuple[str | None, np.ndarray | None, np.ndarray | None]:
    if isinstance(results, Unreadable) or not isinstance(results, Mapping) or not results:
        return None, None, None
    name = ATTACK if ATTACK in results else min(results)
    arrays = (results[name].get("arrays") or {}).get("members")
    if arrays is None or len(arrays[0]) != n:
        return name, None, None
    return name, np.asarray(arrays[0], dtype=np.float64), np.asarray(arrays[1], dtype=bool)


def _extraction_by_group(extraction) -> dict[str, Mapping[str, Any]]:
    if not isinstance(extraction, Mapping):
        return {}
    rows = (extraction.get("patient_secrets") or {}).get("by_group") if isinstance(
        extraction.get("patient_secrets"), Mapping) else None
    return {str(r["group"]): r for r in rows or [] if isinstance(r, Mapping) and "group" in r}


def group_entries(model: ModelSnapshot, records: Sequence[Mapping[str, Any]] | None, *, seed: int = 0,
                  num_samples: int = 1000) -> tuple[list[dict[str, Any]], list[str]]:
    """(``groups`` entries, warnings) of one model. ``records``: the run's candidate records in
    the order the attacks scored them, each ``{"unit_id", "role", "group"}`` (None or without
    ``group``: no groups, ``[]``)."""
    if not records or any(r.get("group") is None for r in records):
        return [], []
    warnings: list[str] = []
    n = len(records)
    groups = sorted({str(r["group"]) for r in records})
    big = majority(records)
    unit_of = np.asarray([str(r["unit_id"]) for r in records], dtype=object)
    group_of = np.asarray([str(r["group"]) for r in records], dtype=object)
    heldout = np.asarray([r["role"] == "heldout" for r in records], dtype=bool)

    nll = tokens = None
    signals = model.record_nll
    if isinstance(signals, Unreadable):
        warnings.append(f"per-group perplexity: {signals}")
    elif signals is not None:
        nll, tokens = (np.asarray(a, dtype=np.float64) for a in signals)
        if nll.shape != (n,) or tokens.shape != (n,):
            warnings.append(f"per-group perplexity: the target signals score {nll.size} records, the run has {n}")
            nll = tokens = None

    def per_unit(group: str):
        rows = heldout & (group_of == group)
        _, (a, b) = by_unit(list(unit_of[rows]), nll[rows], tokens[rows])
        return a, b

    ppl: dict[str, Estimate] = {}
    sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if nll is not None:
        for g in groups:
            sums[g] = per_unit(g)
            ppl[g] = ratio_estimate(*sums[g], transform=np.exp, seed=seed, num_samples=num_samples)

    attack, scores, is_member = _attack_scores(model.results, n)
    ext = _extraction_by_group(model.extraction)
    unit_clipping = model.unit_clipping
    if isinstance(unit_clipping, Unreadable):
        warnings.append(f"per-group clipping: {unit_clipping}")
        unit_clipping = None
    unit_group = dict(zip(unit_of, group_of))

    entries = []
    for g in groups:
        rows = group_of == g
        entry: dict[str, Any] = {
            "group": g,
            "majority": g == big,
            "heldout_units": len(set(unit_of[rows & heldout])),
            "member_units": len(set(unit_of[rows & ~heldout])),
            "heldout_records": int((rows & heldout).sum()),
            "heldout_perplexity": ppl[g].to_dict() if g in ppl else None,
            "perplexity_ratio": None,
            "membership": None,
            "extraction": None,
            "clipping": None,
        }
        if g in sums and big is not None and g != big:
            entry["perplexity_ratio"] = perplexity_ratio(*sums[g], *sums[big], seed=seed,
                                                         num_samples=num_samples).to_dict()
        if scores is not None:
            m = membership(scores[rows], is_member[rows], list(unit_of[rows]), fprs=(0.01,), seed=seed,
                           min_units=MIN_UNITS)
            entry["membership"] = {"attack": attack, "auc": m["auc"].to_dict(),
                                   "tpr_at_fpr": {"0.01": m["tpr_at_fpr"][0.01].to_dict()},
                                   **{k: m[k] for k in ("num_in", "num_out", "units_in", "units_out")}}
        if g in ext:
            e = ext[g]
            entry["extraction"] = {k: e.get(k) for k in (
                "member_patients", "member_notes", "member_extracted_notes", "member_mean_logprob",
                "heldout_patients", "heldout_notes", "heldout_extracted_notes", "heldout_mean_logprob")}
        if isinstance(unit_clipping, UnitClipping):
            c = clipping(unit_clipping, lambda u, g=g: unit_group.get(u) == g, seed=seed, num_samples=num_samples)
            entry["clipping"] = {"units": c["units"], "sampled": c["sampled"], "max_grad_norm": unit_clipping.max_grad_norm,
                                 "clipped_share": c["clipped_share"].to_dict(), "mean_norm": c["mean_norm"].to_dict()}
        entries.append(entry)
    return entries, warnings


def _est(e, key: str = "value"):
    return None if not isinstance(e, Mapping) else e.get(key)


def group_rows(models: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``tables/groups.csv``: one per model and group."""
    rows = []
    for m in models:
        for g in m.get("groups") or []:
            ppl, ratio = g["heldout_perplexity"], g["perplexity_ratio"]
            mem = g["membership"] or {}
            tpr = (mem.get("tpr_at_fpr") or {}).get("0.01")
            ext = g["extraction"] or {}
            clip = g["clipping"] or {}
            rows.append({
                "model": m["name"], "epsilon": m["dp"].get("epsilon"), "unit": m["dp"].get("unit"),
                "group": g["group"], "heldout_units": g["heldout_units"], "heldout_records": g["heldout_records"],
                "heldout_perplexity": _est(ppl), "heldout_perplexity_low": _est(ppl, "low"),
                "heldout_perplexity_high": _est(ppl, "high"),
                "perplexity_ratio": _est(ratio), "perplexity_ratio_low": _est(ratio, "low"),
                "perplexity_ratio_high": _est(ratio, "high"),
                "attack": mem.get("attack"), "auc": _est(mem.get("auc")), "auc_low": _est(mem.get("auc"), "low"),
                "auc_high": _est(mem.get("auc"), "high"), "tpr_at_1pct_fpr": _est(tpr), "tpr_low": _est(tpr, "low"),
                "tpr_high": _est(tpr, "high"), "membership_note": _est(mem.get("auc"), "note") or _est(tpr, "note"),
                "member_notes": ext.get("member_notes"), "member_extracted_notes": ext.get("member_extracted_notes"),
                "heldout_notes": ext.get("heldout_notes"), "heldout_extracted_notes": ext.get("heldout_extracted_notes"),
                "clipped_share": _est(clip.get("clipped_share")),
                "clipped_share_low": _est(clip.get("clipped_share"), "low"),
                "clipped_share_high": _est(clip.get("clipped_share"), "high"),
                "mean_norm": _est(clip.get("mean_norm")), "mean_norm_low": _est(clip.get("mean_norm"), "low"),
                "mean_norm_high": _est(clip.get("mean_norm"), "high"), "clipping_units": clip.get("units"),
            })
    return rows
