"""The local pool and the Ray executor when the run's process is stopped: SIGKILL, SIGINT to
the process alone, or Ctrl-C (SIGINT to the whole process group). In each case no worker
outlives it, and no job runs on (the one it holds or a queued one) to write into the directory
that a resumed run would use. Before the fix, a SIGKILLed parent's pool workers went on with
their jobs and then the queued ones, and a SIGINT waited for every queued job. On Ray, Ray
itself ends a killed driver's tasks (its owner fate-sharing); the test holds it to that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_interrupt import sigint_by_default

HERE = Path(__file__).resolve().parent
JOB_SECONDS = 2.0  # each job's length: long enough to be cut short, short enough to outwait


def sleepy_job(directory: str, key: int) -> None:
    """Marks its start (with its PID), sleeps, marks its end."""
    (Path(directory) / f"started-{key}").write_text(str(os.getpid()))
    time.sleep(JOB_SECONDS)
    (Path(directory) / f"done-{key}").write_text(str(os.getpid()))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


HOW = pytest.mark.parametrize(("how", "group"), [(signal.SIGKILL, False), (signal.SIGINT, False), (signal.SIGINT, True)],
                              ids=["sigkill", "sigint", "ctrl-c"])


@HOW
def test_no_pool_worker_outlives_a_stopped_parent(tmp_path, how, group):
    script = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]; from pathlib import Path; "
              "from dpaudit.fleet import run_local; from test_pool_interrupt import sleepy_job; "
              f"run_local(sleepy_job, directory=Path({str(tmp_path)!r}), todo=[0, 1, 2, 3], total=4, workers=2, "
              "progress=False)")
    stop_and_check(script, tmp_path, how=how, group=group, job_seconds=JOB_SECONDS, exit_within=JOB_SECONDS / 2)


@pytest.mark.slow
@HOW
def test_no_ray_task_outlives_a_stopped_driver(tmp_path, how, group):
    """The driver starts its own Ray instance, as ``fleet.executor: ray`` without an address
    does; the job is defined in the driver's ``__main__``, which Ray ships by value."""
    pytest.importorskip("ray")
    seconds = 10.0  # Ray's start and its shutdown on SIGINT (2 s alone) take seconds
    script = ("import os, time; from pathlib import Path; from dpaudit.config import FleetConfig; "
              "from dpaudit.fleet import run_jobs\n"
              "def job(directory, key, threads):\n"
              "    (Path(directory) / f'started-{key}').write_text(str(os.getpid()))\n"
              f"    time.sleep({seconds})\n"
              "    (Path(directory) / f'done-{key}').write_text(str(os.getpid()))\n"
              f"run_jobs(job, fleet_dir=Path({str(tmp_path)!r}), todo=[0, 1, 2, 3], num_models=4, "
              "fleet=FleetConfig(executor='ray', workers=2), trainer='dpaudit.train:nonprivate', progress=False)")
    stop_and_check(script, tmp_path, how=how, group=group, job_seconds=seconds, exit_within=0.8 * seconds)


def stop_and_check(script: str, tmp_path: Path, *, how: signal.Signals, group: bool, job_seconds: float,
                   exit_within: float) -> None:
    """Run ``script`` (it runs four jobs of ``job_seconds`` two at a time in ``tmp_path``), stop
    it with ``how`` once two have started, then check that it exited within ``exit_within``
    seconds, its workers are gone, and no job finished or started after."""
    def started() -> list[int]:  # a job's mark exists a moment before its PID is in it
        return [int(text) for f in tmp_path.glob("started-*") if (text := f.read_text())]

    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, preexec_fn=sigint_by_default,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(started()) < 2 and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = started()
    assert parent.poll() is None and len(workers) == 2, parent.stderr.read()
    sent = time.monotonic()
    if group:
        os.killpg(parent.pid, how)
    else:
        parent.send_signal(how)
    parent.wait(timeout=30)
    assert time.monotonic() - sent < exit_within  # no wait for a job to finish
    while any(alive(pid) for pid in workers) and time.monotonic() < sent + 10:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers)
    time.sleep(max(0.0, sent + 1.5 * job_seconds - time.monotonic()))  # an orphan would have written by now
    assert sorted(f.name for f in tmp_path.iterdir()) == ["started-0", "started-1"]
