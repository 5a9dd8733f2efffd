"""The extraction part of a model's report entry: secrets, canaries, PII fields, k-extractable
records and patients' secrets, from its ``extraction.json``, with each group's guarantee."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpaudit.errors import InputError
from dpaudit.report.schema import SAFE_STRING_KEYS
from dpaudit.report.snapshot import Unreadable
from dpaudit.report.values import integer, num, rate


def extraction_summary(name: str, ext, include_texts: bool, warn) -> tuple[dict | None, list[dict], list[dict]]:
    """(summary, per-canary rows, patient-secret rows) of model ``name``'s ``extraction.json``."""
    if isinstance(ext, Unreadable):
        warn(str(ext))
        return None, [], []
    if not isinstance(ext, Mapping):
        return None, [], []
    summary: dict[str, Any] = {"method": ext.get("method") if isinstance(ext.get("method"), str) else None}
    for side in ("included", "excluded"):
        summary[f"{side}_extracted"] = integer(ext.get(f"{side}_extracted"))
        summary[f"{side}_total"] = integer(ext.get(f"{side}_total"))
        summary[f"{side}_rate"] = rate(ext.get(f"{side}_extracted"), ext.get(f"{side}_total"))
    rows = []
    per = ext.get("new_token_canaries", ext.get("canaries"))  # "canaries" in files before the secret canaries
    if isinstance(per, Mapping):
        for cid, rec in per.items():
            if not isinstance(rec, Mapping):
                continue
            row = {"model": name, "canary_id": str(cid)}
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
                "notes": integer(g.get("notes")),
                "member_patients": integer(g.get("member_patients")),
                "member_mean_logprob": num(g.get("member_mean_logprob")),
                "heldout_mean_logprob": num(g.get("heldout_mean_logprob")),
                "member_extracted": num(g.get("member_extracted")),
                "heldout_extracted": num(g.get("heldout_extracted")),
                "epsilon": None,  # the patient's guarantee, set by patient_epsilons for a DP model
            }
            groups.append(row)
            patient_rows.append(row)  # with "model" and "field" added by the model entry, after "epsilon"
        summary["patient_secrets"] = {"field": str(ps.get("field")) if ps.get("field") is not None else None,
                                      "groups": groups}
    return summary, rows, patient_rows


def _secret_summary(ext: Mapping) -> dict[str, Any]:
    """``secrets`` (exposure and extraction of the secret canaries by repetition count, and
    per canary: ids and numbers only), ``pii`` and ``k_extractable`` of ``extraction.json``."""
    out: dict[str, Any] = {"secrets": None, "pii": None, "k_extractable": None}
    if isinstance(ext.get("by_repetitions"), list) and ext["by_repetitions"]:
        groups = [{"repetitions": integer(g.get("repetitions")), "num": integer(g.get("num")),
                   "mean_exposure": num(g.get("mean_exposure")), "median_exposure": num(g.get("median_exposure")),
                   "extracted": num(g.get("extracted")), "extracted_sampled": num(g.get("extracted_sampled")),
                   "epsilon": None}  # the group's guarantee, set by patient_epsilons for a DP model
                  for g in ext["by_repetitions"] if isinstance(g, Mapping)]
        rows = [{"id": str(c.get("id")), "included": bool(c.get("included")), "repetitions": integer(c.get("repetitions")),
                 "exposure": num(c.get("exposure")), "rank": num(c.get("rank")), "extracted": bool(c.get("extracted")),
                 "sampled_hits": integer(c.get("sampled_hits")), "samples": integer(c.get("samples"))}
                for c in ext.get("canaries") or [] if isinstance(c, Mapping)]
        left_out = ext.get("secrets_left_out") if isinstance(ext.get("secrets_left_out"), Mapping) else {}
        out["secrets"] = {"space_bits": num(ext.get("space_bits")), "secret_set": str(ext.get("secret_set")),
                          "exposure_method": str(ext.get("exposure_method")), "groups": groups, "canaries": rows,
                          "left_out": integer(left_out.get("num")) or 0,
                          "left_out_max_tokens": integer(left_out.get("max_tokens"))}
    pii = ext.get("pii")
    if isinstance(pii, Mapping):
        out["pii"] = {role: {f: {"num": integer(v.get("num")), "extracted": integer(v.get("extracted")),
                                 "fraction": num(v.get("fraction"))}
                             for f, v in (pii.get(role) or {}).items() if isinstance(v, Mapping)}
                      for role in ("members", "heldout")}
    k = ext.get("k_extractable")
    if isinstance(k, Mapping):
        out["k_extractable"] = {"k": integer(k.get("k")), "suffix_length": integer(k.get("suffix_length")),
                                **{role: {"num": integer((k.get(role) or {}).get("num")),
                                          "fraction": num((k.get(role) or {}).get("fraction"))}
                                   for role in ("members", "heldout")}}
    return out


def patient_epsilons(groups: list[dict], dp: dict, warn, *, key: str = "notes") -> None:
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
