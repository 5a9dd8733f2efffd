"""The Opacus adapters against the oldest Opacus the project supports (``opacus>=1.5.3`` in
pyproject.toml; the newest is the installed one): ``test_adapters_opacus.py`` runs again in a
subprocess whose ``PYTHONPATH`` starts with a ``pip install --no-deps --target`` of it, which
``.ci/run`` makes in ``.ci/opacus-oldest`` (``DPAUDIT_OPACUS_OLDEST`` names another directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

OLDEST = "1.5.3"
ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("DPAUDIT_OPACUS_OLDEST", ROOT / ".ci" / "opacus-oldest"))


def test_the_floor_is_the_oldest_tested_release():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"opacus>={OLDEST}" in extras["opacus"] and f"opacus>={OLDEST}" in extras["dev"]


@pytest.mark.slow
def test_adapters_on_the_oldest_opacus():
    """The quick (not individually slow) adapter tests under Opacus 1.5.3: about 80 s alone (1.6.0's run of
    them on this project's 2-core machine), 5 minutes under load; the step validator's tests
    run every canary."""
    if not (TARGET / "opacus" / "version.py").is_file():
        pytest.skip(f"Opacus {OLDEST} is not installed in {TARGET} (.ci/run does it: "
                    f"pip install --no-deps --target {TARGET} opacus=={OLDEST})")
    env = {**os.environ, "DPAUDIT_ADAPTERS_QUICK": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(TARGET), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    test = Path(__file__).with_name("test_adapters_opacus.py")
    args = [str(test), "-q", "-p", "no:cacheprovider", "-m", "not slow", "-W", "ignore"]
    script = (f"import opacus, sys; assert opacus.__version__ == {OLDEST!r}, opacus.__version__; import pytest; "
              f"sys.exit(pytest.main({args!r}))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
