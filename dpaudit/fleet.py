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
from dataclasses import dataclass
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


#: A reference model trains on at least this many population units (a half of 2x as many).
MIN_POPULATION_HALF = 16


def population_design(*, population_units: Sequence[str], target_units: Sequence[str] | None = None,
                      num_models: int, seed: int) -> np.ndarray:
    """``keep [M, P + T]`` of reference models trained on random halves of a population, for a
    membership audit of ``T`` target texts (``dpaudit audit-model --train-references``).

    Columns ``0 .. P-1`` are the population rows, each unit in a random half of the models
    (:func:`inclusion_matrix`, ``p = 1/2``). ``target_units`` given (the *online* design of
    Carlini et al. 2022, arXiv 2112.03570): the target texts, members and non-members alike,
    are columns ``P .. P+T-1``, each unit in a random half too, so that every target text has
    "in" and "out" models and online LiRA can fit both; the draw never looks at the labels,
    which keeps a model that memorized nothing at chance. ``target_units`` None (the *offline*
    design): no reference sees a target text, every one is "out" for all of them (offline
    LiRA; RMIA, Zarifzadeh et al. 2024, arXiv 2312.03262). The two groups' unit ids are kept
    apart (one id in both names two units).

    Raises :class:`InputError` when the population has fewer than ``2 MIN_POPULATION_HALF``
    units (each model's half would be too small), or the online design has fewer than 2 models.
    """
    units = [f"population:{u}" for u in population_units]
    online = target_units is not None
    if isinstance(num_models, bool) or not isinstance(num_models, (int, np.integer)) or num_models < (2 if online else 1):
        raise InputError(f"--train-references must be at least {2 if online else 1}"
                         f"{' in the online design (each text needs an in and an out model)' if online else ''}, "
                         f"got {num_models!r}")
    count = len(set(units))
    if count < 2 * MIN_POPULATION_HALF:
        raise InputError(f"the population is too small for {num_models} reference models on random halves: it holds "
                         f"{count} unit(s), each model needs a half of at least {MIN_POPULATION_HALF} "
                         f"(at least {2 * MIN_POPULATION_HALF} units)")
    if online:
        units += [f"target:{u}" for u in target_units]
    return inclusion_matrix(unit_ids=units, num_models=int(num_models), seed=seed, keep_fraction=0.5)


def check_disjoint(population: Sequence[str], *, audited: Sequence[tuple[str, Sequence[str]]], origin: str) -> None:
    """:class:`InputError` when a population text is also an audited text (exact match, up to
    surrounding white space): reference models must know which texts they trained on.
    ``audited`` holds (name, texts) pairs, one per audited file."""
    pool: dict[str, int] = {}
    for i, t in enumerate(population):
        pool.setdefault(t.strip(), i)
    for name, texts in audited:
        shared = [pool[t.strip()] for t in texts if t.strip() in pool]
        if shared:
            raise InputError(f"{len(set(shared))} text(s) of the population {origin} are also in {name} (the first: "
                             f"population text {min(shared) + 1}): the population must be disjoint from the "
                             f"audited texts")


def heldout_losses(*, target, references: Sequence, keep: np.ndarray | None) -> list[dict[str, Any]]:
    """Per reference model ``j``: its held-out loss (mean token negative log-likelihood, in
    nats) on the texts it did not train on (``keep[j]`` False; ``keep`` None: all of them),
    and the target's on the same texts. ``target`` and ``references[j]`` are
    :class:`~dpaudit.signals.TokenSignals` of the same non-member texts. A reference much
    worse than the target is a poor stand-in for it (Carlini et al. 2022, arXiv 2112.03570,
    train reference models like the target)."""

    def loss(signals, rows: np.ndarray) -> float | None:
        tokens = float(signals.token_count()[rows].sum())
        return -float(signals.sum_logprob()[rows].sum()) / tokens if tokens else None

    out = []
    for j, ref in enumerate(references):
        rows = np.ones(target.n, bool) if keep is None else ~np.asarray(keep[j], bool)
        out.append({"reference": j, "texts": int(rows.sum()), "loss": loss(ref, rows),
                    "target_loss": loss(target, rows)})
    return out


