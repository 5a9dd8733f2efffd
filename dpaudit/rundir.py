"""Run directories: every artifact's path, reader and writer, all writes atomic.

A run is a set of models that share their data, canaries and reference fleet::

    RUN/
      config.resolved.yaml   the config after presets and overrides        (run)
      manifest.json          package versions, seeds, git commit, hardware (run)
      run.log                progress and warnings of every stage           (run)
      data/                  split.json, candidates.jsonl, public.jsonl,    (prepare)
                             canaries.json, secrets.json, tokenizer/
      base/                  the base model: trained on the public data, or (train)
                             the user's base_model grown for the canaries
      fleet/                 reference models and their keep matrix         (fleet)
      signals/               signals of the reference models                (attack)
      models/NAME/           model/, train_log.jsonl, dp_event.json,        (train)
                             train_checks.json, gradient_canaries.npz,
                             unit_clipping.npz, error.json
                             signals/, results/ATTACK.json|npz              (attack)
                             extraction.json                                (extract)
                             multi_run.json|npz                             (multi-run audit)
                             ladder.json                                    (threat-model ladder)
      multi_run/NAME/        the multi-run audit's 2K runs (a fleet)       (multi-run audit)
      report.json, report.html, figures/, tables/                          (report)
      step_audit.json, step_audit.npz  white-box audit of one step          (validate --step)

An ``audit-model`` output has ``models/NAME/results/``, ``audit_inputs.json``, the report, and
with ``--train-references`` ``references/``: its reference models (a fleet) and their signals.

This module knows the layout and writes atomically; it holds plain data only (JSON, arrays).
Typed artifacts (the DP record, canaries, the split, the tokenizer, signals, the fleet) are
read and written by the stages through their codecs (:mod:`dpaudit.stages.artifacts`).

A stage that builds a directory (``data/``, ``base/``, ``models/NAME/``) builds it under a
hidden staging name and renames it into place at the end, so a directory that carries its
real name is complete; files are written to a temporary name and renamed. An interrupted
run therefore resumes by redoing only what is not in place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable

SCHEMA_VERSION = 1


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[Any]:
    """A file opened on a temporary name beside ``path``; it replaces ``path`` only when
    the block ends without an error (the one atomic writer: every artifact goes through it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """``obj`` as JSON (through :func:`dpaudit.jsonable.jsonable`: non-finite floats become null)."""
    write_text_atomic(path, json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n")


def write_npz_atomic(path: str | Path, **arrays: Any) -> None:
    """``np.savez`` (no pickle)."""
    import numpy as np

    with atomic_file(path, "wb") as f:
        np.savez(f, **arrays)


def read_json(path: str | Path) -> Any:
    """Parsed JSON, or an InputError for a missing or unreadable file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"missing {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"cannot read {path}: {err}") from None


@contextlib.contextmanager
def staged_directory(out: str | Path) -> Iterator[Path]:
    """Yield a hidden staging directory beside ``out``; rename it to ``out`` on success
    (replacing an incomplete ``out``), delete it on any error. Staging directories of ``out``
    left by a killed process (SIGKILL cleans nothing up) are deleted first."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(stage, out)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """One JSON object per non-empty line; an InputError names a bad line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"missing {path.name} in {path.parent}")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise InputError(f"{path}:{number} is not valid JSON") from None
    return rows


def write_jsonl_atomic(path: str | Path, rows: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(jsonable(r)) + "\n" for r in rows))


# file names that trainers write into the directory they are given (the plug-in's run_dir)
TRAIN_LOG, DP_EVENT, TRAIN_CHECKS = "train_log.jsonl", "dp_event.json", "train_checks.json"
GRADIENT_CANARIES = "gradient_canaries.npz"  # a DP run with train.dp.gradient_canaries > 0
UNIT_CLIPPING = "unit_clipping.npz"  # a DP run whose engine records whose gradient was clipped


