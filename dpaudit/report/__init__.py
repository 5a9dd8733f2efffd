"""The report: ``report.json`` (schema version 2), figures (PNG + PDF), per-row tables (CSV)
and a self-contained ``report.html``, built from a snapshot of a run directory's artifacts.

The parts are pure: :mod:`~dpaudit.report.data` (the report as data, from a
:class:`~dpaudit.report.snapshot.RunSnapshot`), :mod:`~dpaudit.report.model` (one model's
entry), :mod:`~dpaudit.report.figures` (one function per figure),
:mod:`~dpaudit.report.html` (one template per section). The report stage
(:mod:`dpaudit.stages.report`) reads the snapshot and writes the files;
``dpaudit.report.build_report(run_dir)`` (``dpaudit report RUN_DIR``) is that stage, the
report's documented entry point, imported on first use.
"""

from dpaudit.report.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "build_report"]


def __getattr__(name: str):
    """``build_report`` is :func:`dpaudit.stages.report.build_report` (the one import of a
    stage from the report, declared in the layer contracts)."""
    if name == "build_report":
        from dpaudit.stages.report import build_report

        return build_report
    raise AttributeError(f"module 'dpaudit.report' has no attribute {name!r}")
