"""Typed artifacts of a run directory: each read and written through its domain type's codec.

:mod:`dpaudit.rundir` knows the layout and writes atomically; here the stages turn files into
objects and back: the DP record (:class:`dpaudit.accounting.DpRecord`), a trainer's record
(:class:`dpaudit.train.TrainingRecord`), the data split, the canaries
(:class:`dpaudit.canaries.Canary`), the tokenizer, a model's threat-model ladder
(:class:`dpaudit.audit.ladder.Rung`), and the manifest. Every artifact has one
reader and one writer, and the writer's output read back is the object written (the codec
round trip, tested over every artifact).
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from dpaudit.accounting import DpRecord
from dpaudit.audit.gradient_canaries import GradientCanaryRecord
from dpaudit.audit.groups import UnitClipping
from dpaudit.audit.ladder import Rung
from dpaudit.errors import InputError
from dpaudit.rundir import (
    DP_EVENT,
    GRADIENT_CANARIES,
    SCHEMA_VERSION,
    TRAIN_CHECKS,
    TRAIN_LOG,
    UNIT_CLIPPING,
    ModelDir,
    RunDir,
    read_json,
    write_json_atomic,
    write_jsonl_atomic,
    write_npz_atomic,
)

PACKAGES = ("dpaudit", "torch", "transformers", "datasets", "tokenizers", "dp-accounting", "numpy", "scipy", "peft", "opacus")


# --------------------------------------------------------------------------- the DP record and the trainer's record


def read_dp_record(model_dir: ModelDir | str | Path) -> DpRecord | None:
    """The model's :class:`DpRecord` (``dp_event.json``), or None when its trainer wrote none:
    then nothing is known about its privacy. A malformed file is an :class:`InputError`."""
    path = Path(model_dir.root if isinstance(model_dir, ModelDir) else model_dir) / DP_EVENT
    if not path.is_file():
        return None
    try:
        return DpRecord.from_dict(read_json(path))
    except InputError as err:
        raise InputError(f"{path}: {err}") from None


def write_dp_record(directory: str | Path, record: DpRecord) -> None:
    write_json_atomic(Path(directory) / DP_EVENT, record.to_dict())


def write_training(directory: str | Path, record) -> None:
    """A :class:`~dpaudit.train.TrainingRecord` into a model's directory: ``train_log.jsonl``,
    ``train_checks.json``, ``gradient_canaries.npz``, ``unit_clipping.npz`` and ``dp_event.json``,
    each when the trainer filled it."""
    directory = Path(directory)
    if record.log:
        write_jsonl_atomic(directory / TRAIN_LOG, record.log)
    if record.checks is not None:
        write_json_atomic(directory / TRAIN_CHECKS, record.checks)
    if record.gradient_canaries is not None:
        write_npz_atomic(directory / GRADIENT_CANARIES, **record.gradient_canaries.to_arrays())
    if getattr(record, "unit_clipping", None) is not None:
        write_npz_atomic(directory / UNIT_CLIPPING, **record.unit_clipping.to_arrays())
    if record.dp is not None:
        write_dp_record(directory, record.dp)


# --------------------------------------------------------------------------- the threat-model ladder


def write_ladder(model_dir: ModelDir, rungs: list[Rung]) -> None:
    """A model's rungs (:class:`~dpaudit.audit.ladder.Rung`) into ``models/NAME/ladder.json``."""
    write_json_atomic(model_dir.ladder_path, {"schema_version": SCHEMA_VERSION, "rungs": [r.to_dict() for r in rungs]})


def read_ladder(model_dir: ModelDir) -> list[Rung] | None:
    """The model's rungs as written by :func:`write_ladder`, or None when it has no ladder.
    A malformed file (or one with a rung twice) is an :class:`InputError`."""
    path = model_dir.ladder_path
    if not path.is_file():
        return None
    data = read_json(path)
    try:
        rungs = [Rung.from_dict(d) for d in data["rungs"]]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{path} is not a ladder ({type(err).__name__}: {err})") from None
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
    names = [r.rung for r in rungs]
    if len(set(names)) != len(names):
        raise InputError(f"{path}: a rung appears twice ({', '.join(names)})")
    return rungs


def read_gradient_canaries(model_dir: ModelDir | str | Path) -> GradientCanaryRecord | None:
    """The model's white-box gradient canaries (``gradient_canaries.npz``), or None when it
    was trained without them. A malformed file is an :class:`InputError`."""
    return _read_npz(model_dir, GRADIENT_CANARIES, GradientCanaryRecord.from_arrays)


def read_unit_clipping(model_dir: ModelDir | str | Path) -> UnitClipping | None:
    """Who was clipped in the model's DP run (``unit_clipping.npz``), or None when its trainer
    did not record it (a non-private or third-party trainer: unknown). A malformed file is an
    :class:`InputError`."""
    return _read_npz(model_dir, UNIT_CLIPPING, UnitClipping.from_arrays)


