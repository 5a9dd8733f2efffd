"""dpaudit: audit memorization and membership leakage in language models.

Three jobs share one pipeline: auditing a released model, validating that a DP-SGD
implementation earns its claimed epsilon, and producing compliance plots.
"""

from dpaudit.version import __version__

__all__ = ["Audit", "__version__", "run"]


def __getattr__(name: str):
    """``dpaudit.run`` is :func:`dpaudit.stages.run` and ``dpaudit.Audit`` is
    :class:`dpaudit.wrap.Audit`, imported on first use (they pull in torch)."""
    if name == "Audit":
        from dpaudit.wrap import Audit

        return Audit
    if name == "run":
        from dpaudit.stages import run

        return run
    raise AttributeError(f"module 'dpaudit' has no attribute {name!r}")
