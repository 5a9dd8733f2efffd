"""Render ``report.html`` from the report dict: one jinja2 template per section.

``templates/base.html`` holds the page (inline CSS, no scripts, no external resources) and
includes ``templates/sections/NAME.html`` for every entry of :data:`SECTIONS`, in order.
A section is one template plus one function ``(report, images) -> context | None``; None
leaves the section out. A section may carry its template inline (``Section.template``, Jinja
source) instead of a file, and :func:`render` takes another tuple of sections than
:data:`SECTIONS`: a new section needs no file of this package. Autoescape is on: every value
from the run directory is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpaudit.report.data import withheld_tprs
from dpaudit.report.schema import MIN_NONMEMBERS_TIMES_FPR, RUNG_LABEL, SHOWN_FPRS, UNIT_LABEL

__all__ = ["SECTIONS", "Section", "render"]


@dataclass(frozen=True)
class Section:
    """A report section: ``context(report, images)`` gives the template's ``c`` (None: the
    section is left out); ``template`` is inline Jinja source, or None for the file
    ``templates/sections/NAME.html``."""

    name: str
    context: Callable[[Mapping[str, Any], Mapping[str, str]], dict[str, Any] | None]
    template: str | None = None

    @property
    def template_name(self) -> str:
        return f"sections/{self.name}.html" if self.template is None else f"inline/{self.name}.html"


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        if math.isnan(value):
            return "—"
        return format(value, spec)
    return str(value)


def _dp_models(r):
    return [m for m in r["models"] if m["privacy"] == "dp"]


def _eps_text(m) -> str:
    if m["privacy"] == "non_private":
        return "∞ (no DP)"
    if m["privacy"] == "unknown":
        return "unknown"
    return _fmt(m["dp"]["epsilon"], ".2f")


# --------------------------------------------------------------------------- section contexts


def _summary(r, images):
    counts: dict[str, int] = {}
    for m in r["models"]:
        status = "failed" if m["error"] else m["verdict"]["status"]
        counts[status] = counts.get(status, 0) + 1
    privacy = {k: sum(1 for m in r["models"] if m["privacy"] == k) for k in ("dp", "non_private", "unknown")}
    # (delta, lowest, highest ceiling) per delta: the ceilings of the models differ a little
    by_delta: dict[float, list[float]] = {}
    for m in r["models"]:
        if m["audit"]["ceiling"] is not None and m["verdict"]["delta"] is not None:
            by_delta.setdefault(m["verdict"]["delta"], []).append(m["audit"]["ceiling"])
    ceilings = [(d, min(v), max(v)) for d, v in sorted(by_delta.items())]
    return {"counts": counts, "privacy": privacy, "ceilings": ceilings, "eps_text": _eps_text}


def _warnings(r, images):
    return {"warnings": r["warnings"]}


def _strongest(m) -> tuple[str, float | None, float | None]:
    """(what, bound, ceiling) of the strongest adversary of a model: the last rung that ran
    (rungs come in ladder order, weakest first), else its canary audit, the released model's."""
    ran = [g for g in m["rungs"] if g["epsilon"] is not None]
    if ran:
        top = ran[-1]
        return RUNG_LABEL[top["rung"]], top["epsilon"], top["ceiling"]
    return RUNG_LABEL["released"], m["audit"]["epsilon_lower_bound"], m["audit"]["ceiling"]


def _ladder_sentence(m) -> str:
    """What a reader can act on, of one model: its strongest adversary's bound against its
    ceiling at the claimed epsilon, and what the verdict makes of it."""
    name, v = m["name"], m["verdict"]
    if m["error"]:
        return f"{name}: failed ({m['error']}); nothing was audited."
    if m["privacy"] == "unknown":
        return f"{name}: privacy unknown (no DP record): there is no claim to test."
    if m["privacy"] == "non_private":
        b = m["audit"]["epsilon_lower_bound"]
        return f"{name}: trained without DP" + ("." if b is None else f"; its canaries show ε ≥ {b:.2f}, for scale.")
    if v["status"] == "violated" and (v["epsilon_lower_bound"] or 0.0) > (v["claimed_epsilon"] or math.inf):
        by = RUNG_LABEL.get(v["attack"]) or f"{RUNG_LABEL['released']} ({v['attack']})"
        return (f"{name}: {by} ε ≥ {v['epsilon_lower_bound']:.2f}, above the claimed ε {v['claimed_epsilon']:.3g} "
                f"({1 - v['significance']:.0%} confidence): the model does not have the privacy it claims; do not "
                "release it under this claim.")
    what, bound, ceiling = _strongest(m)
    head = f"{name}: {what} {'—' if bound is None else format(bound, '.2f')}"
    head += ("" if ceiling is None else f" of a ceiling {ceiling:.2f}") + f" at ε {_fmt(m['dp']['epsilon'], '.3g')}"
    if v["status"] == "consistent":
        return f"{head}: the audit could see a violation, and none was found."
    reason = v["reason"][:1].upper() + v["reason"][1:]  # inconclusive, or violated by the trainer's own checks
    return f"{head}: {v['status']}. {reason}"


