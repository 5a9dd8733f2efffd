"""Reference-model fleets, the part that needs no directory: who trains on what, with which
seed, and the executors that run the models' jobs.

Reference-model attacks (LiRA, Carlini et al. 2022, arXiv 2112.03570; RMIA, Zarifzadeh et al.
2024, arXiv 2312.03262; the reference ratio of Carlini et al. 2021) compare the target model
with models known to have (or not to have) seen each candidate. :func:`inclusion_matrix`
says which protected units each model sees (``keep[model, example]``), :func:`model_seed`
gives each model its seed, and :func:`run_jobs` runs one job per missing model on an
executor: ``"local"`` (a process pool, the default) or ``"ray"``. A job is a function
``job(fleet_dir, index, threads) -> dict`` that reloads everything from ``fleet_dir``; the
fleet directory itself (its inputs, models and resume) belongs to
:mod:`dpaudit.stages.fleet`.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.config import FleetConfig
from dpaudit.errors import InputError
from dpaudit.seeds import derive_seed, generator

# The fleet's seeds live in their own branch of the run's SeedSequence tree, so that they
# never coincide with the seeds that other stages spawn from the same run seed.
_FLEET_SPAWN_KEY = 0x666C656574  # "fleet"

Job = Callable[..., dict]


def inclusion_matrix(
    *, unit_ids: Sequence[str], num_models: int, seed: int, keep_fraction: float | Sequence[float] = 0.5
) -> np.ndarray:
    """``keep[m, i]``: whether model ``m`` trains on example ``i``.

    Random subsets by protected unit: all rows of a unit share one column pattern. A unit
    whose keep fraction is ``p`` is kept by ``k`` models chosen at random, where ``k`` is
    ``floor(p M)`` or ``ceil(p M)`` (the latter with probability ``frac(p M)``), so each
    (model, unit) pair is in with probability ``p`` and the models' training sets are equally
    large on average. With ``num_models >= 2``, ``k`` is kept within ``[1, M - 1]``: every
    unit has an "in" and an "out" model. ``p = 1/2`` with an even ``M`` is the balanced
    design of Carlini et al. 2022 (LiRA): every unit in exactly ``M / 2`` models.

    ``keep_fraction`` is one number or one per row (equal within a unit). Reference models
    should be trained like the target, on as much data (Carlini et al. 2022): so
    the run uses the target's own inclusion rates, ``1 - data.holdout_fraction`` for records
    and ``canaries.inclusion_prob`` for canaries.

    Seeded with ``numpy.random.SeedSequence(seed)`` (the fleet's branch of it); units are
    taken in sorted order, so the pattern of a unit does not depend on the row order.
    """
    if isinstance(num_models, bool) or not isinstance(num_models, (int, np.integer)) or num_models < 1:
        raise InputError(f"the fleet needs num_models >= 1, got {num_models!r}")
    ids = np.asarray([str(u) for u in unit_ids], dtype=str)
    if ids.size == 0:
        raise InputError("the fleet needs at least one candidate example")
    units, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    fraction = np.asarray(keep_fraction, dtype=np.float64)
    if fraction.ndim == 0:
        fraction = np.full(ids.shape, float(fraction))
    if fraction.shape != ids.shape:
        raise InputError(f"keep_fraction has {fraction.size} values for {ids.size} examples")
    if not ((fraction > 0) & (fraction < 1)).all():
        raise InputError("keep_fraction must be in (0, 1) for every example")
    unit_fraction = fraction[first]
    if not np.array_equal(unit_fraction[inverse], fraction):
        raise InputError("keep_fraction must be the same for all rows of a protected unit")
    rng = generator(seed, _FLEET_SPAWN_KEY, 0)
    # rank[m, u]: position of model m in unit u's random permutation of the models
    rank = np.argsort(rng.random((len(units), num_models)), axis=1).argsort(axis=1).T
    expected = unit_fraction * num_models
    count = np.floor(expected)
    rest = expected - count
    if rest.any():
        count += rng.random(len(units)) < rest
    if num_models >= 2:
        count = np.clip(count, 1, num_models - 1)
    unit_keep = rank < count[None, :]
    return unit_keep[:, inverse]


def model_seed(seed: int, index: int) -> int:
    """The training seed of fleet model ``index``: child ``index`` of
    ``SeedSequence(seed, spawn_key=(FLEET, 1)).spawn(...)``, the same whatever the fleet size."""
    return derive_seed(seed, _FLEET_SPAWN_KEY, 1, int(index))


def run_jobs(job: Job, *, fleet_dir: Path, todo: list[int], num_models: int, fleet: FleetConfig, trainer: str,
             progress: bool = True) -> None:
    """Run ``job(str(fleet_dir), j, threads)`` for every ``j`` in ``todo`` on
    ``fleet.executor`` (see :func:`dpaudit.stages.fleet.train_fleet` for the options)."""
    run = _run_ray if fleet.executor == "ray" else _run_local
    run(job, fleet_dir=fleet_dir, todo=todo, num_models=num_models, fleet=fleet, trainer=trainer,
        address=fleet.address, workers=fleet.workers, progress=progress)


def _parent_log_file() -> str | None:
    """The log file this process writes to (the run's ``run.log``), for the workers to append to."""
    import logging

    return next((h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)), None)


def _init_worker(threads: int, log_path: str | None = None) -> None:
    """A pool process: its threads, no bars of its own (they would interleave), progress
    lines on stderr and in the run's log."""
    import logging

    import torch

    from dpaudit import progress

    torch.set_num_threads(threads)
    progress.disable_bars()
    progress.quiet_libraries()
    root = logging.getLogger()
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(stream)
    if log_path:
        handler = logging.FileHandler(log_path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
        root.addHandler(handler)


def _progress_bar(total: int, done: int, enabled: bool):
    from dpaudit.progress import Progress

    return Progress(total=total, initial=done, desc="fleet", unit="model", enabled=enabled)


def _run_local(job: Job, *, fleet_dir: Path, todo: list[int], num_models: int, workers: int, progress: bool, **_):
    workers = min(workers, len(todo))
    threads = max(1, (os.cpu_count() or 1) // workers)
    with _progress_bar(num_models, num_models - len(todo), progress) as bar:
        if workers == 1:
            # in-process: simpler to debug; torch's thread count is left as the caller set it
            for j in todo:
                job(str(fleet_dir), j)
                bar.update(1)
            return
        import multiprocessing
        from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

        context = multiprocessing.get_context("spawn")  # spawn copies sys.path to the children
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                 initargs=(threads, _parent_log_file())) as pool:
            pending = {pool.submit(job, str(fleet_dir), j): j for j in todo}
            failure = None
            while pending and failure is None:
                finished, _ = wait(pending, return_when=FIRST_EXCEPTION)
                for future in finished:
                    pending.pop(future)
                    if future.exception() is not None and failure is None:
                        failure = future
                    elif future.exception() is None:
                        bar.update(1)
            if failure is not None:
                # let running models finish (they count for a resume); drop the rest
                for future in pending:
                    future.cancel()
                wait(pending)
                bar.update(sum(1 for f in pending if not f.cancelled() and f.exception() is None))
                raise failure.exception()


def _run_ray(job: Job, *, fleet_dir: Path, todo: list[int], num_models: int, fleet: FleetConfig, trainer: str,
             address: str | None, workers: int, progress: bool):
    try:
        import ray
    except ImportError:
        raise InputError("fleet.executor ray needs Ray: pip install 'dpaudit[ray]'") from None

    started_here = False
    if not ray.is_initialized():
        if address:
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as err:
                raise InputError(f"cannot connect to the Ray cluster at {address}: {err}") from None
        else:
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        num_cpus = fleet.num_cpus
        if num_cpus is None:
            num_cpus = max(1, (os.cpu_count() or 1) // workers) if started_here and not address else 1
        num_gpus = fleet.num_gpus
        threads = max(1, int(num_cpus))
        options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_retries": 1}
        pythonpath = _trainer_import_roots(trainer)
        if pythonpath:
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join([*pythonpath, "${PYTHONPATH}"])}}
        task = ray.remote(job).options(**options)
        refs = {task.remote(str(fleet_dir.resolve()), j, threads): j for j in todo}
        with _progress_bar(num_models, num_models - len(todo), progress) as bar:
            pending = list(refs)
            try:
                while pending:
                    ready, pending = ray.wait(pending, num_returns=1)
                    ray.get(ready)  # raises the job's error
                    bar.update(len(ready))
            except BaseException:
                for ref in pending:
                    ray.cancel(ref)
                raise
    finally:
        if started_here:
            ray.shutdown()


def _trainer_import_roots(spec: str) -> list[str]:
    """The sys.path entry the trainer's module was imported from, unless it is an installed
    package (workers have those already)."""
    from dpaudit.plugins import load_trainer

    module = sys.modules.get(load_trainer(spec).__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return []
    path = Path(path).resolve()
    depth = module.__name__.count(".") + (path.stem == "__init__")
    root = path.parents[depth]
    paths = sysconfig.get_paths()
    installed = {Path(paths[k]).resolve() for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths}
    if root in installed or any(part in ("site-packages", "dist-packages") for part in root.parts):
        return []
    return [str(root)]


# --------------------------------------------------------------------------- files
