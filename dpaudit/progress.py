"""Progress of long work: a bar on an interactive terminal, and a log line every few
seconds (logger ``dpaudit.progress``) that lands in ``run.log`` and, when stderr is not a
terminal, on stderr: step, loss and time left.

Libraries' own bars (tokenizing, shard writing) are silenced by :func:`quiet_libraries`.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

LOG = logging.getLogger("dpaudit.progress")
LOG.setLevel(logging.INFO)
LOG_EVERY_S = 5.0
_label: contextvars.ContextVar[str] = contextvars.ContextVar("dpaudit_progress_label", default="")
_bars = {"enabled": True}


@contextlib.contextmanager
def label(text: str) -> Iterator[None]:
    """Prefix every progress line inside the block with ``text`` (e.g. the model's name)."""
    token = _label.set(text)
    try:
        yield
    finally:
        _label.reset(token)


def disable_bars() -> None:
    """Log lines only (worker processes, whose bars would interleave)."""
    _bars["enabled"] = False


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """``update(n, **fields)`` advances; ``fields`` (e.g. ``loss=2.31``) show on the bar and in the log line."""

    def __init__(self, *, total: int, desc: str, unit: str = "step", initial: int = 0, enabled: bool = True):
        self.total, self.done, self.unit = total, initial, unit
        self.desc = f"{_label.get()} {desc}".strip()
        self.fields: dict[str, object] = {}
        self.started = self.last_log = time.monotonic()
        self.initial = initial
        show = enabled and _bars["enabled"] and sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=self.desc, unit=unit, file=sys.stderr,
                        disable=not show, leave=False, dynamic_ncols=True)
        self.enabled = enabled

    def update(self, n: int = 1, **fields: object) -> None:
        self.done += n
        self.fields.update(fields)
        self.bar.update(n)
        if fields:
            self.bar.set_postfix({k: f"{v:.3f}" if isinstance(v, float) else v for k, v in fields.items()},
                                 refresh=False)
        now = time.monotonic()
        if self.enabled and (now - self.last_log >= LOG_EVERY_S or self.done >= self.total):
            self.last_log = now
            self._log(now)

    def _log(self, now: float) -> None:
        elapsed = now - self.started
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        extra = "".join(f", {k} {v:.3f}" if isinstance(v, float) else f", {k} {v}" for k, v in self.fields.items())
        eta = _duration(left) if left == left else "?"
        LOG.info("%s: %s %d/%d%s, %s elapsed, %s left", self.desc, self.unit, self.done, self.total, extra,
                 _duration(elapsed), eta)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def log_file(path: str | Path) -> Iterator[None]:
    """Append progress lines and warnings of the block to ``path`` (the run's ``run.log``)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def quiet_libraries() -> None:
    """The libraries' own bars (tokenizing, shard writing) are noise beside dpaudit's progress."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
