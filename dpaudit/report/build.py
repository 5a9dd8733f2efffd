"""Build ``report.json``, ``figures/``, ``tables/`` and a self-contained ``report.html``.

:func:`build_report` assembles the report as data (:mod:`dpaudit.report.data`), draws the
figures (:mod:`dpaudit.report.figures`), writes the per-row tables as CSV (never inlined in
the HTML), renders the page (:mod:`dpaudit.report.html`), then writes ``report.html`` and,
last, ``report.json`` through :meth:`dpaudit.rundir.RunDir.write_report`: the presence of
``report.json`` means the whole report is in place.

Privacy of the report itself: member texts appear only with ``include_texts=True``;
canaries are otherwise shown by id and synthetic secret. The HTML has no scripts and no
external resources: figures are inline base64 PNGs, the CSS is inline.
"""

from __future__ import annotations

import base64
import csv
import io
import os
from pathlib import Path
from typing import Any

from dpaudit.report import figures as F
from dpaudit.report.data import SCHEMA_VERSION, assemble
from dpaudit.report.html import render
from dpaudit.rundir import RunDir, write_text_atomic

__all__ = ["build_report", "SCHEMA_VERSION"]
ALL_FIGURES = (*F.FIGURES, "roc")


def _csv_text(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return buf.getvalue()


def build_report(run_dir: str | Path | RunDir, *, include_texts: bool = False, title: str | None = None) -> dict:
    """Build the report of a run (or ``audit-model`` output) directory; return the report dict.

    Writes ``figures/*.png|pdf``, ``tables/*.csv``, ``report.html`` and, last,
    ``report.json``. ``include_texts=True`` also prints member texts (canary texts and
    prefixes, free-text fields of ``extraction.json``). Raises
    :class:`dpaudit.errors.InputError` on a directory that is not a run.
    """
    rundir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    rundir.check()
    data = assemble(rundir, include_texts=include_texts, title=title)
    report = data.report

    def rel(p: str | Path) -> str:
        return os.path.relpath(p, rundir.root).replace(os.sep, "/")

    tables = {}
    for stem, (columns, rows) in data.tables.items():
        path = rundir.tables_dir / f"{stem}.csv"
        write_text_atomic(path, _csv_text(columns, rows))
        tables[stem] = rel(path)
    for stale in rundir.tables_dir.glob("*.csv") if rundir.tables_dir.is_dir() else []:
        if stale.stem not in tables:
            stale.unlink()
    report["tables"] = tables

    drawn = {stem: fn(report) for stem, fn in F.FIGURES.items()}
    drawn["roc"] = F.roc(report, data.roc)
    figures, images = {}, {}
    for stem, fig in drawn.items():
        if fig is None:
            continue
        paths = F.save_figure(fig, rundir.figures_dir, stem)
        figures[stem] = {fmt: rel(p) for fmt, p in paths.items()}
        images[stem] = base64.b64encode(Path(paths["png"]).read_bytes()).decode("ascii")
    for stem in ALL_FIGURES:  # figures of an earlier build that this one did not redraw
        if stem not in figures:
            for fmt in ("png", "pdf"):
                (rundir.figures_dir / f"{stem}.{fmt}").unlink(missing_ok=True)
    report["figures"] = figures

    html = render(report, images)
    rundir.write_report(report, html=html)
    return report