def _ladder(r, images):
    if r["kind"] == "audit-model" or not _dp_models(r):
        why = ("an audited released model has no recorded DP claim (privacy unknown), so there is no "
               "accountant ε to compare a bound with" if r["kind"] == "audit-model" or
               all(m["privacy"] == "unknown" for m in r["models"])
               else "no model of this run was trained with DP-SGD")
        return {"image": None, "why": why, "sentences": [], "warnings": len(r["warnings"])}
    return {"image": images.get("compliance"), "why": "the figure could not be drawn",
            "sentences": [(m, _ladder_sentence(m)) for m in r["models"]], "warnings": len(r["warnings"]),
            "heuristic": any(m["privacy"] == "dp" and not m["rungs"] and m["dp"]["last_iterate_epsilon"]
                             for m in r["models"])}


def _verdicts(r, images):
    shown = [name for name in RUNG_LABEL if any(g["rung"] == name for m in r["models"] for g in m["rungs"])]
    return {"models": r["models"], "eps_text": _eps_text, "rung_names": shown, "rung_label": RUNG_LABEL,
            "rung_of": lambda m, name: next((g for g in m["rungs"] if g["rung"] == name), None)}


def _multi_run(r, images):
    models = [m for m in r["models"] if m.get("multi_run")]
    return {"models": models} if models else None


def _step_audit(r, images):
    return {"a": r["step_audit"]} if r.get("step_audit") else None


def _utility(r, images):
    return {"image": images.get("utility"), "models": r["models"], "eps_text": _eps_text}


def _withheld_sentence(withheld: Mapping[str, int | None], split: str) -> str:
    """Which TPRs of ``split`` are left out for lack of non-members, and how many they need."""
    fprs = [f"{float(f) * 100:g}%" for f in withheld]
    needed = [f"{round(MIN_NONMEMBERS_TIMES_FPR / float(f)):,}" for f in withheld]
    most = next(iter(withheld.values()))
    one = len(withheld) == 1
    return (f"{split}: TPR at {' and '.join(fprs)} FPR {'is' if one else 'are'} left out, not enough non-members: "
            f"{'it needs' if one else 'they need'} about {' and '.join(needed)} non-members; this run has "
            f"{'an unknown number' if most is None else format(most, ',')}.")


def _membership(r, images):
    names = sorted({a for m in r["models"] for a in m["attacks"]})
    cnames = sorted({a for m in r["models"] for a in m["canary_attacks"]})
    if not names and not cnames:
        return None
    shown, left_out = {}, []
    for key, split in (("attacks", "Members vs. held-out"), ("canary_attacks", "Canaries")):
        withheld = withheld_tprs(r["models"], key)
        shown[key] = [f for f in SHOWN_FPRS if f not in withheld]
        if withheld:
            left_out.append(_withheld_sentence(withheld, split))
    return {"image": images.get("membership"), "models": r["models"], "names": names, "cnames": cnames,
            "shown": shown, "left_out": left_out, "eps_text": _eps_text}


def _extraction(r, images):
    models = [m for m in r["models"] if m["extraction"]]
    if not models:
        return None
    return {"image": images.get("extraction"), "models": models, "eps_text": _eps_text,
            "secrets_image": images.get("secrets"),
            "secret_models": [m for m in models if m["extraction"].get("secrets")],
            "pii_models": [m for m in models if m["extraction"].get("pii") or m["extraction"].get("k_extractable")]}


def _units(r, images):
    dp = [m for m in _dp_models(r) if m["dp"]["epsilon"] is not None and not m["error"]]
    pairs = []
    for a in dp:
        for b in dp:
            if a["dp"]["unit"] == "example" and b["dp"]["unit"] == "user":
                ea, eb = a["dp"]["epsilon"], b["dp"]["epsilon"]
                target_a, target_b = a["dp"].get("target_epsilon"), b["dp"].get("target_epsilon")
                same = (target_a is not None and target_a == target_b) or abs(ea - eb) <= 0.05 * max(ea, eb)
                if same:
                    pairs.append((a, b))
    return {"pairs": pairs, "image": images.get("patient_secrets"), "unit_label": UNIT_LABEL,
            "has_units": any(m["dp"]["unit"] == "user" for m in dp)}


