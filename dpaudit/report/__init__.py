"""The report stage: ``report.json`` (schema-versioned), figures (PNG + PDF) and a
self-contained ``report.html`` built from a run directory's saved artifacts.

``build_report(run_dir)`` is the entry point; ``dpaudit report RUN_DIR`` rebuilds a report
from saved scores without rerunning anything.
"""

from dpaudit.report.build import SCHEMA_VERSION, build_report, write_json_atomic

__all__ = ["SCHEMA_VERSION", "build_report", "write_json_atomic"]
