"""Run directories: atomic writes, the manifest, and staged creation.

A run directory is complete only when its last artifact is in place: files are written
under a temporary name and renamed, and ``dpaudit train`` builds the whole directory under
a hidden staging name that is renamed to the requested path only at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError

SCHEMA_VERSION = 1
PACKAGES = ("dpaudit", "torch", "transformers", "datasets", "tokenizers", "dp-accounting", "numpy", "scipy", "peft", "opacus")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_npz_atomic(path: str | Path, **arrays: Any) -> None:
    """``np.savez`` (no pickle) through a temporary file in the same directory."""
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: str | Path) -> Any:
    """Parsed JSON, or an InputError for a missing or unreadable file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"missing {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"cannot read {path}: {err}") from None


def check_run_dir(run_dir: str | Path) -> Path:
    """A complete training run directory, or an InputError that says what is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"run directory not found: {run_dir}")
    for name in ("config.resolved.yaml", "manifest.json", "model"):
        if not (run_dir / name).exists():
            raise InputError(f"{run_dir} is not a complete run directory (no {name})")
    return run_dir


@contextlib.contextmanager
def staged_directory(out: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a hidden staging directory beside ``out``; rename it to ``out`` on success,
    delete it on any error, so a half-written run directory never carries the real name."""
    out = Path(out)
    if out.exists() and not force:
        raise InputError(f"{out} already exists (pass --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(stage, out)


def manifest(*, seeds: dict[str, int], command: list[str] | None = None) -> dict[str, Any]:
    """Package versions, seeds, the source's git commit where available, and the hardware."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else sys.argv,
        "python": platform.python_version(),
        "packages": versions,
        "git_commit": _git_commit(),
        "seeds": seeds,
        "hardware": _hardware(),
    }


def _git_commit() -> str | None:
    source = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
