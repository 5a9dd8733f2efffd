"""The default suite: every row of ``dpaudit bench`` (the table in :mod:`dpaudit.bench`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dpaudit.bench import audit_cost, workload
from dpaudit.bench.engines import engine_factories
from dpaudit.bench.memory import peak_step_memory
from dpaudit.bench.timing import Budget, interleaved, medians, paired_ratio, run_row, set_threads, time_steps
from dpaudit.devices import resolve_device
from dpaudit.errors import InputError
from dpaudit.progress import Progress

KEYS = ("dp_step_over_nonprivate", "dp_step_over_nonprivate_b256", "dp_memory_over_nonprivate", "dp_step_over_opacus",
        "dp_step_over_opacus_ghost", "signals_over_forward", "validate_over_training", "model", "batch_size", "threads")
VALIDATE_NEED_S = 90.0  # a budget starts the validate row only with this much left: two fresh dpaudit processes


@dataclass
class BenchRun:
    """One run of the suite: its settings, and the result, reasons and details filled in row by row."""

    size: str
    batch: int
    rounds: int
    repeats: int
    device: torch.device
    autocast_dtype: torch.dtype | None
    factories: dict[str, Callable]
    errors: dict[str, str]
    bar: Progress
    budget: Budget | None
    result: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def steps(self, name: str, model, units, *, batch: int, microbatch: int, private: bool, steps: int) -> list[float]:
        """Seconds per step of engine ``name`` on ``model`` (:func:`~dpaudit.bench.timing.time_steps`)."""
        return time_steps(self.factories[name], model, units, batch=batch, microbatch=microbatch, device=self.device,
                          private=private, steps=steps, autocast_dtype=self.autocast_dtype)

    def interleaved(self, names: list[str], run: Callable[[str], list[float]]) -> dict[str, list[float]]:
        return interleaved(names, run, rounds=self.rounds, bar=self.bar, errors=self.errors, budget=self.budget)

    def ratio(self, key: str, value: float | None, reason: Callable[[], str]) -> None:
        """``result[key] = value``, and when it is None, ``reasons[key]`` from ``reason()``."""
        self.result[key] = value
        if value is None:
            self.reasons[key] = reason()


def run_bench(*, size: str = "small", batch: int = 16, rounds: int = 5, repeats: int = 3, device: str = "auto",
              threads: int = 1, opacus: bool = True, validate: bool = True, skip: dict[str, str] | None = None,
              budget: Budget | None = None, keep_going: bool = False) -> dict[str, Any]:
    """Measure every row (see :mod:`dpaudit.bench`) and return the ``--json`` object. A row
    whose keys are all in ``skip`` is not measured, ``skip`` giving the reasons. With
    ``budget``, a row starts only while the budget lasts (else it is null, the reason saying
    so) and a row of rounds stops after the round in which it ran out; with ``keep_going``, a
    row that fails is null with its error as the reason, and the other rows go on."""
    if batch < 1 or rounds < 1 or repeats < 1:
        raise InputError("--batch, --rounds and --repeats must be positive")
    workload.check_size(size)
    dev = resolve_device(device, what="--device")
    set_threads(dev, threads=threads)
    autocast_dtype = torch.bfloat16 if dev.type == "cuda" else None
    factories, missing = engine_factories(opacus=opacus)
    main_names = [n for n in ("nonprivate", "dpsgd", "dpsgd_vmap", "opacus") if n in factories]
    total = rounds * (len(main_names) + 4) + 4 + rounds + (1 if validate else 0)
    run = BenchRun(size=size, batch=batch, rounds=rounds, repeats=repeats, device=dev, autocast_dtype=autocast_dtype,
                   factories=factories, errors=dict(missing), bar=Progress(total=total, desc="bench"), budget=budget)
    run.result = {key: None for key in KEYS}
    run.result.update(model=f"gpt2-{size}", batch_size=batch, threads=torch.get_num_threads(), device=str(dev),
                      precision="bf16 autocast" if autocast_dtype else "fp32",
                      clock="process CPU time" if dev.type == "cpu" else "wall time")
    run.details.update(length=workload.LENGTH, vocab=workload.vocabulary(size), rounds=rounds, repeats=repeats)
    model = workload.build_model(size).to(dev)
    rows = [("steps", ("dp_step_over_nonprivate", "dp_step_over_opacus"), 0.0,
             lambda: _step_rows(run, model, main_names)),
            ("ghost", ("dp_step_over_opacus_ghost",), 0.0, lambda: _ghost_row(run)),
            ("b256", ("dp_step_over_nonprivate_b256",), 0.0, lambda: _b256_row(run, model)),
            ("memory", ("dp_memory_over_nonprivate",), 0.0, lambda: _memory_row(run)),
            ("signals", ("signals_over_forward",), 0.0, lambda: _signals_row(run)),
            ("validate", ("validate_over_training",), VALIDATE_NEED_S, lambda: _validate_row(run))]
    skip = {**({} if validate else {"validate_over_training": "not measured (validate=False)"}), **(skip or {})}
    try:
        for name, keys, need, measure in rows:
            if all(key in skip for key in keys):
                run.reasons.update({key: skip[key] for key in keys})
                continue
            run_row(measure, name=name, keys=keys, result=run.result, reasons=run.reasons, budget=budget, need=need,
                    keep_going=keep_going)
    finally:
        run.bar.close()
    return {**run.result, "reasons": run.reasons, "details": run.details}


def _step_rows(run: BenchRun, model, names: list[str]) -> None:
    """Our DP step over the non-private step and over Opacus' hooks, batch ``batch``."""
    units = workload.random_units(run.batch)
    microbatch = min(run.batch, workload.MICROBATCH)
    step = run.interleaved(names, lambda name: run.steps(name, model, units, batch=run.batch, microbatch=microbatch,
                                                         private=name != "nonprivate", steps=run.repeats))
    run.details["seconds_per_step"] = medians(step)
    run.ratio("dp_step_over_nonprivate", paired_ratio(step, "dpsgd", "nonprivate"),
              lambda: run.errors.get("dpsgd") or run.errors.get("nonprivate") or "not measured")
    run.ratio("dp_step_over_opacus", paired_ratio(step, "dpsgd", "opacus"),
              lambda: run.errors.get("opacus", "not measured"))
    run.details["vmap_step_over_nonprivate"] = paired_ratio(step, "dpsgd_vmap", "nonprivate")
    # the least dp_step_over_opacus any DP step could reach: it does all of a non-private step's work
    run.details["nonprivate_over_opacus"] = paired_ratio(step, "nonprivate", "opacus")


