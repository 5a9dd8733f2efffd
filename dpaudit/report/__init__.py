"""The report stage: ``report.json`` (schema version 2), figures (PNG + PDF), per-row
tables (CSV) and a self-contained ``report.html``, built from a run directory's artifacts.

``build_report(run_dir)`` is the entry point; ``dpaudit report RUN_DIR`` rebuilds a report
from saved scores without rerunning anything. The parts: :mod:`~dpaudit.report.data` (the
report as data), :mod:`~dpaudit.report.figures` (one function per figure),
:mod:`~dpaudit.report.html` (one template per section).
"""

from dpaudit.report.build import SCHEMA_VERSION, build_report

__all__ = ["SCHEMA_VERSION", "build_report"]
