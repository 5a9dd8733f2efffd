"""The local pool when its parent is stopped: SIGKILL, SIGINT to the parent alone, or Ctrl-C
(SIGINT to the whole process group). In each case no worker outlives the parent, and no job
runs on (the one it holds or a queued one) to write into the directory that a resumed run
would use. Before the fix, a SIGKILLed parent's workers went on with their jobs and then the
queued ones, and a SIGINT waited for every queued job."""

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


@pytest.mark.parametrize(("how", "group"), [(signal.SIGKILL, False), (signal.SIGINT, False), (signal.SIGINT, True)],
                         ids=["sigkill", "sigint", "ctrl-c"])
def test_no_pool_worker_outlives_a_stopped_parent(tmp_path, how, group):
    script = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]; from pathlib import Path; "
              "from dpaudit.fleet import run_local; from test_pool_interrupt import sleepy_job; "
              f"run_local(sleepy_job, directory=Path({str(tmp_path)!r}), todo=[0, 1, 2, 3], total=4, workers=2, "
              "progress=False)")
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, preexec_fn=sigint_by_default,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("started-*"))) < 2 and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert parent.poll() is None and len(list(tmp_path.glob("started-*"))) == 2, parent.stderr.read()
    workers = [int(f.read_text()) for f in tmp_path.glob("started-*")]
    sent = time.monotonic()
    if group:
        os.killpg(parent.pid, how)
    else:
        parent.send_signal(how)
    parent.wait(timeout=30)
    assert time.monotonic() - sent < JOB_SECONDS / 2  # no wait for a job to finish
    while any(alive(pid) for pid in workers) and time.monotonic() < sent + 10:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers)
    time.sleep(max(0.0, sent + 1.5 * JOB_SECONDS - time.monotonic()))  # an orphan would have written by now
    assert sorted(f.name for f in tmp_path.iterdir()) == ["started-0", "started-1"]
