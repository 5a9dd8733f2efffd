"""dpaudit: audit memorization and membership leakage in language models.

Three jobs share one pipeline: auditing a released model, validating that a DP-SGD
implementation earns its claimed epsilon, and producing compliance plots.
"""

from dpaudit.version import __version__

__all__ = ["__version__", "run"]


def __getattr__(name: str):
    """``dpaudit.run`` is :func:`dpaudit.stages.run`, imported on first use (it pulls in torch)."""
    if name == "run":
        from dpaudit.stages import run

        return run
    raise AttributeError(f"module 'dpaudit' has no attribute {name!r}")
