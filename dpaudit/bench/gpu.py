"""``dpaudit bench --suite gpu``: the GPU check, one JSON file (issue 31).

The one command on a machine with a GPU, from the repository root (``benchmarks/gpu_check.sh``
runs exactly this, writing to ``$OUT/gpu_check.json`` when ``OUT`` is set; a lent machine
lacks some of dpaudit's dependencies, and ``benchmarks/README.md`` lists the wheels to carry)::

    PYTHONUNBUFFERED=1 dpaudit bench --suite gpu --size gpt2 --out gpu_check.json

On one NVIDIA H200 it should take 4-6 minutes and must not take 8: rows start only while the
budget of :data:`BUDGET_S` seconds (counted from the suite's start) lasts, a row that would
start later is null with the reason ``skipped: ...``, a row of interleaved rounds stops after
the round in which the budget ran out, and the validate row starts only with
:data:`~dpaudit.bench.rows.VALIDATE_NEED_S` seconds left; so it overruns the budget by about
one round of one row. A row that fails (a package missing, memory) is null with its error as
the reason, and the other rows go on. On a CPU, ``--size tiny --batch 2 --rounds 1`` rehearses
every code path in about 10 s, but for the two rows that spawn fresh processes there (peak
memory and validate).

The JSON object (``schema_version`` 1), its figures in the order measured, so that what comes
first survives a short budget:

- ``suite``, ``model``, ``device``, ``precision``, ``clock``, ``batch_size``, ``length``: what
  ran; ``hardware``: the GPU's name and memory, the torch, CUDA and Triton versions, the date (UTC);
  ``manifest``: package versions, git commit and platform (:func:`dpaudit.stages.artifacts.manifest`);
- ``secure_noise_share``: the time to add one step's Gaussian noise with the secure generator
  (``SecureGenerator(device).add_noise_all_`` on the float32 sums of every trainable
  parameter, views of one buffer as the engines make them, after a warm-up draw) over the
  time of one DP step in secure mode, which includes that draw; ``details.secure_noise_s``:
  the draw's median seconds; ``details.secure_noise_path``: the code that drew it (the fused
  Triton kernel on CUDA, with its keystream checked against the CPU's, else torch operations),
  and with the kernel ``details.secure_noise_s_torch_path``, the same draw by torch operations;
- ``nonprivate_tokens_per_s``, ``dp_tokens_per_s`` (secure mode, the default of DP training)
  and ``dp_tokens_per_s_reproducible`` (noise from a seeded torch generator on the device):
  tokens per second of :data:`STEPS` steps, after a warm-up step, of the non-private engine and
  of our DP-SGD engine (``train.dp.engine: auto``) with AdamW, each step ``batch`` sequences of
  :func:`throughput_length` tokens (16 x 512 on ``gpt2``) in micro-batches of at most 16;
- ``nonprivate_peak_gpu_bytes``, ``dp_peak_gpu_bytes``: ``torch.cuda.max_memory_allocated``
  over those steps (weights, gradients, AdamW's state, activations); null on a CPU;
- ``bench``: the default suite's result (:func:`~dpaudit.bench.rows.run_bench`, the same
  keys as ``dpaudit bench --json``), under the same budget;
- ``reasons`` (why a figure above is null), ``details`` (with ``host_waits_per_step``: how
  often one step of each training run makes the host wait for the GPU, :func:`host_waits`),
  ``budget`` (seconds, spent, rows skipped, rows cut short) and ``wall_s``.

The clock is the wall time on CUDA (synchronized) and the process's CPU time on a CPU.
"""

from __future__ import annotations

import os
import statistics
import sys
import warnings
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from dpaudit.bench import workload
from dpaudit.bench.engines import engine_factories
from dpaudit.bench.rows import run_bench
from dpaudit.bench.timing import Budget, clock, run_row, set_threads, sync, timed, training_steps
from dpaudit.devices import resolve_device
from dpaudit.errors import InputError
from dpaudit.progress import Progress
from dpaudit.stages.artifacts import manifest

BUDGET_S = 360.0  # 6 minutes of rows: with start-up and the last round, within the 8 of a lent H200
STEPS = 3  # timed training steps per engine, after one warm-up step
NOISE_DRAWS = 3
LENGTH = 512
MEASURED = ("secure_noise_share", "nonprivate_tokens_per_s", "dp_tokens_per_s", "dp_tokens_per_s_reproducible",
            "nonprivate_peak_gpu_bytes", "dp_peak_gpu_bytes")
SCHEMA_VERSION = 1
GPU_KEYS = ("schema_version", "suite", "hardware", "manifest", "model", "device", "precision", "clock", "batch_size",
            "length", *MEASURED, "bench", "reasons", "details", "budget", "wall_s")
