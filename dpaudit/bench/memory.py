"""Peak memory of one engine step: ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the
peak resident memory of a fresh subprocess per engine, above its resident memory before the
step."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from dpaudit.allocator import SETTINGS
from dpaudit.bench.engines import engine_factories, make_engine
from dpaudit.bench.workload import build_model, random_units


def peak_step_memory(name: str, *, size: str, batch: int, device: torch.device) -> int:
    """Peak memory of one step of engine ``name`` (after a warm-up step) above the memory
    before it, in bytes."""
    if device.type == "cuda":
        return memory_worker(name, size=size, batch=batch, device=device)
    if not Path("/proc/self/clear_refs").exists():
        raise OSError("peak memory on CPU needs Linux /proc")
    # a fresh process per engine, with a fixed mmap threshold so freed tensors leave the resident set
    # (and glibc's trim threshold as it would be, not the command line's, dpaudit.allocator)
    env = {**{k: v for k, v in os.environ.items() if k not in SETTINGS},
           "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    code = (f"import json, torch; torch.set_num_threads({torch.get_num_threads()}); from dpaudit.bench.memory import "
            f"memory_worker; print(json.dumps(memory_worker({name!r}, size={size!r}, batch={batch}, "
            f"device=torch.device('cpu'))))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
    return int(json.loads(out.stdout.strip().splitlines()[-1]))


def memory_worker(name: str, *, size: str, batch: int, device: torch.device) -> int:
    """In this process: the peak bytes of one step of engine ``name`` over the bytes before it
    (CPU: the resident set, whose peak it resets; run it in a fresh process)."""
    factories, _ = engine_factories(opacus=name.startswith("opacus"))
    model = build_model(size).to(device)
    units = random_units(batch)
    autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
    engine = make_engine(factories[name], model, batch=batch, microbatch=batch, device=device,
                         private=name != "nonprivate", autocast_dtype=autocast_dtype)
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-5)
    generator = torch.Generator(device=device).manual_seed(0)

    def step():
        engine.step(units, generator)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: optimizer state, lazy set-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM)
        before = _rss("VmRSS")
        step()
        peak = _rss("VmHWM") - before
    engine.close()
    return peak


def _rss(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024