@dataclass(frozen=True)
class ProbeTiming:
    """What a short training run measured: seconds per optimizer step, per evaluation, and
    the rest (building, loading and saving the model)."""

    step_s: float
    eval_s: float
    overhead_s: float

    @classmethod
    def from_log(cls, log: Sequence[dict], *, wall_s: float) -> ProbeTiming:
        """From the train log of a run of at least 3 steps (``elapsed_s`` per step; the first
        step carries the evaluation before training, the last the one after) and its wall time."""
        steps = [r for r in log if r.get("step", 0) >= 1 and r.get("elapsed_s") is not None]
        if len(steps) < 3:
            raise ValueError("a probe needs at least 3 logged steps")
        first, last = steps[0]["elapsed_s"], steps[-1]["elapsed_s"]
        step_s = (steps[-2]["elapsed_s"] - first) / (len(steps) - 2)
        eval_s = max(0.0, last - steps[-2]["elapsed_s"] - step_s)
        overhead_s = max(0.0, wall_s - last + first - step_s)  # with the first evaluation
        return cls(step_s=max(step_s, 0.0), eval_s=eval_s, overhead_s=overhead_s)

    def model_seconds(self, *, steps: int, eval_every: int) -> float:
        """One model of ``steps`` steps, evaluated every ``eval_every`` steps and at the end."""
        return self.overhead_s + steps * self.step_s + (steps // eval_every + 1) * self.eval_s


def cost_text(*, seconds: Sequence[float], workers: int, executor: str, smaller: int | None) -> str:
    """The line printed before a fleet trains: the estimated time of its models, and what a
    fleet of ``smaller`` models would take (None: no smaller fleet suggested)."""

    def minutes(s: float) -> str:
        return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"

    each = float(np.mean(seconds))
    parallel = workers if executor == "local" else 1  # a local pool runs `workers` at once
    where = {"local": f"{workers} local workers" if workers > 1 else "one after the other",
             "ray": "one after the other; Ray runs them side by side on a cluster"}[executor]
    text = (f"training {len(seconds)} reference model(s): about {minutes(each)} each, "
            f"{minutes(float(np.sum(seconds)) / parallel)} in all ({where})")
    if smaller is not None:
        text += f"; --train-references {smaller} would take about {minutes(smaller * each / parallel)}"
    return text


def model_seed(seed: int, index: int) -> int:
    """The training seed of fleet model ``index``: child ``index`` of
    ``SeedSequence(seed, spawn_key=(FLEET, 1)).spawn(...)``, the same whatever the fleet size."""
    return derive_seed(seed, _FLEET_SPAWN_KEY, 1, int(index))


def run_jobs(job: Job, *, fleet_dir: Path, todo: list[int], num_models: int, fleet: FleetConfig, trainer: str,
             progress: bool = True) -> None:
    """Run ``job(str(fleet_dir), j, threads)`` for every ``j`` in ``todo`` on
    ``fleet.executor`` (see :func:`dpaudit.stages.fleet.train_fleet` for the options)."""
    if fleet.executor == "ray":
        _run_ray(job, fleet_dir=fleet_dir, todo=todo, num_models=num_models, fleet=fleet, trainer=trainer,
                 progress=progress)
    else:
        run_local(job, directory=fleet_dir, todo=todo, total=num_models, workers=fleet.workers, progress=progress)


def _parent_log_file() -> str | None:
    """The log file this process writes to (the run's ``run.log``), for the workers to append to."""
    import logging

    return next((h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)), None)


def _init_worker(threads: int, log_path: str | None, parent: int) -> None:
    """A pool process: its threads, no bars of its own (they would interleave), progress
    lines on stderr and in the run's log. It leaves interrupts to ``parent`` (a Ctrl-C
    reaches the whole process group) and ends when ``parent`` ends."""
    import logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with(parent)

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


def _end_with(parent: int) -> None:
    """End this process within a tenth of a second of ``parent``'s end, even by SIGKILL: an
    orphaned worker would go on with the job it holds, then the queued ones, and write their
    models into a run directory that a resumed run is working in. A thread watches the
    parent's PID, which works on every platform (Linux's ``PR_SET_PDEATHSIG`` is Linux's alone)."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(1)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def _progress_bar(total: int, done: int, enabled: bool, desc: str = "fleet"):
    from dpaudit.progress import Progress

    return Progress(total=total, initial=done, desc=desc, unit="model", enabled=enabled)


def run_local(job: Job, *, directory: Path, todo: Sequence[Any], total: int, workers: int, desc: str = "fleet",
              progress: bool = True) -> None:
    """``job(str(directory), key)`` for every key of ``todo``: in this process when ``workers``
    is 1, else in a pool of ``workers`` spawned processes with ``cpu_count // workers`` torch
    threads each. The first job that raises stops the pool (the running ones finish) and
    its error is raised. An interrupt (``KeyboardInterrupt``) drops the queued jobs and ends
    the running ones at once, and the workers end with this process even when it is killed.
    ``total`` and ``desc``: the progress bar's."""
    workers = min(workers, len(todo))
    threads = max(1, (os.cpu_count() or 1) // workers)
    with _progress_bar(total, total - len(todo), progress, desc) as bar:
        if workers == 1:
            # in-process: simpler to debug; torch's thread count is left as the caller set it
            for key in todo:
                job(str(directory), key)
                bar.update(1)
            return
        import multiprocessing
        from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

        context = multiprocessing.get_context("spawn")  # spawn copies sys.path to the children
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                 initargs=(threads, _parent_log_file(), os.getpid())) as pool:
            try:
                pending = {pool.submit(job, str(directory), key): key for key in todo}
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
            except BaseException:  # interrupted: drop the queued jobs and end the running ones now
                _stop(pool)
                raise
        if failure is not None:
            raise failure.exception()


def _stop(pool) -> None:
    """Cancel ``pool``'s queued jobs and end its processes (a job's files are written whole or
    not at all, so a resumed run redoes the jobs cut short). ``_processes`` is the executor's
    own: Python 3.14's ``terminate_workers`` is its public form."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join()


def _run_ray(job: Job, *, fleet_dir: Path, todo: list[int], num_models: int, fleet: FleetConfig, trainer: str,
             progress: bool):
    address = fleet.address
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
            num_cpus = max(1, (os.cpu_count() or 1) // fleet.workers) if started_here and not address else 1
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