# the training runs, timed in this order: (name, engine, secure noise, throughput key, peak memory key)
RUNS = (("nonprivate", "nonprivate", False, "nonprivate_tokens_per_s", "nonprivate_peak_gpu_bytes"),
        ("dp", "dpsgd", True, "dp_tokens_per_s", "dp_peak_gpu_bytes"),
        ("dp_reproducible", "dpsgd", False, "dp_tokens_per_s_reproducible", None))
# on a CPU, where the suite rehearses the GPU's code paths, the rows that spawn fresh processes
ON_CPU_NOT_MEASURED = "not measured by the gpu suite on a CPU (fresh processes); the default suite measures it"
CPU_SKIPS = {"dp_memory_over_nonprivate": ON_CPU_NOT_MEASURED, "validate_over_training": ON_CPU_NOT_MEASURED}


def throughput_length(size: str) -> int:
    """Tokens per sequence of the throughput steps: :data:`LENGTH`, or the model's context
    where that is shorter (``tiny`` and ``small``)."""
    from dpaudit.models import SIZES

    return min(LENGTH, SIZES[size]["n_positions"])


def run_gpu_check(*, size: str = "gpt2", batch: int = 16, rounds: int = 5, repeats: int = 3, device: str = "auto",
                  threads: int = 1, budget_s: float = BUDGET_S) -> dict[str, Any]:
    """Measure the GPU check (see the module docstring) within ``budget_s`` seconds and return
    its JSON object; ``rounds`` and ``repeats`` are the default suite's."""
    if batch < 1 or rounds < 1 or repeats < 1:
        raise InputError("--batch, --rounds and --repeats must be positive")
    workload.check_size(size)
    dev = resolve_device(device, what="--device")
    set_threads(dev, threads=threads)
    budget = Budget(budget_s)
    cuda = dev.type == "cuda"
    result: dict[str, Any] = {key: None for key in GPU_KEYS}
    result.update(schema_version=SCHEMA_VERSION, suite="gpu", hardware=hardware(dev),
                  manifest=manifest(seeds={"model": 0, "tokens": 1}), model=f"gpt2-{size}", device=str(dev),
                  precision="bf16 autocast" if cuda else "fp32", clock="wall time" if cuda else "process CPU time",
                  batch_size=batch, length=throughput_length(size))
    reasons: dict[str, str] = {}
    details: dict[str, Any] = {"steps": STEPS, "noise_draws": NOISE_DRAWS, "seconds_per_step": {},
                               "peak_gpu_bytes": {}, "host_waits_per_step": {}}
    _training_rows(result, reasons, details, size=size, device=dev, budget=budget)
    bench = run_bench(size=size, batch=batch, rounds=rounds, repeats=repeats, device=str(dev), threads=threads,
                      skip={} if cuda else CPU_SKIPS, budget=budget, keep_going=True)
    result.update(bench=bench, reasons=reasons, details=details, budget=budget.record(), wall_s=budget.spent())
    return result


def _training_rows(result: dict[str, Any], reasons: dict[str, str], details: dict[str, Any], *, size: str,
                   device: torch.device, budget: Budget) -> None:
    """The secure noise draw, then the training runs of :data:`RUNS`, then the noise share."""
    factories, _ = engine_factories(opacus=False)
    model = workload.build_model(size).to(device)
    units = workload.random_units(result["batch_size"], length=result["length"])
    tokens = result["batch_size"] * result["length"]
    bar = Progress(total=1 + len(RUNS), desc="gpu check")

    def noise() -> None:
        details["secure_noise_s"] = statistics.median(secure_noise_seconds(model, device=device, draws=NOISE_DRAWS))
        details["secure_noise_path"] = secure_noise_path(device)
        if details["secure_noise_path"]["path"] == "triton":  # the torch operations' draw, for comparison
            details["secure_noise_s_torch_path"] = statistics.median(
                secure_noise_seconds(model, device=device, draws=NOISE_DRAWS, fused=False))
        bar.update(1)

    def training(name: str, engine: str, secure: bool, throughput: str, memory: str | None) -> None:
        seconds, peak, waits = _training_steps(factories[engine], model, units, device=device,
                                               private=engine != "nonprivate", secure=secure)
        if waits is not None:
            details["host_waits_per_step"][name] = waits
        details["seconds_per_step"][name] = seconds
        details["peak_gpu_bytes"][name] = peak
        result[throughput] = tokens / seconds
        if memory is not None:
            result[memory] = peak
            if peak is None:
                reasons[memory] = "not measured: no CUDA device"
        bar.update(1)

    try:
        run_row(noise, name="secure_noise", keys=("secure_noise_share",), result=result, reasons=reasons,
                budget=budget, keep_going=True)
        for name, *run in RUNS:
            keys = tuple(key for key in run[2:] if key is not None)
            run_row(lambda: training(name, *run), name=name, keys=keys, result=result, reasons=reasons,
                    budget=budget, keep_going=True)
    finally:
        bar.close()
    step = details["seconds_per_step"].get("dp")
    if "secure_noise_s" in details and step:
        result["secure_noise_share"] = details["secure_noise_s"] / step
    else:
        reasons.setdefault("secure_noise_share", reasons.get("dp_tokens_per_s", "not measured"))