def _ghost_row(run: BenchRun) -> None:
    """Our DP step over Opacus' ghost clipping. Opacus' ghost clipping refuses tied parameters
    (GPT-2's embeddings): both engines on the model's untied twin."""
    untied = workload.build_model(run.size, tied=False).to(run.device)
    units = workload.random_units(run.batch)
    microbatch = min(run.batch, workload.MICROBATCH)
    names = [n for n in ("dpsgd", "opacus_ghost") if n in run.factories]
    step = run.interleaved(names, lambda name: run.steps(name, untied, units, batch=run.batch, microbatch=microbatch,
                                                         private=True, steps=run.repeats))
    run.details["seconds_per_step_untied"] = medians(step)
    run.ratio("dp_step_over_opacus_ghost", paired_ratio(step, "dpsgd", "opacus_ghost"),
              lambda: run.errors.get("opacus_ghost", "not measured"))


def _b256_row(run: BenchRun, model) -> None:
    """The DP step over the non-private step at batch 256, in micro-batches of 16 for both."""
    big = workload.random_units(256)
    step = run.interleaved(["nonprivate", "dpsgd"], lambda name: run.steps(
        name, model, big, batch=256, microbatch=workload.MICROBATCH, private=name != "nonprivate", steps=1))
    run.details["seconds_per_step_b256"] = medians(step)
    run.ratio("dp_step_over_nonprivate_b256", paired_ratio(step, "dpsgd", "nonprivate"),
              lambda: "; ".join(run.errors.values()) or "not measured")


def _memory_row(run: BenchRun) -> None:
    """Peak memory of one DP step over one non-private step, batch 64 in one micro-batch: two
    fresh measurements each, interleaved (the median of two is their mean)."""
    memory: dict[str, list[int]] = {}
    key = "dp_memory_over_nonprivate"
    for _ in range(2):
        for name in ("nonprivate", "dpsgd"):
            try:
                memory.setdefault(name, []).append(
                    peak_step_memory(name, size=run.size, batch=workload.MEMORY_BATCH, device=run.device))
            except (OSError, RuntimeError) as err:
                run.reasons[key] = f"{type(err).__name__}: {err}"
            run.bar.update(1)
    if key not in run.reasons:
        peak = {name: statistics.median(v) for name, v in memory.items()}
        run.details["peak_step_bytes_b64"] = peak
        run.result[key] = peak["dpsgd"] / peak["nonprivate"]


def _signals_row(run: BenchRun) -> None:
    ratio, seconds = audit_cost.signals_vs_forward(run.size, device=run.device, rounds=run.rounds, budget=run.budget)
    run.bar.update(run.rounds)
    run.result["signals_over_forward"] = ratio
    run.details["signals_seconds"] = seconds


def _validate_row(run: BenchRun) -> None:
    ratio, seconds = audit_cost.validate_vs_training(rounds=2)
    run.result["validate_over_training"] = ratio
    run.details["validate_seconds"] = seconds
    run.bar.update(1)
