"""Fleet stage: the fleet directories of reference models and of the multi-run audit.

:func:`train_reference_fleet` trains the run's reference models, like the run's own ``train``
section (fine-tuning the base model when there is one), on random subsets drawn at the
target's own rates: records at ``1 - data.holdout_fraction``, canaries at
``canaries.inclusion_prob`` and repeated as often (Carlini et al. 2022, arXiv 2112.03570,
assume reference models trained like the target). :func:`train_fleet` is any fleet: who
trains on what is :func:`dpaudit.fleet.inclusion_matrix` (or a given ``keep``), each model is
one job (:func:`run_job`, through the one trainer call
:func:`dpaudit.stages.train.train_and_save`) run by :func:`dpaudit.fleet.run_jobs`.

Layout of a fleet directory::

    fleet_dir/
      config.resolved.yaml   the run config the models were trained with
      candidates/            Dataset.save_to_disk (Arrow): text, input_ids, attention_mask, unit_id
      tokenizer/             save_pretrained
      keep.npz               keep bool [M, n], unit_ids [n], seed, candidates/tokenizer digests
      model-000/ ...         save_pretrained model + tokenizer, fleet_job.json, trainer run files

``keep.npz`` is written after the inputs and before any model; a model directory appears
(by an atomic rename from a temporary sibling) only when it is complete. A rerun with the
same inputs therefore trains only the models that are missing; a rerun with different inputs
is refused rather than mixing two fleets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.config import Config, FleetConfig, load_config
from dpaudit.errors import InputError
from dpaudit.fleet import inclusion_matrix, model_seed, run_jobs
from dpaudit.rundir import RunDir, read_json, write_npz_atomic, write_text_atomic
from dpaudit.stages.prepare import PreparedData
from dpaudit.stages.train import effective_config

SCHEMA_VERSION = 1
REQUIRED_COLUMNS = ("text", "input_ids", "attention_mask", "unit_id")
JOB_FILE = "fleet_job.json"
KEEP_FILE = "keep.npz"
CONFIG_FILE = "config.resolved.yaml"
TMP_PREFIX = ".tmp-"
# Config sections whose change makes old models a different fleet (``train.device`` aside).
_TRAINING_SECTIONS = ("model", "train")


def train_reference_fleet(rundir: RunDir, config: Config, data: PreparedData) -> tuple[np.ndarray, list] | None:
    """Train what the fleet still lacks; ``(keep [M, n], model dirs)``, or None without a fleet."""
    if config.fleet.num_models == 0:
        return None
    _reference_fleet(rundir, config, data, defer=False)
    return load_fleet(rundir.fleet_dir)


def open_reference_fleet(rundir: RunDir, config: Config, data: PreparedData) -> list[int]:
    """Write the reference fleet's inputs as :func:`train_reference_fleet` does and return the
    indices of the models it still lacks, for a caller that runs them (:func:`run_job` on
    ``rundir.fleet_dir``) beside its own jobs; [] without a fleet."""
    if config.fleet.num_models == 0:
        return []
    _reference_fleet(rundir, config, data, defer=True)
    return [j for j in range(config.fleet.num_models) if not _is_complete(_model_dir(rundir.fleet_dir, j))]


def _reference_fleet(rundir: RunDir, config: Config, data: PreparedData, *, defer: bool) -> None:
    import datasets

    from dpaudit.data.corpus import tokenize_dataset

    candidates, canaries = data.candidates, data.canaries
    rows = {
        "text": [c["text"] for c in candidates] + [c.text for c in canaries],
        "unit_id": [c["unit_id"] for c in candidates] + [c.id for c in canaries],
        "repetitions": [1] * len(candidates) + [c.repetitions for c in canaries],
    }
    rates = [1.0 - config.data.holdout_fraction] * len(candidates) + [config.canaries.inclusion_prob] * len(canaries)
    dataset = tokenize_dataset(datasets.Dataset.from_dict(rows), data.tokenizer, max_length=config.data.max_length)
    train_fleet(fleet_dir=rundir.fleet_dir, candidates=dataset, tokenizer=data.tokenizer,
                config=effective_config(rundir, config, None), keep_fraction=rates, defer=defer)


def train_fleet(
    *,
    fleet_dir: str | Path,
    candidates,
    tokenizer,
    config: Config,
    keep_fraction: float | Sequence[float] = 0.5,
    num_models: int | None = None,
    executor: str | None = None,
    address: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    keep: np.ndarray | None = None,
    defer: bool = False,
) -> np.ndarray:
    """Train the reference models that ``fleet_dir`` still lacks; return ``keep`` [M, n].
    ``defer=True`` writes the inputs and trains nothing: the caller runs the missing models.

    ``candidates`` is a ``datasets.Dataset`` with ``text``, ``input_ids``,
    ``attention_mask`` and ``unit_id``: the examples the attacks score, and optionally
    ``repetitions`` (int, default 1: how many copies of the row a model that keeps it trains
    on, as canaries repeated in the target's training set). Model ``j`` trains with
    ``config.train.trainer`` on ``candidates`` restricted to ``keep[j]``, with the seed
    :func:`model_seed` ``(config.seed, j)``; ``keep`` comes from :func:`inclusion_matrix`
    with ``keep_fraction``, unless ``keep`` (bool [M, n]) is given: then model ``j`` trains
    on exactly the rows ``keep[j]`` says (a designed experiment, such as the multi-run audit's
    K models with a canary and K without) and ``num_models`` is M. ``num_models``,
    ``executor``, ``address`` and ``workers`` default to ``config.fleet``.

    ``executor="local"``: a pool of ``workers`` spawned processes, each with
    ``cpu_count // workers`` torch threads (one pending model, or ``workers=1``, runs in this
    process). ``executor="ray"``: one Ray task per missing model; ``address`` is ``"auto"`` or
    ``"host:port"`` of a running cluster, or None for a local instance started (and stopped)
    here (if this process is already connected to Ray, that connection is used as it is and
    left open). On a cluster, ``fleet_dir`` must be on a file system that every node shares, at the
    same path, and every node needs ``dpaudit`` installed; the directory of the trainer's
    module is put on the workers' ``PYTHONPATH``. Each task asks Ray for
    ``config.fleet.num_cpus`` CPUs (when None: ``cpu_count // workers`` on a local instance,
    1 on a cluster) and ``config.fleet.num_gpus`` GPUs.

    Interrupted fleets resume: finished models are kept, temporary directories left by
    unfinished ones are removed and those models are trained again. If ``fleet_dir`` holds a
    fleet for other candidates, tokenizer, seed, model count or training config, an
    :class:`InputError` is raised rather than mixing the two.
    """
    fleet, keep = _settings(config.fleet, candidates, keep=keep, num_models=num_models, executor=executor,
                            address=address, workers=workers)
    num_models = fleet.num_models
    fleet_dir = Path(fleet_dir)
    fleet_dir.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(config, fleet=fleet)
    unit_ids = np.asarray([str(u) for u in candidates["unit_id"]], dtype=str)
    if keep is None:
        keep = inclusion_matrix(unit_ids=unit_ids, num_models=num_models, seed=config.seed, keep_fraction=keep_fraction)
    empty = np.flatnonzero(~keep.any(axis=1))
    if empty.size:
        raise InputError(
            f"fleet model {int(empty[0])} would train on no candidates: "
            f"{len(np.unique(unit_ids))} protected unit(s) are too few for {num_models} models"
        )
    identity = {
        "candidates_sha256": _dataset_digest(candidates),
        "tokenizer_sha256": _tokenizer_digest(tokenizer),
    }
    if config.model.base_model:  # the base by its weights, not its path: a run directory may move
        identity["base_model_sha256"] = _weights_digest(config.model.base_model)
    if config.model.architecture:  # the shape by its config.json, not its path
        identity["architecture_sha256"] = _architecture_digest(config.model.architecture)
    keep_path = fleet_dir / KEEP_FILE
    if keep_path.exists():
        _check_same_fleet(fleet_dir, keep, unit_ids, config, identity)
        write_text_atomic(fleet_dir / CONFIG_FILE, config.to_yaml())  # the base's path where it is now
    else:
        if any(_model_dirs(fleet_dir)):
            raise InputError(f"{fleet_dir} holds fleet models but no {KEEP_FILE}: use a new fleet directory")
        _write_inputs(fleet_dir, candidates, tokenizer, config, keep, unit_ids, identity)

    for leftover in fleet_dir.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
    todo = [j for j in range(num_models) if not _is_complete(_model_dir(fleet_dir, j))]
    if todo and not defer:
        run_jobs(run_job, fleet_dir=fleet_dir, todo=todo, num_models=num_models, fleet=fleet,
                 trainer=config.train.trainer, progress=progress)
    return keep


def _settings(fleet: FleetConfig, candidates, *, keep, num_models, executor, address, workers):
    """``(fleet settings, keep)``: the arguments over ``config.fleet``, checked with the candidates."""
    if keep is not None:
        keep = np.asarray(keep)
        if keep.dtype != bool or keep.ndim != 2 or keep.shape[1] != len(candidates) or keep.shape[0] < 1:
            raise InputError(f"keep must be a bool matrix [models, {len(candidates)}], got {keep.dtype} {keep.shape}")
        if num_models is not None and num_models != keep.shape[0]:
            raise InputError(f"keep has {keep.shape[0]} rows for num_models={num_models}")
        num_models = keep.shape[0]
    num_models = fleet.num_models if num_models is None else num_models
    executor = fleet.executor if executor is None else executor
    address = fleet.address if address is None else address
    workers = fleet.workers if workers is None else workers
    if isinstance(num_models, bool) or not isinstance(num_models, int) or num_models < 1:
        raise InputError(f"fleet.num_models must be >= 1 to train a fleet, got {num_models!r}")
    if executor not in ("local", "ray"):
        raise InputError(f"fleet.executor must be local or ray, got {executor!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"fleet.workers must be >= 1, got {workers!r}")
    missing = [c for c in REQUIRED_COLUMNS if c not in candidates.column_names]
    if missing:
        raise InputError(f"the fleet's candidates lack the column(s) {', '.join(missing)}")
    if "repetitions" in candidates.column_names and not (np.asarray(candidates["repetitions"]) >= 1).all():
        raise InputError("the fleet's candidates have a repetitions value below 1")

    settings = dataclasses.replace(fleet, num_models=num_models, executor=executor, address=address, workers=workers)
    return settings, keep


def load_fleet(fleet_dir: str | Path) -> tuple[np.ndarray, list[Path]]:
    """The complete models of a fleet and their rows of the inclusion matrix.

    Returns ``(keep, model_dirs)`` with ``keep[i]`` the inclusion row of ``model_dirs[i]``
    (models still missing are left out of both). Raises :class:`InputError` when
    ``fleet_dir`` is not a fleet or has no complete model yet.
    """
    fleet_dir = Path(fleet_dir)
    keep_path = fleet_dir / KEEP_FILE
    if not keep_path.is_file():
        raise InputError(f"{fleet_dir} is not a fleet directory (no {KEEP_FILE})")
    keep = _read_keep(keep_path)["keep"]
    indices = [j for j in range(keep.shape[0]) if _is_complete(_model_dir(fleet_dir, j))]
    if not indices:
        raise InputError(f"the fleet in {fleet_dir} has no complete model yet: run train_fleet first")
    return keep[indices], [_model_dir(fleet_dir, j) for j in indices]


def job_records(fleet_dir: str | Path) -> dict[int, dict[str, Any]]:
    """``{index: fleet_job.json}`` of the fleet's complete models (none yet: empty)."""
    fleet_dir = Path(fleet_dir)
    done = {}
    for path in sorted(_model_dirs(fleet_dir)):
        if _is_complete(path):
            record = read_json(path / JOB_FILE)
            done[int(record["index"])] = record
    return done


