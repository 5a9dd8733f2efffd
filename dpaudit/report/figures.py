"""Report figures, one function per figure, each taking the report dict (pure data).

Figures are built with :class:`matplotlib.figure.Figure` directly: no pyplot, no global
backend switch, PNGs rendered by the Agg canvas (the report stage saves them as PNG, embedded
in the HTML, and PDF, for print).

Epsilon axes are logarithmic; a non-private model (accountant epsilon infinite) is drawn at
the right edge under a tick "no DP". A function returns None when it has nothing to draw.
Scores follow the toolkit's convention: higher means "member".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from dpaudit.report.data import withheld_tprs
from dpaudit.report.schema import RUNG_LABEL, SHOWN_FPRS

__all__ = ["FIGURES", "compliance", "utility", "membership", "extraction", "secrets", "patient_secrets", "groups", "roc"]

GUIDE_FPRS = (0.1, 0.01, 0.001)
UNIT_MARKERS = {"example": "o", "user": "s"}
USER_NUDGE = 1.3
# the rungs of the threat-model ladder: (marker, colour); a model's rungs are spread by this factor around its x
RUNG_STYLE = {"released": ("o", "tab:blue"), "input_space": ("^", "tab:green"), "white_box": ("D", "tab:purple")}
RUNG_SPREAD = 1.07


def _label(text: Any) -> str:
    """A data-derived string safe for matplotlib text (no accidental mathtext)."""
    return str(text).replace("$", r"\$")


# --------------------------------------------------------------------------- epsilon axis


class _EpsAxis:
    """x positions for models on a log epsilon axis; non-private models at the right edge."""

    def __init__(self, models: Sequence[Mapping[str, Any]]):
        finite = [m["dp"]["epsilon"] for m in models if m["privacy"] == "dp" and m["dp"]["epsilon"]]
        self.lo = min(finite) / 2 if finite else 0.5
        self.hi_finite = max(finite) if finite else 1.0
        self.nodp = self.hi_finite * 4
        self.has_nodp = any(m["privacy"] == "non_private" for m in models)

    def x(self, m: Mapping[str, Any]) -> float | None:
        if m["privacy"] == "non_private":
            return self.nodp
        if m["privacy"] == "dp" and m["dp"]["epsilon"]:
            # patient-level models nudged right so that they do not hide a note-level one at the same epsilon
            return float(m["dp"]["epsilon"]) * (USER_NUDGE if m["dp"].get("unit") == "user" else 1.0)
        return None

    def apply(self, ax) -> None:
        ax.set_xscale("log")
        right = self.nodp * 1.6 if self.has_nodp else self.hi_finite * 2
        ax.set_xlim(self.lo, right)
        if self.has_nodp:
            ax.axvspan(self.hi_finite * 2, right, color="0.94", zorder=0)
            ticks = [t for t in (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256)
                     if self.lo <= t <= self.hi_finite * 2]
            ax.set_xticks(ticks + [self.nodp], [format(t, "g") for t in ticks] + ["no DP"])
            ax.minorticks_off()
        ax.set_xlabel("accountant ε (recomputed from the DpEvent)")


def _points(models, axis: _EpsAxis):
    return [(m, axis.x(m)) for m in models if axis.x(m) is not None and not m.get("error")]


def _marker(m) -> str:
    return UNIT_MARKERS.get(m["dp"].get("unit") or "", "D")


# --------------------------------------------------------------------------- figures


def _ladder_points(m: Mapping[str, Any]) -> list[tuple[str, float, float | None, float | None, Sequence | None]]:
    """(rung, bound, ideal, confidence, the ideal's range over its draws) of each rung drawn
    for a model: the rungs that ran (a refused one is left out); without a ladder, its canary
    audit as the released rung, with no ideal."""
    if m["rungs"]:
        return [(g["rung"], g["epsilon"], g["ideal"], g["confidence"], g.get("ideal_range")) for g in m["rungs"]
                if g["epsilon"] is not None]
    a = m["audit"]
    if a["epsilon_lower_bound"] is None:
        return []
    return [("released", a["epsilon_lower_bound"], None, a["confidence"], None)]


def _percent_range(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}–{hi:.0%}"


def _claim_line(lo: float, hi: float, columns: Sequence[tuple[float, float, float]]) -> tuple[list, list]:
    """The line y = x from ``lo`` to ``hi``, flat at each column's claim across it (x0, x1,
    claim): a column drawn off its epsilon (its rungs spread, a patient-level model nudged)
    is read against the claim it is held to, which y = x alone would misplace."""
    xs, ys, edge = [lo], [lo], lo
    for x0, x1, claim in sorted(columns):
        if len(xs) > 1 and ys[-2] == claim and x0 < edge * 1.2:  # next to a column of the same claim: one step
            edge = max(x1, edge)
            xs[-2:], ys[-1] = [edge, edge], edge
            continue
        x0 = max(x0, edge)
        if x1 <= x0:
            continue
        xs += [x0, x0, x1, x1]
        ys += [x0, claim, claim, x1]
        edge = x1
    return xs + [max(hi, edge)], ys + [max(hi, edge)]


def compliance(report: Mapping[str, Any]) -> Figure | None:
    """The threat-model ladder: for each model, at its accountant epsilon, one marker per rung
    at the rung's sound lower bound and a tick of the same colour at its ideal."""
    from dpaudit.audit.ladder import RUNGS

    models = [m for m in report["models"] if m["privacy"] in ("dp", "non_private")]
    if not any(m["privacy"] == "dp" for m in models):
        return None
    axis = _EpsAxis(models)
    drawn = [(m, x, _ladder_points(m)) for m, x in _points(models, axis)]
    drawn = [(m, x, pts) for m, x, pts in drawn if pts]
    positive = [v for _, _, pts in drawn for _, b, c, _, span in pts for v in (b, c, *(span or ())) if v]
    floor = min([axis.lo / 4] + [v / 3 for v in positive])
    top = max([axis.hi_finite * 2.5] + [v * 4 for v in positive])
    fig = Figure(figsize=(8.0, 6.4), layout="constrained")
    ax = fig.add_subplot()
    # the rungs of one model side by side around its epsilon, weakest left
    xrs = {m["name"]: [x * RUNG_SPREAD ** (list(RUNGS).index(rung) - 1) if m["rungs"] else x for rung, *_ in pts]
           for m, x, pts in drawn}
    columns = [(min(xrs[m["name"]]) / 1.06, max(xrs[m["name"]]) * 1.06, m["verdict"]["claimed_epsilon"])
               for m, _, _ in drawn if m["privacy"] == "dp" and m["verdict"]["claimed_epsilon"]]
    xs, ys = _claim_line(axis.lo, axis.hi_finite * 2, columns)
    ax.fill_between(xs, ys, top, color="#fbe3e3", zorder=0, label="claim violated (bound > the claim)")
    ax.plot(xs, ys, color="#b00020", lw=1.2,
            label="the claim: y = x, and across a model's rungs the claim it is held to")
    heuristic = [(x, m["dp"]["last_iterate_epsilon"]) for m, x, _ in drawn
                 if m["dp"].get("last_iterate_epsilon") and not m["rungs"]]
    for i, (x, h) in enumerate(heuristic):
        ax.plot([x / 1.25, x * 1.25], [h, h], color="tab:orange", lw=2.2, zorder=3,
                label="last-iterate heuristic (Steinke et al. 2025), models without a ladder" if i == 0 else None)
    confidence: dict[str, list[float]] = {}
    for m, x, pts in drawn:
        private = m["privacy"] == "dp"
        for (rung, b, c, conf, span), xr in zip(pts, xrs[m["name"]]):
            marker, color = RUNG_STYLE[rung]
            color = color if private else "0.45"
            y = max(b, floor)
            if span is not None:  # where one run of a perfect attack lands: the ideal's draws
                ax.plot([xr, xr], [max(span[0], floor), max(span[1], floor)], color=color, lw=6, alpha=0.22,
                        zorder=2, solid_capstyle="butt")
            if c is not None:
                ax.plot([xr, xr], [y, max(c, floor)], color=color, lw=1.0, alpha=0.35, zorder=2)
                ax.plot([xr / 1.035, xr * 1.035], [max(c, floor)] * 2, color=color, lw=2.4, zorder=3,
                        solid_capstyle="butt")
            ax.plot(xr, y, marker=marker, ms=8, color=color, markeredgecolor="black", ls="none", zorder=4,
                    fillstyle="full" if b > 0 else "none")
            if private and conf is not None:
                confidence.setdefault(rung, []).append(conf)
    ax.set_yscale("log")
    ax.set_ylim(floor / 1.5, top)
    axis.apply(ax)
    # the models named above their column (patient-level ones are nudged right of note-level ones)
    names = sorted(((x, _label(m["name"]) + (" (patient-level)" if m["dp"].get("unit") == "user" else ""))
                    for m, x, _ in drawn), key=lambda t: t[0])
    top_axis = ax.secondary_xaxis("top")
    top_axis.set_xticks([x for x, _ in names], [n for _, n in names], rotation=35, ha="left", fontsize=7.5,
                        rotation_mode="anchor")
    top_axis.minorticks_off()
    ax.set_ylabel("sound empirical ε lower bound")
    ax.set_title("Threat-model ladder: empirical lower bound vs. accountant ε", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    for rung, (marker, color) in RUNG_STYLE.items():
        if rung in confidence:
            handles.append(ax.plot([], [], marker=marker, ls="none", color=color, markeredgecolor="black")[0])
            labels.append(f"{RUNG_LABEL[rung]}: {RUNGS[rung]} ({_percent_range(confidence[rung])})")
    handles.append(ax.plot([], [], color="0.3", lw=2.4, marker="|", ms=0)[0])
    labels.append("ideal (tick): the median bound of a perfect attack on that rung, had the run kept its claim")
    if any(span for _, _, pts in drawn for *_, span in pts):
        handles.append(ax.plot([], [], color="0.3", lw=6, alpha=0.22, solid_capstyle="butt")[0])
        labels.append("its range (pale bar): that bound over the ideal's draws, where one run of a perfect attack lands")
    if any(m["privacy"] == "non_private" for m, _, _ in drawn):
        handles.append(ax.plot([], [], marker="o", ls="none", color="0.45", markeredgecolor="black")[0])
        labels.append("no DP: its canaries' best bound, for scale")
    fig.legend(handles, labels, loc="outside lower center", ncols=1, fontsize=7.5)  # clear of the points, within the width
    ax.grid(True, which="major", color="0.92")
    return fig


def utility(report: Mapping[str, Any]) -> Figure | None:
    """Held-out perplexity against the accountant's epsilon."""
    models = report["models"]
    axis = _EpsAxis(models)
    pts = [(m, x) for m, x in _points(models, axis) if m["utility"]["heldout_perplexity"] is not None]
    if not pts:
        return None
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for m, x in pts:
        y = m["utility"]["heldout_perplexity"]
        ax.plot(x, y, marker=_marker(m), ms=8, ls="none", color="tab:green", markeredgecolor="black")
        ax.annotate(_label(m["name"]), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7.5)
    init = [m["utility"]["initial_heldout_perplexity"] for m, _ in pts if m["utility"]["initial_heldout_perplexity"]]
    if init:
        ax.axhline(np.median(init), color="0.4", ls=":", lw=1.2, label="base model (before fine-tuning, step 0)")
        ax.legend(fontsize=8)
    axis.apply(ax)
    ys = [m["utility"]["heldout_perplexity"] for m, _ in pts] + init
    if max(ys) > 10 * min(ys):  # a base model far off the private data: the fine-tunes would lie flat at 0
        ax.set_yscale("log")
    ax.set_ylabel("held-out perplexity (lower is better)")
    ax.set_title("Utility vs. ε")
    ax.grid(True, color="0.92")
    return fig


def membership(report: Mapping[str, Any]) -> Figure | None:
    """AUC, TPR at 1% and at 0.1% FPR against epsilon; members (top) and canaries (bottom).
    A TPR withheld for every attack of a split (too few non-members) has no panel."""
    models = report["models"]
    axis = _EpsAxis(models)
    pts = _points(models, axis)
    drawn = [m for m, _ in pts]
    rows = [(key, split, [("AUC", None)] + [(f"TPR at {float(f) * 100:g}% FPR", f) for f in SHOWN_FPRS
                                             if f not in withheld_tprs(drawn, key)])
            for key, split in (("attacks", "members vs. held-out"), ("canary_attacks", "canaries"))
            if any(m[key] for m in drawn)]
    if not rows:
        return None
    names = sorted({a for m in drawn for key in ("attacks", "canary_attacks") for a in m[key]})
    import matplotlib as mpl

    cmap = mpl.colormaps["tab10"]
    colors = {n: cmap(i % 10) for i, n in enumerate(names)}
    ncols = max(len(cols) for _, _, cols in rows)
    fig = Figure(figsize=(4.0 * ncols, 3.2 * len(rows)), layout="constrained")
    grid = fig.add_gridspec(len(rows), ncols)
    for row, (key, split, cols) in enumerate(rows):
        for col, (what, fpr) in enumerate(cols):
            ax = fig.add_subplot(grid[row, col])
            for n in names:
                for unit, ls, mk in (("user", "--", "s"), (None, "-", "o")):
                    series = []
                    for m, x in sorted(pts, key=lambda t: t[1]):
                        if (m["dp"].get("unit") == "user") != (unit == "user"):
                            continue
                        s = m[key].get(n)
                        v = None if s is None else (s["auc"] if fpr is None else s["tpr_at_fpr"].get(fpr))
                        if v is not None:
                            series.append((x, v))
                    if series:
                        ax.plot(*zip(*series), marker=mk, ms=4, lw=1.2, ls=ls, color=colors[n],
                                label=_label(n) if unit is None else None)
            if fpr is None:
                ax.axhline(0.5, color="0.6", ls="--", lw=0.8)
            axis.apply(ax)
            ax.set_title(f"{what}: {split}", fontsize=9)
            ax.grid(True, color="0.92")
            if col == 0 and row == 0:
                ax.legend(fontsize=7)
    return fig


def extraction(report: Mapping[str, Any]) -> Figure | None:
    """Share of canaries whose secret greedy decoding recovers, included vs. excluded."""
    models = report["models"]
    axis = _EpsAxis(models)
    pts = [(m, x) for m, x in _points(models, axis) if m["extraction"]]
    if not pts:
        return None
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for side, color, mk, ms in (("excluded", "tab:gray", "o", 5), ("included", "tab:red", "D", 9)):
        for user in (False, True):
            series = [(x, m["extraction"][f"{side}_rate"]) for m, x in sorted(pts, key=lambda t: t[1])
                      if m["extraction"][f"{side}_rate"] is not None and (m["dp"].get("unit") == "user") == user]
            if series:
                ax.plot(*zip(*series), marker="s" if user else mk, ms=ms, lw=1.4, color=color,
                        ls="--" if user else "-", fillstyle="none" if side == "included" else "full",
                        label=None if user else f"{side} canaries ({'trained on' if side == 'included' else 'never seen'})")
    axis.apply(ax)
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("fraction of secrets extracted")
    ax.set_title("Extraction (greedy decoding from the canary prefix) vs. ε")
    ax.grid(True, color="0.92")
    ax.legend(fontsize=8)
    return fig


def secrets(report: Mapping[str, Any]) -> Figure | None:
    """Secret canaries: exposure against the number of inserted copies (0 = never inserted),
    one line per model, and the mean exposure of the inserted ones against ε."""
    models = [m for m in report["models"] if ((m["extraction"] or {}).get("secrets") or {}).get("groups")]
    if not models:
        return None
    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    bits = max((m["extraction"]["secrets"]["space_bits"] or 0) for m in models)
    for m in models:
        groups = [g for g in m["extraction"]["secrets"]["groups"] if g["mean_exposure"] is not None]
        left.plot([g["repetitions"] for g in groups], [g["mean_exposure"] for g in groups], marker=_marker(m),
                  ls="--" if m["dp"].get("unit") == "user" else "-", label=_label(m["name"]))
    left.set_xscale("symlog", linthresh=1)
    left.set_xticks(sorted({g["repetitions"] for m in models for g in m["extraction"]["secrets"]["groups"]}))
    left.get_xaxis().set_major_formatter("{x:g}")
    left.set_xlabel("copies inserted (0: never inserted)")
    left.set_ylabel("mean exposure (bits)")
    left.set_title("Secret canaries: exposure vs. repetitions", fontsize=9)
    axis = _EpsAxis(models)
    series: dict[int, list] = {}
    for m, x in _points(models, axis):
        if m["dp"].get("unit") == "user":  # one line per repetition count, over the note-level sweep
            continue
        for g in m["extraction"]["secrets"]["groups"]:
            if g["mean_exposure"] is not None:
                series.setdefault(g["repetitions"], []).append((x, g["mean_exposure"]))
    for r, pts in sorted(series.items()):
        right.plot(*zip(*sorted(pts)), marker="o", color="0.6" if r == 0 else None, ls=":" if r == 0 else "-",
                   label="controls (never inserted)" if r == 0 else f"{r} cop{'y' if r == 1 else 'ies'}")
    axis.apply(right)
    right.set_ylabel("mean exposure (bits)")
    right.set_title("Secret canaries: exposure vs. ε (note-level models)", fontsize=9)
    for ax in (left, right):
        if bits:
            ax.axhline(bits, color="0.6", ls=":", lw=0.8)
            ax.set_ylim(-0.5, bits + 1)
        ax.grid(True, color="0.92")
        ax.legend(fontsize=7)
    return fig


def patient_secrets(report: Mapping[str, Any]) -> Figure | None:
    """Patient-secret extraction by number of notes per patient, one line per model."""
    models = [m for m in report["models"] if (m["extraction"] or {}).get("patient_secrets")]
    if not models:
        return None
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for m in models:
        groups = [g for g in m["extraction"]["patient_secrets"]["groups"]
                  if g["notes"] is not None and g["member_extracted"] is not None]
        if groups:
            unit = m["dp"].get("unit")
            ls = "--" if unit == "user" else "-"
            ax.plot([g["notes"] for g in groups], [g["member_extracted"] for g in groups], marker=_marker(m),
                    ls=ls, label=_label(f"{m['name']} ({unit or 'unknown unit'})"))
    ax.set_xlabel("notes per patient")
    ax.set_ylabel("member patients' secret extracted (fraction)")
    ax.set_title("Patient secrets: note-level vs. patient-level DP")
    ax.grid(True, color="0.92")
    ax.legend(fontsize=7.5)
    return fig


def roc(report: Mapping[str, Any], arrays: Mapping[str, Mapping[str, Mapping[str, tuple]]]) -> Figure | None:
    """Log-log ROC curves (members vs. held-out), one small panel per model."""
    from dpaudit.audit import roc_curve

    models = [m for m in report["models"] if any("members" in s for s in arrays.get(m["name"], {}).values())]
    if not models:
        return None
    names = sorted({a for m in models for a, s in arrays[m["name"]].items() if "members" in s})
    import matplotlib as mpl

    cmap = mpl.colormaps["tab10"]
    colors = {n: cmap(i % 10) for i, n in enumerate(names)}
    ncols = min(3, len(models))
    nrows = -(-len(models) // ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.8 * nrows), layout="constrained")
    for i, m in enumerate(models):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        floor = 1e-3
        for n in names:
            pair = arrays[m["name"]].get(n, {}).get("members")
            if pair is None:
                continue
            ins, outs = pair
            floor = min(floor, 0.5 / max(1, len(outs)), 0.5 / max(1, len(ins)))
            curve = roc_curve(in_scores=ins, out_scores=outs)
            auc = (m["attacks"].get(n) or {}).get("auc")
            dashed = n == "lira_offline"
            ax.plot(np.clip(curve.fpr, floor, 1), np.clip(curve.tpr, floor, 1), drawstyle="steps-post",
                    color=colors[n], lw=2.4 if n == "reference" else 1.3, ls="--" if dashed else "-",
                    label=_label(n) + (f" ({auc:.2f})" if auc is not None else ""))
        grid = np.geomspace(floor, 1, 50)
        ax.plot(grid, grid, ls=":", color="0.5", lw=1.0)
        for a in GUIDE_FPRS:
            if a >= floor:
                ax.axvline(a, color="0.88", lw=0.8, zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(floor, 1)
        ax.set_ylim(floor, 1.05)
        ax.set_title(_label(m["name"]), fontsize=10)
        ax.set_xlabel("FPR", fontsize=8)
        ax.set_ylabel("TPR", fontsize=8)
        ax.legend(fontsize=6.5, loc="lower right", title="attack (AUC)", title_fontsize=6.5)
    return fig


def groups(report: Mapping[str, Any]) -> Figure | None:
    """Who pays for the privacy (Bagdasaryan et al. 2019, arXiv 1905.12101), against epsilon:
    each minority group's held-out perplexity over the majority's (one point per model, its
    bootstrap interval over units), the membership AUC of each group, and each group's share
    of clipped unit-steps (DP models). Panels without data are left out."""
    models = [m for m in report["models"] if m.get("groups")]
    if not models:
        return None
    axis = _EpsAxis(models)
    pts = _points(models, axis)
    names = sorted({g["group"] for m, _ in pts for g in m["groups"]})
    majority = next((g["group"] for m, _ in pts for g in m["groups"] if g.get("majority")), None)
    import matplotlib as mpl

    cmap = mpl.colormaps["tab10"]
    colors = {n: cmap(i % 10) for i, n in enumerate(names)}

    def series(get):
        out = {}
        for n in names:
            for m, x in sorted(pts, key=lambda t: t[1]):
                g = next((g for g in m["groups"] if g["group"] == n), None)
                e = get(g) if g is not None else None
                if isinstance(e, Mapping) and e.get("value") is not None:
                    out.setdefault(n, []).append((x, e["value"], e.get("low"), e.get("high"), _marker(m)))
        return out

    panels = [("held-out perplexity ratio to the majority" + (f" ({_label(majority)})" if majority else ""),
               series(lambda g: g["perplexity_ratio"]), 1.0),
              ("membership AUC (members vs. held-out)",
               series(lambda g: (g["membership"] or {}).get("auc")), 0.5),
              ("share of clipped unit-steps (DP-SGD)",
               series(lambda g: (g["clipping"] or {}).get("clipped_share")), None)]
    panels = [p for p in panels if p[1]]
    if not panels:
        return None
    fig = Figure(figsize=(4.2 * len(panels), 3.4), layout="constrained")
    for i, (title, data, guide) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for n, rows in data.items():
            xs = [r[0] for r in rows]
            ys = [r[1] for r in rows]
            ax.plot(xs, ys, lw=1.0, color=colors[n], label=_label(n))
            for x, y, lo, hi, mk in rows:
                if lo is not None and hi is not None:
                    ax.errorbar(x, y, yerr=[[max(y - lo, 0)], [max(hi - y, 0)]], color=colors[n], capsize=3, lw=1)
                ax.plot(x, y, marker=mk, ms=6, ls="none", color=colors[n], markeredgecolor="black")
        if guide is not None:
            ax.axhline(guide, color="0.6", ls="--", lw=0.8)
        if i == 0:  # the base model's gap, where every fine-tune starts
            for g in report.get("groups_base") or []:
                r = g.get("perplexity_ratio") or {}
                if r.get("value") is not None and g["group"] in colors:
                    ax.axhline(r["value"], color=colors[g["group"]], ls=":", lw=1.2,
                               label=f"base model ({_label(g['group'])})")
        axis.apply(ax)
        ax.set_title(title, fontsize=9)
        ax.grid(True, color="0.92")
        ax.legend(fontsize=7, title="group", title_fontsize=7)
    return fig


# stem -> drawing function of the report dict; roc also takes the score arrays
FIGURES = {
    "compliance": compliance,
    "utility": utility,
    "membership": membership,
    "extraction": extraction,
    "secrets": secrets,
    "patient_secrets": patient_secrets,
    "groups": groups,
}
