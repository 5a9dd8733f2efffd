"""dpaudit.allocator: glibc's thresholds set in the process and passed to its children, a
user's own setting kept, and a DP step that no longer takes page faults once warm."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from dpaudit.allocator import SETTINGS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc only")


def run(code: str, **env: str) -> dict:
    """``code`` in a fresh interpreter without glibc's malloc variables but ``env``; its last line as JSON."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**clean, **env}, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


CHILD_SEES = """
    import json, os, subprocess, sys
    from dpaudit.allocator import keep_freed_memory
    done = keep_freed_memory()
    child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps({k: v for k, v in "
                            "os.environ.items() if k.startswith('MALLOC_')}))"], capture_output=True, text=True)
    print(json.dumps({"done": done, "child": json.loads(child.stdout)}))
"""


def test_both_thresholds_are_set_here_and_in_the_children():
    out = run(CHILD_SEES)
    assert out["done"] == {"MALLOC_TRIM_THRESHOLD_": 2**31 - 1, "MALLOC_MMAP_THRESHOLD_": 32 * 2**20}
    assert out["child"] == {k: str(v) for k, v in out["done"].items()}


def test_a_users_own_setting_wins():
    out = run(CHILD_SEES, MALLOC_TRIM_THRESHOLD_="123456")
    assert out["done"] == {"MALLOC_MMAP_THRESHOLD_": 32 * 2**20}
    assert out["child"] == {"MALLOC_TRIM_THRESHOLD_": "123456", "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}
    assert run(CHILD_SEES, GLIBC_TUNABLES="glibc.malloc.trim_threshold=123456")["done"] == {}


def test_the_command_sets_them_and_a_call_of_main_does_not():
    command = """
        import json, os, sys
        from dpaudit.cli import main
        sys.argv = ["dpaudit", "accountant", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10",
                    "--delta", "1e-5", "--json"]
        main({argv})
        print(json.dumps({{k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}))
    """
    assert run(command.format(argv="")) == {k: str(v) for k, (_, v) in SETTINGS.items()}
    assert run(command.format(argv="sys.argv[1:]")) == {}


FAULTS = """
    import json, resource
    import torch
    from dpaudit.allocator import keep_freed_memory
    from dpaudit.bench import workload
    from dpaudit.bench.engines import engine_factories, make_engine

    keep_freed_memory()
    torch.set_num_threads(1)
    factories, _ = engine_factories(opacus=False)
    engine = make_engine(factories["dpsgd"], workload.build_model("tiny"), batch=16, microbatch=16,
                         device=torch.device("cpu"), private=True)
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-5)
    units, generator = workload.random_units(16), torch.Generator().manual_seed(0)

    def step():
        engine.step(units, generator)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(8):
        step()
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"faults": faults}))
"""


def test_a_warm_dp_step_takes_no_page_faults():
    """The median step's minor page faults once warm: without keep_freed_memory 4,000-12,000
    (glibc 2.36, 2026-12-05, 4 runs of 8 steps); with it 0 or 1, a step now and then taking
    a few thousand while the heap grows."""
    faults = sorted(run(FAULTS)["faults"])
    assert faults[len(faults) // 2] < 100, faults
