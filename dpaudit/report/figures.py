"""Report figures: ROC curves on log-log axes, empirical epsilon bounds, training curves.

Figures are built with :class:`matplotlib.figure.Figure` directly: no pyplot, no global
backend switch (a notebook's interactive backend is left alone), and PNGs are rendered by
the Agg canvas whatever the session's backend, so they can be drawn from any thread or process. Each figure is
saved twice, as PNG (embedded in the HTML) and PDF (for print), each under a temporary name
first and then renamed into place.

Scores follow the toolkit's convention: higher means "member"; labels are True for members.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

__all__ = [
    "attack_colors",
    "roc_curve",
    "plot_roc",
    "plot_epsilon",
    "plot_training",
    "save_figure",
]

# The three FPRs that the report tabulates; drawn as faint guides on ROC plots.
GUIDE_FPRS = (0.1, 0.01, 0.001)
METHOD_MARKERS = {"clopper_pearson": "o", "one_run": "s", "one_run_fdp": "D", "gdp": "^"}
_EXTRA_MARKERS = ("v", "P", "X", "*", "<", ">")


def _label(text: Any) -> str:
    """A data-derived string safe for matplotlib text (no accidental mathtext)."""
    return str(text).replace("$", r"\$")


def attack_colors(names: Iterable[str]) -> dict[str, Any]:
    """One colour per attack, fixed by sorted name, so every figure agrees."""
    import matplotlib as mpl

    ordered = sorted(set(names))
    cmap = mpl.colormaps["tab10" if len(ordered) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(ordered)}


def roc_curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) at every distinct threshold, from (0, 0) to (1, 1); higher score = member.

    Ties are handled by placing the threshold only between distinct score values.
    """
    scores = np.asarray(scores, dtype=float).ravel()
    labels = np.asarray(labels, dtype=bool).ravel()
    if scores.shape != labels.shape:
        raise ValueError(f"scores and labels differ in length: {scores.size} vs {labels.size}")
    keep = np.isfinite(scores)
    scores, labels = scores[keep], labels[keep]
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        raise ValueError("an ROC curve needs both members and non-members")
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    last_of_run = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]
    tp = np.cumsum(y)[last_of_run]
    fp = np.cumsum(~y)[last_of_run]
    tpr = np.r_[0.0, tp / pos]
    fpr = np.r_[0.0, fp / neg]
    return fpr, tpr


