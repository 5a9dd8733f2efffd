"""The run's models side by side: with ``fleet.workers`` above 1, the models whose trainer can
run in another process (:func:`dpaudit.plugins.reruns`; a user's own loop cannot) and the
local fleet's missing reference models train in one pool of that many local processes, each
with ``cpu_count // workers`` torch threads (:func:`dpaudit.fleet.run_local`), so that no
worker idles between the two. On 2 cores, two one-thread trainings of the demo's model do
about 1.4 times the work of one two-thread training. The train stage then trains the rest
in this process, and the fleet stage finds its models in place.
"""

from __future__ import annotations

from dpaudit.config import Config
from dpaudit.fleet import run_local
from dpaudit.plugins import reruns
from dpaudit.rundir import RunDir
from dpaudit.stages.fleet import open_reference_fleet, run_job
from dpaudit.stages.prepare import PreparedData, derive_seeds, load_prepared
from dpaudit.stages.train import train_or_record


def train_side_by_side(rundir: RunDir, config: Config, data: PreparedData, *, fleet: bool) -> list[str]:
    """Train the run's missing models (and, with ``fleet``, the local fleet's) in one pool when
    ``fleet.workers`` is above 1 and there is more than one job; the names of the models it
    trained (a model that fails has its ``error.json``, as in this process)."""
    if config.fleet.workers < 2:
        return []
    names = [n for n in config.model_names()
             if not rundir.model(n).is_trained() and reruns(config.for_model(n).train.trainer)]
    jobs: list[tuple[str, str | int]] = [("model", n) for n in names]
    if fleet and config.fleet.executor == "local" and jobs:
        jobs += [("fleet", j) for j in open_reference_fleet(rundir, config, data)]
    if len(jobs) < 2:
        return []
    run_local(_job, directory=rundir.root, todo=jobs, total=len(jobs), workers=config.fleet.workers, desc="models")
    return names


def _job(root: str, job: tuple[str, str | int]) -> None:
    """One job of the pool, everything read back from the run directory: model ``name``, or
    reference model ``index`` (:func:`dpaudit.stages.fleet.run_job`)."""
    kind, key = job
    rundir = RunDir(root)
    if kind == "fleet":
        run_job(str(rundir.fleet_dir), int(key))
        return
    config = rundir.read_config()
    seeds = derive_seeds(config.seed)
    train_or_record(rundir, config, str(key), load_prepared(rundir, config, seeds), seed=seeds["train"])