def _read_npz(model_dir: ModelDir | str | Path, name: str, parse: Callable[[dict], Any]) -> Any:
    """``parse`` of the arrays of the model's ``name`` (no pickles), None when it is absent;
    a malformed file is an :class:`InputError`."""
    import numpy as np

    path = Path(model_dir.root if isinstance(model_dir, ModelDir) else model_dir) / name
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return parse(dict(arrays))
    except (OSError, ValueError, InputError) as err:
        raise InputError(f"{path}: {err}") from None


# --------------------------------------------------------------------------- the prepared data


def save_split(split: dict, path: str | os.PathLike) -> Path:
    """Write a split (:func:`dpaudit.data.corpus.split_by_unit`) as JSON, atomically."""
    from dpaudit.data.corpus import SPLIT_SCHEMA_VERSION

    path = Path(path)
    write_json_atomic(path, {"schema_version": SPLIT_SCHEMA_VERSION, **split})
    return path


def load_split(path: str | os.PathLike) -> dict:
    """Read a split written by :func:`save_split`."""
    from dpaudit.data.corpus import check_split

    path = Path(path)
    if not path.is_file():
        raise InputError(f"split file not found: {path}")
    return check_split(read_json(path), origin=f"split file {path}")


def save_canaries(canaries: list, path: str | os.PathLike, *, spec: dict | str | None = None) -> Path:
    """Write canaries (and optionally their spec) as JSON, atomically
    (:func:`dpaudit.canaries.canaries_to_dict`)."""
    from dpaudit.canaries import canaries_to_dict

    path = Path(path)
    write_json_atomic(path, canaries_to_dict(canaries, spec=spec))
    return path


def load_canaries(path: str | os.PathLike) -> tuple[list, dict | None]:
    """``(canaries, spec or None)`` of a file written by :func:`save_canaries`."""
    from dpaudit.canaries import canaries_from_dict

    path = Path(path)
    if not path.is_file():
        raise InputError(f"canary file not found: {path}")
    return canaries_from_dict(read_json(path), origin=f"canary file {path}")


def write_data(directory: Path, *, split: dict, candidates: list[dict], public: list[dict], canaries: list,
               spec: dict, tokenizer, secrets: list | None = None, secret_spec: dict | None = None) -> None:
    """The prepare stage's files, into the staging ``directory`` of :attr:`RunDir.data_dir`."""
    save_split(split, directory / "split.json")
    write_jsonl_atomic(directory / "candidates.jsonl", candidates)
    if public:
        write_jsonl_atomic(directory / "public.jsonl", public)
    if secrets:
        save_canaries(secrets, directory / "secrets.json", spec=secret_spec)
    tokenizer.save_pretrained(directory / "tokenizer")
    save_canaries(canaries, directory / "canaries.json", spec=spec)  # last: marks data/ complete


def read_split(rundir: RunDir) -> dict:
    return load_split(rundir.data_dir / "split.json")


def read_canaries(rundir: RunDir) -> list:
    """The run's canaries as :class:`dpaudit.canaries.Canary` objects."""
    return load_canaries(rundir.data_dir / "canaries.json")[0]


def read_secrets(rundir: RunDir) -> tuple[list, dict | None]:
    """The secret canaries (``canaries.secrets``, in ``data/secrets.json``) and their spec;
    ``([], None)`` for a run without them."""
    return load_canaries(rundir.secrets_path) if rundir.secrets_path.is_file() else ([], None)


def read_tokenizer(rundir: RunDir):
    from dpaudit.data.tokenizer import load_tokenizer

    return load_tokenizer(rundir.tokenizer_dir)


# --------------------------------------------------------------------------- the manifest


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


def write_manifest(rundir: RunDir, *, seeds: dict[str, int], command: list[str] | None = None) -> None:
    rundir.write_manifest(manifest(seeds=seeds, command=command))


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
        # the kernels torch dispatches to (e.g. AVX2, AVX512) and the CPU model: CPU results are
        # the same to the bit only where both are equal (the matrix libraries choose their
        # kernels, and so the order of additions, by the model too)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _cpu_model() -> dict[str, str] | None:
    """The first CPU's vendor, model name, family, model, stepping and cache size as
    ``/proc/cpuinfo`` gives them (Linux; None elsewhere). Two machines that both reported
    AVX512, with the same packages, threads and code, trained the demo's base model to
    different last bits (2026-12-06); ``cpu_capability`` alone does not tell such machines apart."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return None
    fields = {key.strip(): value.strip() for key, _, value in
              (line.partition(":") for line in first.splitlines()) if value}
    keys = ("vendor_id", "model name", "cpu family", "model", "stepping", "cache size")
    return {key: fields[key] for key in keys if key in fields} or None


def record_failure(md: ModelDir, *, stage: str, error: BaseException) -> None:
    """A model that failed in ``stage``: logged (with its traceback unless an input error) and
    written to its ``error.json``; the run goes on with the others."""
    logging.getLogger("dpaudit.stages").error("model %s failed in the %s stage: %s", md.name, stage, error,
                                              exc_info=not isinstance(error, InputError))
    md.write_error(stage=stage, error=error)
