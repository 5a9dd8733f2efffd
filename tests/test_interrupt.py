"""Interruption: `dpaudit run --config tiny` stopped with SIGINT or SIGKILL at four points
in turn (each rerun of the same command resumes the last and is stopped at the next), then
run to its end, gives the report of an uninterrupted run, in every number (the tiny preset
trains in reproducible mode). SIGINT exits within a few seconds with a line that says how
to resume. About two tiny runs of work: minutes, so slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_pipeline import numbers  # every number of a report, timestamps left out

pytestmark = pytest.mark.slow

# one thread everywhere: CPU training is bit-for-bit repeatable at a given thread count
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def command(out):
    return [sys.executable, "-m", "dpaudit", "run", "--config", "tiny", "--out", str(out)]


def sigint_by_default() -> None:
    """For ``preexec_fn``: the run gets SIGINT's default action, so that its Python raises
    KeyboardInterrupt. A test run in a background job of a non-interactive shell (a CI
    script's ``cmd &``) starts with SIGINT ignored (POSIX), a child inherits that, and a
    Python started so ignores SIGINT too: the run would go on to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_to_the_end(out):
    done = subprocess.run(command(out), env=ENV, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode in (0, 3), done.stderr  # the tiny DP models learn too little for a conclusive audit
    return json.loads((out / "report.json").read_text())


def interrupt(out, *, when: str, how: signal.Signals) -> tuple[subprocess.CompletedProcess, float]:
    """Start (or resume) the run, wait until ``out/when`` exists, send ``how``; the process's
    outcome and the seconds it took to exit."""
    proc = subprocess.Popen(command(out), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_by_default)
    deadline = time.monotonic() + 1200
    while not (out / when).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before {when} appeared"
    sent = time.monotonic()
    proc.send_signal(how)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), time.monotonic() - sent


# each point: the file whose appearance triggers the signal, and what is running then
POINTS = [
    (signal.SIGINT, "data/canaries.json"),  # the base model is training
    (signal.SIGKILL, "models/nonprivate/model/config.json"),  # the first DP-SGD model is training
    (signal.SIGINT, "models/dp-eps2/model/config.json"),  # the last model is training
    (signal.SIGKILL, "models/dp-eps8/model/config.json"),  # the attacks are running
]


def test_a_run_interrupted_again_and_again_ends_with_the_uninterrupted_report(own_tmp):
    reference = run_to_the_end(own_tmp / "uninterrupted")
    out = own_tmp / "run"
    kept = {}
    for how, when in POINTS:  # each rerun resumes the last one, then is stopped at the next point
        done, elapsed = interrupt(out, when=when, how=how)
        assert not (out / "report.json").exists(), (how, when, done.returncode, done.stderr[-2000:])
        if how == signal.SIGINT:
            assert done.returncode == 130 and elapsed < 10, (done.returncode, elapsed, done.stderr[-2000:])
            assert f"rerun the same command with --out {out} to resume" in done.stderr.splitlines()[-1]
            assert "Traceback" not in done.stderr
        else:
            assert done.returncode == -signal.SIGKILL
        for path, content in kept.items():  # what was finished before is kept, not redone
            assert (out / path).read_bytes() == content, path
        kept[when] = (out / when).read_bytes()
    assert numbers(run_to_the_end(out)) == numbers(reference)
    for path, content in kept.items():
        assert (out / path).read_bytes() == content, path
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.partial-*"))