class ModelDir:
    """The artifacts of one model of a run: ``RUN/models/NAME/`` (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.name = self.root.name

    def __repr__(self) -> str:
        return f"ModelDir({str(self.root)!r})"

    weights = property(lambda self: self.root / "model")
    train_log_path = property(lambda self: self.root / TRAIN_LOG)
    dp_event_path = property(lambda self: self.root / DP_EVENT)
    train_checks_path = property(lambda self: self.root / TRAIN_CHECKS)
    gradient_canaries_path = property(lambda self: self.root / GRADIENT_CANARIES)
    unit_clipping_path = property(lambda self: self.root / UNIT_CLIPPING)
    error_path = property(lambda self: self.root / "error.json")
    signals_dir = property(lambda self: self.root / "signals")
    results_dir = property(lambda self: self.root / "results")
    extraction_path = property(lambda self: self.root / "extraction.json")
    multi_run_path = property(lambda self: self.root / "multi_run.json")
    ladder_path = property(lambda self: self.root / "ladder.json")

    def is_trained(self) -> bool:
        """The model directory was renamed into place by the train stage."""
        return (self.weights / "config.json").is_file()

    def read_train_log(self) -> list[dict[str, Any]]:
        return read_jsonl(self.train_log_path) if self.train_log_path.is_file() else []

    def read_train_checks(self) -> dict[str, Any] | None:
        return read_json(self.train_checks_path) if self.train_checks_path.is_file() else None

    # errors: a model fails alone; its entry carries the message
    def write_error(self, *, stage: str, error: BaseException) -> None:
        message = str(error) or type(error).__name__
        write_json_atomic(self.error_path, {"schema_version": SCHEMA_VERSION, "stage": stage,
                                            "type": type(error).__name__, "message": message})

    def read_error(self) -> dict[str, Any] | None:
        return read_json(self.error_path) if self.error_path.is_file() else None

    def clear_error(self) -> None:
        self.error_path.unlink(missing_ok=True)

    # attack results: metrics in JSON, scores and labels in npz
    def write_results(self, attack: str, *, params: dict, splits: dict[str, tuple[Any, Any, dict]]) -> None:
        """``results/ATTACK.json`` (metrics of each split) and ``results/ATTACK.npz``
        (``SPLIT_scores``, ``SPLIT_labels``); ``splits[name] = (scores, labels, metrics)``."""
        import numpy as np

        arrays = {}
        for split, (scores, labels, _) in splits.items():
            arrays[f"{split}_scores"] = np.asarray(scores, dtype=np.float64)
            arrays[f"{split}_labels"] = np.asarray(labels, dtype=bool)
        write_npz_atomic(self.results_dir / f"{attack}.npz", **arrays)
        write_json_atomic(self.results_dir / f"{attack}.json", {
            "schema_version": SCHEMA_VERSION, "attack": attack, "params": params,
            "splits": {k: v[2] for k, v in splits.items()},
        })

    def write_attack_index(self, attacks: list[str]) -> None:
        """``results/index.json``, written when every attack of the run is in place."""
        write_json_atomic(self.results_dir / "index.json", {"schema_version": SCHEMA_VERSION, "attacks": attacks})

    def attacked(self) -> bool:
        """The attack stage finished for this model (a resume skips it)."""
        return (self.results_dir / "index.json").is_file()

    def read_results(self) -> dict[str, dict[str, Any]]:
        """``{attack: {"params", "splits": {split: metrics}, "arrays": {split: (scores, labels)}}}``
        in file-name order; an InputError for an unreadable or inconsistent file."""
        import numpy as np

        out: dict[str, dict[str, Any]] = {}
        for path in sorted(p for p in self.results_dir.glob("*.json") if p.name != "index.json"):
            data = read_json(path)
            npz = path.with_suffix(".npz")
            if not isinstance(data, dict) or not isinstance(data.get("splits"), dict) or not npz.is_file():
                raise InputError(f"{path} is not an attack result (or lacks its .npz)")
            try:
                with np.load(npz, allow_pickle=False) as z:
                    arrays = {s: (z[f"{s}_scores"], z[f"{s}_labels"].astype(bool)) for s in data["splits"]}
            except (OSError, KeyError, ValueError) as err:
                raise InputError(f"cannot read {npz}: {err}") from None
            out[path.stem] = {"params": data.get("params", {}), "splits": data["splits"], "arrays": arrays}
        return out

    def write_extraction(self, obj: dict[str, Any]) -> None:
        write_json_atomic(self.extraction_path, {"schema_version": SCHEMA_VERSION, **obj})

    def read_extraction(self) -> dict[str, Any] | None:
        return read_json(self.extraction_path) if self.extraction_path.is_file() else None

    def write_multi_run(self, result: dict[str, Any], *, in_scores: Any, out_scores: Any) -> None:
        """``multi_run.npz`` (the canary's score in each run with it, ``in_scores``, and
        without it, ``out_scores``), then ``multi_run.json`` (bounds, verdict, runs), last."""
        import numpy as np

        write_npz_atomic(self.multi_run_path.with_suffix(".npz"), in_scores=np.asarray(in_scores, dtype=np.float64),
                         out_scores=np.asarray(out_scores, dtype=np.float64))
        write_json_atomic(self.multi_run_path, {"schema_version": SCHEMA_VERSION, **result})

    def read_multi_run(self) -> dict[str, Any] | None:
        """The multi-run audit with its ``in_scores`` / ``out_scores`` arrays, or None when not run."""
        import numpy as np

        if not self.multi_run_path.is_file():
            return None
        result = read_json(self.multi_run_path)
        npz = self.multi_run_path.with_suffix(".npz")
        try:
            with np.load(npz, allow_pickle=False) as z:
                return {**result, "in_scores": z["in_scores"], "out_scores": z["out_scores"]}
        except (OSError, KeyError, ValueError) as err:
            raise InputError(f"cannot read {npz}: {err}") from None


class RunDir:
    """Every artifact of a run directory: its path, its reader and its writer."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    config_path = property(lambda self: self.root / "config.resolved.yaml")
    manifest_path = property(lambda self: self.root / "manifest.json")
    log_path = property(lambda self: self.root / "run.log")
    data_dir = property(lambda self: self.root / "data")
    tokenizer_dir = property(lambda self: self.root / "data" / "tokenizer")
    base_dir = property(lambda self: self.root / "base")
    fleet_dir = property(lambda self: self.root / "fleet")
    models_dir = property(lambda self: self.root / "models")
    figures_dir = property(lambda self: self.root / "figures")
    tables_dir = property(lambda self: self.root / "tables")
    report_json = property(lambda self: self.root / "report.json")
    report_html = property(lambda self: self.root / "report.html")

    audit_inputs_path = property(lambda self: self.root / "audit_inputs.json")
    references_dir = property(lambda self: self.root / "references")  # audit-model's own reference fleet

    def exists(self) -> bool:
        """A run (its config is written) or an ``audit-model`` output (its inputs are)."""
        return self.config_path.is_file() or self.audit_inputs_path.is_file()

    def check(self) -> RunDir:
        """This run directory, or an InputError when it is not one."""
        if not self.root.is_dir():
            raise InputError(f"run directory not found: {self.root}")
        if not self.exists():
            raise InputError(f"{self.root} is not a dpaudit run directory (no {self.config_path.name})")
        return self

    def model_names(self) -> list[str]:
        """Names of the models that have a directory, in name order."""
        return sorted(p.name for p in self.models_dir.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if self.models_dir.is_dir() else []

    def write_audit_inputs(self, obj: dict[str, Any]) -> None:
        write_json_atomic(self.audit_inputs_path, {"schema_version": SCHEMA_VERSION, **obj})

    def read_audit_inputs(self) -> dict[str, Any] | None:
        return read_json(self.audit_inputs_path) if self.audit_inputs_path.is_file() else None

    # the white-box step audit (``dpaudit validate --step --out RUN``)
    step_audit_path = property(lambda self: self.root / "step_audit.json")
    step_samples_path = property(lambda self: self.root / "step_audit.npz")

    def read_step_audit(self) -> dict[str, Any] | None:
        """``step_audit.json``, or None when no step audit was run into this directory."""
        return read_json(self.step_audit_path) if self.step_audit_path.is_file() else None

    # config and manifest
    def write_config(self, config) -> None:
        write_text_atomic(self.config_path, config.to_yaml())

    def read_config(self):
        from dpaudit.config import load_config

        return load_config(self.config_path)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.manifest_path, manifest)

    def read_manifest(self) -> dict[str, Any] | None:
        return read_json(self.manifest_path) if self.manifest_path.is_file() else None

    # data/ (the prepare stage): one staged directory
    def data_complete(self) -> bool:
        return (self.data_dir / "canaries.json").is_file()

    def read_candidates(self) -> list[dict[str, Any]]:
        """The records the attacks score: ``{"text", "unit_id", "role": member|heldout}``."""
        return read_jsonl(self.data_dir / "candidates.jsonl")

    def read_public(self) -> list[dict[str, Any]]:
        """The public records (``{"text", "unit_id"}``); empty without public data."""
        path = self.data_dir / "public.jsonl"
        return read_jsonl(path) if path.is_file() else []

    def read_canary_file(self) -> dict[str, Any]:
        """``canaries.json`` as written (spec, secret space size, canaries)."""
        return read_json(self.data_dir / "canaries.json")

    secrets_path = property(lambda self: self.data_dir / "secrets.json")

    # the base model
    def base_complete(self) -> bool:
        return (self.base_dir / "config.json").is_file()

    def has_fleet(self) -> bool:
        """The fleet's inclusion matrix is written (its models may still be training)."""
        return (self.fleet_dir / "keep.npz").is_file()

    # models
    def model(self, name: str) -> ModelDir:
        return ModelDir(self.models_dir / name)

    def multi_run_dir(self, name: str) -> Path:
        """The fleet directory of model ``name``'s multi-run audit (:mod:`dpaudit.stages.multi_run`)."""
        return self.root / "multi_run" / name

    # reference signals
    @property
    def signals_dir(self) -> Path:
        return self.root / "signals"

    # report
    def write_report(self, report: dict[str, Any], *, html: str) -> None:
        """``report.html``, then ``report.json`` last: its presence means the report is in place."""
        write_text_atomic(self.report_html, html)
        write_json_atomic(self.report_json, report)

    def read_report(self) -> dict[str, Any]:
        return read_json(self.report_json)
