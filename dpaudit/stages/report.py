"""Report stage: ``report.json``, ``figures/``, ``tables/`` and a self-contained ``report.html``.

:func:`build_report` reads a snapshot of the run's artifacts (:func:`read_snapshot`, each
through its codec), assembles the report from it by pure functions
(:func:`dpaudit.report.data.assemble`), draws the figures (:mod:`dpaudit.report.figures`),
renders the page (:func:`dpaudit.report.html.render`), then writes the tables as CSV (never
inlined in the HTML), the figures, ``report.html`` and, last, ``report.json``: the presence of
``report.json`` means the whole report is in place.

Privacy of the report itself: member texts appear only with ``include_texts=True``;
canaries are otherwise shown by id and synthetic secret. The HTML has no scripts and no
external resources: figures are inline base64 PNGs, the CSS is inline.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import os
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError
from dpaudit.report.snapshot import ModelSnapshot, RunSnapshot, Unreadable
from dpaudit.rundir import ModelDir, RunDir, write_text_atomic
from dpaudit.version import __version__
from dpaudit.stages.artifacts import read_dp_record, read_ladder, read_unit_clipping

__all__ = ["build_report", "read_snapshot"]


def _read(reader, *args):
    """``reader(*args)``, or :class:`Unreadable` when the artifact cannot be read."""
    try:
        return reader(*args)
    except InputError as err:
        return Unreadable(str(err))


def _record_nll(md: ModelDir | Path, num_records: int, name: str = "target"):
    """(NLL sum, scored tokens) of the first ``num_records`` texts the attack stage scored with
    the model (its cached signals ``name``: the candidates, then the canaries), or None."""
    from dpaudit.stages.signal_cache import load_signals

    path = (md.root if isinstance(md, ModelDir) else Path(md)) / "signals" / f"{name}.npz"
    if not num_records or not path.is_file():
        return None
    signals = load_signals(path)
    if signals.n < num_records:
        raise InputError(f"{path}: {signals.n} texts scored, the run has {num_records} candidate records")
    return -signals.sum_logprob()[:num_records], signals.token_count()[:num_records].astype(float)


def _records(rundir: RunDir) -> tuple | None:
    """The candidates' unit, role and group, in the attacks' order; None without groups."""
    if not (rundir.data_dir / "candidates.jsonl").is_file():
        return None
    rows = rundir.read_candidates()
    if not rows or any("group" not in r for r in rows):
        return None
    return tuple({"unit_id": r["unit_id"], "role": r["role"], "group": r["group"]} for r in rows)


def _model_snapshot(md: ModelDir, config, records: tuple | None = None) -> ModelSnapshot:
    record = _read(read_dp_record, md)
    weights = None
    if config is not None and not isinstance(record, Unreadable) and record is not None and record.private \
            and record.steps:
        from dpaudit.train.plan import step_weights

        found = step_weights(config.for_model(md.name).train, record.steps)
        weights = None if found is None else tuple(found)
    return ModelSnapshot(
        name=md.name, exists=md.root.is_dir(), error=_read(md.read_error), record=record,
        log=_read(md.read_train_log), checks=_read(md.read_train_checks),
        results=_read(md.read_results) if md.results_dir.is_dir() else {}, extraction=_read(md.read_extraction),
        multi_run=_read(md.read_multi_run), step_weights=weights, ladder=_read(read_ladder, md),
        record_nll=_read(_record_nll, md, len(records)) if records else None,
        unit_clipping=_read(read_unit_clipping, md) if records else None)


def read_snapshot(rundir: RunDir) -> RunSnapshot:
    """Every artifact the report needs, read once (an unreadable one as :class:`Unreadable`)."""
    from dpaudit.stages.fleet import load_fleet

    inputs = rundir.read_audit_inputs()
    config = None
    if rundir.config_path.is_file():
        config = rundir.read_config()
        names, kind = config.model_names(), "run"
    elif inputs is not None:
        names, kind = rundir.model_names(), "audit-model"
    else:
        raise InputError(f"{rundir.root} is not a dpaudit run directory (no config.resolved.yaml "
                         f"and no audit_inputs.json)")
    if not names:
        raise InputError(f"nothing to report in {rundir.root}: no models")
    fleet = _read(load_fleet, rundir.fleet_dir) if rundir.has_fleet() else None
    canaries = _read(rundir.read_canary_file) if (rundir.data_dir / "canaries.json").is_file() else None
    records = _records(rundir) if kind == "run" else None
    return RunSnapshot(
        name=rundir.root.resolve().name, kind=kind, names=tuple(names),
        models=tuple(_model_snapshot(rundir.model(n), config, records) for n in names), records=records,
        base_nll=_read(_record_nll, rundir.root, len(records), "base") if records else None,
        extra=tuple(n for n in rundir.model_names() if n not in names),
        config=config.to_dict() if config is not None else None,
        trainable=config.model.trainable if config is not None else "all",
        canaries=canaries, fleet_keep=fleet if isinstance(fleet, Unreadable) or fleet is None else fleet[0],
        manifest=_read(rundir.read_manifest), audit_inputs=inputs, step_audit=_read(rundir.read_step_audit))


def build_report(run_dir: str | Path | RunDir, *, include_texts: bool = False, title: str | None = None) -> dict:
    """Build the report of a run (or ``audit-model`` output) directory; return the report dict.

    Writes ``figures/*.png|pdf``, ``tables/*.csv``, ``report.html`` and, last,
    ``report.json``. ``include_texts=True`` also prints member texts (canary texts and
    prefixes, free-text fields of ``extraction.json``). Raises
    :class:`dpaudit.errors.InputError` on a directory that is not a run.
    """
    from dpaudit.report import figures as F
    from dpaudit.report.data import assemble
    from dpaudit.report.html import render

    rundir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    rundir.check()
    data = assemble(read_snapshot(rundir), include_texts=include_texts, title=title, version=__version__)
    report = data.report
    report["tables"] = _write_tables(rundir, data.tables)
    drawn = {stem: fn(report) for stem, fn in F.FIGURES.items()}
    drawn["roc"] = F.roc(report, data.roc)
    report["figures"], images = _write_figures(rundir, drawn, (*F.FIGURES, "roc"))
    rundir.write_report(report, html=render(report, images))
    return report


def _rel(rundir: RunDir, path: str | Path) -> str:
    return os.path.relpath(path, rundir.root).replace(os.sep, "/")


def _csv_text(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return buf.getvalue()


def _write_tables(rundir: RunDir, tables: dict) -> dict[str, str]:
    """``tables/STEM.csv`` of every table; tables of an earlier build not in this one go."""
    written = {}
    for stem, (columns, rows) in tables.items():
        path = rundir.tables_dir / f"{stem}.csv"
        write_text_atomic(path, _csv_text(columns, rows))
        written[stem] = _rel(rundir, path)
    for stale in rundir.tables_dir.glob("*.csv") if rundir.tables_dir.is_dir() else []:
        if stale.stem not in written:
            stale.unlink()
    return written


def _write_figures(rundir: RunDir, drawn: dict, every: tuple[str, ...]) -> tuple[dict, dict]:
    """(``{stem: {fmt: path}}``, ``{stem: base64 PNG}``) of the figures drawn; figures of an
    earlier build that this one did not redraw go."""
    figures, images = {}, {}
    for stem, fig in drawn.items():
        if fig is None:
            continue
        paths = save_figure(fig, rundir.figures_dir, stem)
        figures[stem] = {fmt: _rel(rundir, p) for fmt, p in paths.items()}
        images[stem] = base64.b64encode(Path(paths["png"]).read_bytes()).decode("ascii")
    for stem in every:
        if stem not in figures:
            for fmt in ("png", "pdf"):
                (rundir.figures_dir / f"{stem}.{fmt}").unlink(missing_ok=True)
    return figures, images


def save_figure(fig, directory: str | Path, stem: str, *, dpi: int = 130) -> dict[str, str]:
    """Write ``stem.png`` and ``stem.pdf`` atomically into ``directory``, without timestamps;
    return both paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for fmt in ("png", "pdf"):
        final = directory / f"{stem}.{fmt}"
        tmp = directory / f".{stem}.{fmt}.{os.getpid()}.tmp"
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