# --------------------------------------------------------------------------- one job


def run_job(fleet_dir: str, index: int, threads: int | None = None) -> dict[str, Any]:
    """Train and save fleet model ``index``; everything is read back from ``fleet_dir``.

    Runs in a pool process, a Ray worker or the calling process. Returns the job record
    (also written as ``fleet_job.json``), or the existing record if the model is done."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from dpaudit.progress import label
    from dpaudit.stages.train import train_and_save

    if threads:
        torch.set_num_threads(int(threads))
    root = Path(fleet_dir)
    final = _model_dir(root, index)
    if _is_complete(final):
        return read_json(final / JOB_FILE)
    config = load_config(root / CONFIG_FILE)
    keep = _read_keep(root / KEEP_FILE)["keep"]
    candidates = load_from_disk(str(root / "candidates"))
    tokenizer = AutoTokenizer.from_pretrained(str(root / "tokenizer"))
    kept = np.flatnonzero(keep[index])
    if "repetitions" in candidates.column_names:
        kept = np.repeat(kept, np.asarray(candidates["repetitions"])[kept])
    rows = candidates.select(kept)
    seed = model_seed(config.seed, index)
    tmp = root / f"{TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        start = time.perf_counter()
        with label(f"reference-{index:03d}"):
            train_and_save(tmp, dataset=rows, tokenizer=tokenizer, seed=seed, config=config)
        record = {
            "schema_version": SCHEMA_VERSION,
            "index": int(index),
            "seed": seed,
            "num_rows": len(rows),
            "num_units": len(set(rows["unit_id"])),
            "trainer": config.train.trainer,
            "wall_time_s": round(time.perf_counter() - start, 3),
        }
        write_text_atomic(tmp / JOB_FILE, json.dumps(record, indent=2) + "\n")
        try:
            tmp.rename(final)
        except OSError:
            if not _is_complete(final):  # another process finished it first: keep theirs
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return record


def _model_dir(fleet_dir: Path, index: int) -> Path:
    return fleet_dir / f"model-{index:03d}"


def _model_dirs(fleet_dir: Path):
    return (p for p in fleet_dir.glob("model-[0-9][0-9][0-9]*") if p.is_dir())


def _is_complete(model_dir: Path) -> bool:
    return (model_dir / JOB_FILE).is_file()


def _read_keep(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as err:
        raise InputError(f"{path} is not a readable fleet inclusion matrix: {err}") from None


def _write_inputs(fleet_dir, candidates, tokenizer, config, keep, unit_ids, identity) -> None:
    write_text_atomic(fleet_dir / CONFIG_FILE, config.to_yaml())
    for name, save in (
        ("tokenizer", lambda d: tokenizer.save_pretrained(str(d))),
        ("candidates", lambda d: candidates.save_to_disk(str(d))),
    ):
        tmp = fleet_dir / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
        save(tmp)
        shutil.rmtree(fleet_dir / name, ignore_errors=True)
        tmp.rename(fleet_dir / name)
    write_npz_atomic(
        fleet_dir / KEEP_FILE,
        keep=keep,
        unit_ids=unit_ids,
        seed=np.int64(config.seed),
        schema_version=np.int64(SCHEMA_VERSION),
        **{k: np.asarray(v) for k, v in identity.items()},
    )


def _check_same_fleet(fleet_dir: Path, keep, unit_ids, config: Config, identity: dict[str, str]) -> None:
    stored = _read_keep(fleet_dir / KEEP_FILE)
    hint = "use a new fleet directory"

    def refuse(what: str) -> None:
        raise InputError(f"{fleet_dir} holds a fleet for {what}: {hint}")

    if stored["keep"].shape[0] != keep.shape[0]:
        refuse(f"{stored['keep'].shape[0]} models, not {keep.shape[0]}")
    if "seed" in stored and int(stored["seed"]) != config.seed:
        refuse(f"seed {int(stored['seed'])}, not {config.seed}")
    if stored["unit_ids"].shape != unit_ids.shape or not np.array_equal(stored["unit_ids"], unit_ids):
        refuse("other candidates (their unit ids differ)")
    names = {"candidates_sha256": "other candidates", "tokenizer_sha256": "another tokenizer",
             "base_model_sha256": "another base model", "architecture_sha256": "another architecture"}
    for key, value in identity.items():
        if key in stored and str(stored[key]) != value:
            refuse(names[key])
    if not np.array_equal(stored["keep"], keep):
        refuse("another inclusion matrix")
    config_path = fleet_dir / CONFIG_FILE
    if config_path.is_file():
        old = load_config(config_path).to_dict()
        new = config.to_dict()
        for section in _TRAINING_SECTIONS:
            # the base model is compared by its weights above, the architecture by its config.json
            diff = sorted(_diff(old.get(section), new.get(section), section)
                          - {"train.device", "model.base_model", "model.architecture"})
            if diff:
                refuse(f"another training config ({', '.join(diff)} differ)")


def _diff(a: Any, b: Any, path: str) -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for key in set(a) | set(b):
            out |= _diff(a.get(key), b.get(key), f"{path}.{key}")
        return out
    return set() if a == b else {path}


def _dataset_digest(dataset) -> str:
    """SHA-256 of the candidate columns the fleet depends on (order included)."""
    import pyarrow.compute as pc

    names = [*REQUIRED_COLUMNS, *(["repetitions"] if "repetitions" in dataset.column_names else [])]
    table = dataset.select_columns(names).with_format("arrow")[:]
    digest = hashlib.sha256()
    for name in names:
        column = table.column(name).combine_chunks()
        digest.update(name.encode() + b"\0")
        if name == "repetitions":
            digest.update(np.ascontiguousarray(column.to_numpy(), dtype=np.int64).tobytes())
        elif name in ("text", "unit_id"):
            digest.update(json.dumps([str(v) for v in column.to_pylist()]).encode())
        else:
            lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
            values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
            digest.update(np.ascontiguousarray(lengths, dtype=np.int64).tobytes())
            digest.update(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _tokenizer_digest(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    return hashlib.sha256(json.dumps([vocab, special]).encode()).hexdigest()


def _architecture_digest(model_dir: str | Path) -> str:
    """sha256 of a model's config.json without its bookkeeping (``_name_or_path``,
    ``transformers_version``): two copies of one architecture are one."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return hashlib.sha256(str(model_dir).encode()).hexdigest()
    kept = {k: v for k, v in raw.items() if not k.startswith("_") and k != "transformers_version"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def _weights_digest(model_dir: str | Path) -> str:
    """sha256 of a local model's safetensors files (a hub name or other path: the name itself)."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    h = hashlib.sha256(str(model_dir).encode() if not files else b"")
    for f in files:
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