def _training_steps(factory, model, units, *, device: torch.device, private: bool,
                    secure: bool) -> tuple[float, int | None, int | None]:
    """Median seconds per training step (:data:`STEPS` after a warm-up) and, on CUDA, the peak
    bytes allocated over them and :func:`host_waits` of one more step. The weights are not
    restored: a copy would count in the peak."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    batch = len(units)
    with training_steps(factory, model, units, batch=batch, microbatch=min(batch, workload.MICROBATCH),
                        device=device, private=private, autocast_dtype=torch.bfloat16 if cuda else None,
                        secure=secure, restore=False) as step:
        times = timed(step, steps=STEPS, device=device)
        peak = torch.cuda.max_memory_allocated(device) if cuda else None
        waits = host_waits(step) if cuda else None
    return statistics.median(times), peak, waits


def host_waits(step) -> int:
    """How many times one training ``step`` (:func:`~dpaudit.bench.timing.training_steps`)
    makes the host wait for the GPU: the synchronizing CUDA calls that
    ``torch.cuda.set_sync_debug_mode`` reports. The engines read nothing back within a step
    (tests/train/test_step_waits.py); the model's own forward may (SDPA's mask code reads the mask)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(1 for w in caught if "synchronizing" in str(w.message))


def secure_noise_seconds(model, *, device: torch.device, draws: int, fused: bool = True) -> list[float]:
    """Seconds of each of ``draws`` draws of one step's noise from the secure generator, after
    a warm-up draw: :meth:`~dpaudit.train.sampling.SecureGenerator.add_noise_all_` on the
    float32 sums of every trainable parameter on ``device`` (views of one buffer, as the
    engines' :func:`~dpaudit.train.engine.zero_sums`), as secure mode's step does; ``fused``
    False keeps a CUDA device's draws off the Triton kernel."""
    from dpaudit.train.engine import trainable_parameters, zero_sums
    from dpaudit.train.sampling import SecureGenerator

    generator = SecureGenerator(device, fused=fused)
    sums = list(zero_sums(trainable_parameters(model)).values())
    now = clock(device)
    times = []
    generator.add_noise_all_(sums, std=1.0)  # warm-up: torch.compile builds the kernels on first use
    for _ in range(draws):
        generator.next_step()
        sync(device)
        start = now()
        generator.add_noise_all_(sums, std=1.0)
        sync(device)
        times.append(now() - start)
    return times


def secure_noise_path(device: torch.device) -> dict[str, Any]:
    """Which code drew the secure noise on ``device``: the fused Triton kernel
    (:mod:`~dpaudit.train.chacha_triton`), with whether its keystream equals the block function
    run by torch on the CPU (4,096 blocks across the counter's sign bit, under a fresh key; that
    reference is tested against RFC 8439 and OpenSSL, and needs no ``cryptography``, which a lent
    machine may lack), or the torch operations, with the kernel's error if it failed."""
    from dpaudit.train import chacha, sampling

    fused = sampling.fused_kernel(device)
    if fused is None:
        failed = getattr(sys.modules.get("dpaudit.train.chacha_triton"), "FAILED", None)
        return {"path": "torch", "triton_error": failed[0] if failed else None}
    key, nonce, first = os.urandom(32), (1, 2, 3), 2**31 - 64
    words = fused.words(chacha.key_tensor(key, device), nonce, first=first, blocks=4096).cpu()
    reference = chacha.TorchStream(chacha.key_tensor(key), nonce, first).read(4096)
    return {"path": "triton", "words_equal_reference": torch.equal(words, reference)}


def hardware(device: torch.device) -> dict[str, Any]:
    """The GPU (name, memory), the torch, CUDA and Triton versions (Triton's compiles the secure
    noise's kernel; None where it is not installed), and the date (UTC)."""
    cuda = device.type == "cuda"
    try:
        triton = version("triton")
    except PackageNotFoundError:
        triton = None
    return {"gpu": torch.cuda.get_device_name(device) if cuda else None,
            "gpu_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}