def save_figure(fig: Figure, directory: str | Path, stem: str, *, dpi: int = 150) -> dict[str, str]:
    """Write ``stem.png`` and ``stem.pdf`` atomically into ``directory``; return both paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for fmt in ("png", "pdf"):
        final = directory / f"{stem}.{fmt}"
        tmp = directory / f".{stem}.{fmt}.{os.getpid()}.tmp"
        # No timestamps in the files: rebuilding a report from the same inputs gives the same bytes.
        metadata = {"CreationDate": None} if fmt == "pdf" else {"Software": None}
        try:
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        paths[fmt] = str(final)
    return paths


def plot_roc(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, int, float | None]],
    *,
    colors: Mapping[str, Any],
    title: str,
) -> Figure:
    """ROC curves on log-log axes with the chance diagonal.

    ``curves`` maps an attack name to ``(scores, labels, num_out, auc)``; ``auc`` (from the
    results file) goes in the legend, else it is computed from the curve.
    Points at FPR or TPR 0 are drawn at the axis floor, half of 1 / (number of non-members).
    """
    fig = Figure(figsize=(6.0, 5.0), layout="constrained")
    ax = fig.add_subplot()
    floors = []
    for name in sorted(curves):
        scores, labels, _, _ = curves[name]
        labels = np.asarray(labels, dtype=bool)
        floors.append(0.5 / max(1, int((~labels).sum())))
        floors.append(0.5 / max(1, int(labels.sum())))
    floor = min(floors) if floors else 1e-3
    floor = min(floor, 1e-3)
    for name in sorted(curves):
        scores, labels, _, auc = curves[name]
        fpr, tpr = roc_curve(scores, labels)
        if auc is None:
            auc = float(_trapezoid(tpr, fpr))
        ax.plot(
            np.clip(fpr, floor, 1.0),
            np.clip(tpr, floor, 1.0),
            color=colors.get(name),
            lw=1.8,
            drawstyle="steps-post",
            label=f"{_label(name)} (AUC {auc:.3f})",
        )
    grid = np.geomspace(floor, 1.0, 50)
    ax.plot(grid, grid, ls="--", color="0.5", lw=1.0, label="chance")
    for a in GUIDE_FPRS:
        if a >= floor:
            ax.axvline(a, color="0.85", lw=0.8, zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1.0)
    ax.set_ylim(floor, 1.05)
    ax.set_xlabel("false positive rate (non-members flagged)")
    ax.set_ylabel("true positive rate (members flagged)")
    ax.set_title(_label(title))
    ax.grid(True, which="major", color="0.92")
    ax.legend(loc="lower right", fontsize=8, frameon=True)
    return fig


def plot_epsilon(
    bounds: Sequence[Mapping[str, Any]],
    *,
    colors: Mapping[str, Any],
    accountant_epsilon: float | None,
    delta: float | None,
) -> Figure:
    """Empirical epsilon lower bounds, one point per (attack, method), attacks on the x axis.

    Colour = attack (as in the ROC plots), marker = method. The accountant's epsilon is a
    horizontal dashed line when finite: a point above it is a violation.
    """
    attacks = sorted({str(b["attack"]) for b in bounds})
    methods = sorted({str(b["method"]) for b in bounds})
    markers = dict(METHOD_MARKERS)
    extra = iter(_EXTRA_MARKERS * (1 + len(methods)))
    for m in methods:
        markers.setdefault(m, next(extra))
    width = 0.6
    offsets = {m: (i - (len(methods) - 1) / 2) * (width / max(1, len(methods))) for i, m in enumerate(methods)}

    fig = Figure(figsize=(max(5.0, 1.3 * len(attacks) + 3.0), 4.5), layout="constrained")
    ax = fig.add_subplot()
    top = 0.0
    for b in bounds:
        x = attacks.index(str(b["attack"])) + offsets[str(b["method"])]
        y = float(b["epsilon"])
        top = max(top, y)
        ax.plot([x, x], [0, y], color=colors.get(str(b["attack"])), lw=1.0, alpha=0.5)
        ax.plot(x, y, ls="none", marker=markers[str(b["method"])], ms=8,
                color=colors.get(str(b["attack"])), markeredgecolor="black", markeredgewidth=0.6)
        ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    handles = [
        ax.plot([], [], ls="none", marker=markers[m], color="0.6", markeredgecolor="black", label=_label(m))[0]
        for m in methods
    ]
    if accountant_epsilon is not None and np.isfinite(accountant_epsilon):
        label = f"accountant ε = {accountant_epsilon:.3g}"
        if delta is not None:
            label += f" (δ = {delta:.2g})"
        handles.append(ax.axhline(accountant_epsilon, color="black", ls="--", lw=1.2, label=label))
        top = max(top, accountant_epsilon)
    ax.set_xticks(range(len(attacks)), [_label(a) for a in attacks], rotation=20 if len(attacks) > 4 else 0)
    for tick, name in zip(ax.get_xticklabels(), attacks):
        tick.set_color(colors.get(name, "black"))
    ax.set_xlim(-0.6, len(attacks) - 0.4)
    ax.set_ylim(0, max(top * 1.2, 0.1))
    ax.set_ylabel("empirical ε lower bound")
    ax.set_title("Empirical ε lower bounds vs. the accountant")
    ax.grid(True, axis="y", color="0.92")
    ax.legend(handles=handles, loc="best", fontsize=8, title="method", title_fontsize=8)
    return fig


def plot_training(records: Sequence[Mapping[str, Any]]) -> Figure:
    """Training loss and held-out loss against step; held-out perplexity in a second panel."""

    def series(key: str) -> tuple[np.ndarray, np.ndarray]:
        pts = [(r["step"], r[key]) for r in records if _is_num(r.get("step")) and _is_num(r.get(key))]
        if not pts:
            return np.empty(0), np.empty(0)
        arr = np.asarray(pts, dtype=float)
        return arr[:, 0], arr[:, 1]

    train = series("train_loss")
    held = series("heldout_loss")
    ppl = series("heldout_perplexity")
    panels = 2 if ppl[0].size else 1
    fig = Figure(figsize=(6.0 * panels, 4.0), layout="constrained")
    ax = fig.add_subplot(1, panels, 1)
    if train[0].size:
        ax.plot(*train, color="tab:blue", lw=1.2, alpha=0.85, label="train loss")
    if held[0].size:
        ax.plot(*held, color="tab:orange", lw=1.8, marker="o", ms=3, label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title("Training")
    ax.grid(True, color="0.92")
    if train[0].size or held[0].size:
        ax.legend(fontsize=8)
    if panels == 2:
        ax2 = fig.add_subplot(1, 2, 2)
        ax2.plot(*ppl, color="tab:orange", lw=1.8, marker="o", ms=3)
        if ppl[1].size and np.all(ppl[1] > 0) and ppl[1].max() / ppl[1].min() > 10:
            ax2.set_yscale("log")
        ax2.set_xlabel("step")
        ax2.set_ylabel("held-out perplexity")
        ax2.set_title("Utility")
        ax2.grid(True, color="0.92")
    return fig


_trapezoid = getattr(np, "trapezoid", None) or getattr(np, "trapz")


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)