def _interval_text(e: Mapping[str, Any] | None, spec: str = ".2f") -> str:
    """``value [low, high]`` of an estimate, or its note."""
    if not isinstance(e, Mapping):
        return "—"
    if e.get("value") is None:
        return e.get("note") or "—"
    if e.get("low") is None:
        return _fmt(e["value"], spec)
    return f"{_fmt(e['value'], spec)} [{_fmt(e['low'], spec)}, {_fmt(e['high'], spec)}]"


def _apart(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> int:
    """+1 when interval a lies wholly above interval b, -1 below, 0 when they overlap or one
    is missing."""
    if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or None in (a.get("low"), b.get("high"),
                                                                          a.get("high"), b.get("low")):
        return 0
    return 1 if a["low"] > b["high"] else -1 if a["high"] < b["low"] else 0


def _group_findings(models: list[Mapping[str, Any]], base: list[Mapping[str, Any]] | None = None) -> list[str]:
    """The sentences of point 4: does the minority's perplexity ratio grow as ε falls, and is
    the minority clipped more often; the numbers with their intervals. ``base``: the base
    model's groups (``report["groups_base"]``), the gap every fine-tune starts from."""
    out = []
    base_ratio = {g["group"]: g.get("perplexity_ratio") for g in base or []}
    minorities = sorted({g["group"] for m in models for g in m["groups"] if not g.get("majority")})
    majority = next((g["group"] for m in models for g in m["groups"] if g.get("majority")), None)
    dp = sorted([m for m in models if m["privacy"] == "dp" and m["dp"]["epsilon"] is not None],
                key=lambda m: m["dp"]["epsilon"])
    nodp = [m for m in models if m["privacy"] == "non_private"]
    for n in minorities:
        def ratio(m, n=n):
            return next((g["perplexity_ratio"] for g in m["groups"] if g["group"] == n), None)
        points = [(m, ratio(m)) for m in (dp + nodp) if isinstance(ratio(m), Mapping) and ratio(m).get("value")]
        if len(points) < 2:
            continue
        listed = "; ".join(f"{_eps_text(m)}: {_interval_text(r)}" for m, r in points)
        lowest, loosest = points[0], points[-1]
        verdict = _apart(lowest[1], loosest[1])
        said = {1: "grows as ε falls: its interval at the smallest ε lies above the one at the largest",
                -1: "shrinks as ε falls: its interval at the smallest ε lies below the one at the largest",
                0: "does not change measurably with ε at this scale: the intervals at the smallest and the largest "
                   "ε overlap"}[verdict]
        start = (f" The base model, before fine-tuning: {_interval_text(base_ratio[n])}."
                 if isinstance(base_ratio.get(n), Mapping) and base_ratio[n].get("value") is not None else "")
        plain = next((r for m, r in points if m in nodp), None)
        why = (f" Without DP the group is no harder to predict than group {majority} (ratio {_interval_text(plain)}, an "
               f"interval that holds 1): it is not atypical for this model, so DP has no gap to widen."
               if verdict == 0 and plain and plain.get("low") is not None and plain["low"] <= 1 <= plain["high"] else "")
        out.append(f"Perplexity of group {n} over group {majority} ({lowest[1]['confidence']:.0%} intervals over "
                   f"units), by ε: {listed}. The ratio {said}.{why}{start}")
        clipped = []
        for m in dp:
            g = {x["group"]: x for x in m["groups"]}
            a, b = (g.get(k, {}).get("clipping") or {} for k in (n, majority))
            if a.get("clipped_share") and b.get("clipped_share") and a["clipped_share"].get("value") is not None:
                side = _apart(a["clipped_share"], b["clipped_share"])
                word = {1: "more often", -1: "less often", 0: "indistinguishably"}[side]
                clipped.append(f"{_eps_text(m)} ({m['name']}): {_interval_text(a['clipped_share'], '.1%')} against "
                               f"{_interval_text(b['clipped_share'], '.1%')}, clipped {word}; mean pre-clipping norm "
                               f"{_interval_text(a.get('mean_norm'), '.2f')} against "
                               f"{_interval_text(b.get('mean_norm'), '.2f')}")
        if clipped:
            out.append(f"Share of group {n}'s sampled unit-steps whose gradient was clipped, against group {majority}'s: "
                       + "; ".join(clipped) + ".")
        def share(g):  # None when the group had no sampled unit-step (a tiny run)
            return ((g.get("clipping") or {}).get("clipped_share") or {}).get("value")

        saturated = [m for m in dp if all(g.get("clipping") and (share(g) or 0) >= 0.99
                                          for g in m["groups"] if g["group"] in (n, majority))]
        if saturated:
            norms = {g["group"]: g["clipping"] for g in saturated[0]["groups"]}
            out.append(f"At C = {_fmt(norms[n]['max_grad_norm'], '.3g')} every unit-step of both groups was clipped in "
                       f"{', '.join(m['name'] for m in saturated)}: the clipping rate cannot tell the groups apart there. "
                       f"What clipping takes from each group is its pre-clipping norm over C: group {n}'s mean norm is "
                       f"{_interval_text(norms[n].get('mean_norm'), '.2f')} against "
                       f"{_interval_text(norms[majority].get('mean_norm'), '.2f')}; a larger ratio means its updates are "
                       f"shrunk more (Bagdasaryan et al. 2019). A larger C, not the share clipped, is the lever that "
                       f"would show a difference in rate.")
    return out


def _groups(r, images):
    models = [m for m in r["models"] if m.get("groups")]
    if not models:
        return None
    names = sorted({g["group"] for m in models for g in m["groups"]})
    return {"image": images.get("groups"), "models": models, "names": names, "eps_text": _eps_text,
            "interval": _interval_text, "findings": _group_findings(models, r.get("groups_base")),
            "dp_models": [m for m in models if any(g["clipping"] for g in m["groups"])],
            "ext_models": [m for m in models if any(g["extraction"] for g in m["groups"])]}


def _checklist(r, images):
    return {"models": r["models"], "unit_label": UNIT_LABEL}


def _roc(r, images):
    if not images.get("roc"):
        return None
    names = {a for m in r["models"] for a in m["attacks"]}
    return {"image": images["roc"], "lira_and_reference": {"lira_offline", "reference"} <= names,
            "lira_offline": "lira_offline" in names}


def _estimates(r, images):
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    attacks: set[str] = set()
    for m in r["models"]:
        for attack, s in m["canary_attacks"].items():
            for method, b in s["bounds"].items():
                if not b.get("sound"):
                    row = rows.setdefault((m["name"], method), {"model": m["name"], "method": method,
                                                                 "delta": b.get("delta"), "by_attack": {}})
                    row["by_attack"][attack] = {"epsilon": b.get("epsilon"), "mu": (b.get("details") or {}).get("mu")}
                    attacks.add(attack)
    return {"rows": list(rows.values()), "attacks": sorted(attacks)} if rows else None


def _canaries(r, images):
    return {"canaries": r["canaries"], "tables": r["tables"], "fleet": r["fleet"]} if (
        r["canaries"] or r["tables"] or r["fleet"]) else None


def _appendix(r, images):
    import yaml

    return {"config_text": yaml.safe_dump(r["config"], sort_keys=False) if r["config"] else None,
            "manifest": r["manifest"], "audit_inputs": r["audit_inputs"]}


SECTIONS: tuple[Section, ...] = (
    Section("ladder", _ladder),
    Section("summary", _summary),
    Section("warnings", _warnings),
    Section("verdicts", _verdicts),
    Section("step_audit", _step_audit),
    Section("multi_run", _multi_run),
    Section("utility", _utility),
    Section("membership", _membership),
    Section("extraction", _extraction),
    Section("units", _units),
    Section("groups", _groups),
    Section("checklist", _checklist),
    Section("roc", _roc),
    Section("estimates", _estimates),
    Section("canaries", _canaries),
    Section("appendix", _appendix),
)


def render(report: Mapping[str, Any], images: Mapping[str, str], *,
           sections: tuple[Section, ...] = SECTIONS) -> str:
    """The HTML page of ``sections``, in order; ``images[stem]`` is a base64 PNG."""
    import jinja2

    inline = {s.template_name: s.template for s in sections if s.template is not None}
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(Path(__file__).with_name("templates"))),
                                    jinja2.DictLoader(inline)]),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = _fmt
    shown = []
    for s in sections:
        ctx = s.context(report, images)
        if ctx is not None:
            shown.append({"template": s.template_name, "name": s.name, "c": ctx})
    return env.get_template("base.html").render(r=report, sections=shown)
