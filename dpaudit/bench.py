"""``dpaudit bench``: what DP-SGD and an audit cost, as ratios measured side by side in one process.

Every row is a ratio of two things timed on the same model and the same inputs, in
interleaved rounds (A, B, C, A, B, C, ...): the ratio of each round (A and B timed back to
back, so a slow spell of the machine hits both) and the median of those ratios. On CPU torch (and, with
one thread, the tokenizer) runs on ``threads`` threads: with
several threads on a shared machine, OpenMP barriers stall whenever another process takes a
core; and the clock is the process's CPU time, the work done whatever else the machine runs
(the wall times of a loaded machine swing by 2-3x). On CUDA the clock is the wall time. A step is the gradient engine (per-unit gradients, clipping, noise for DP) plus an AdamW
step, on a fixed batch of ``batch`` random sequences of ``length`` tokens on the GPT-2-style
model of ``size`` (``small``: the demo's, vocabulary 2,000; ``gpt2``: GPT-2 124M, its own
vocabulary of 50,257, for a GPU: ``dpaudit bench --device cuda --size gpt2``).

=============================  ===============================================================
``dp_step_over_nonprivate``    our DP-SGD step (the engine ``train.dp.engine: auto`` picks:
                               ghost clipping) over the non-private step, batch ``batch``
``dp_step_over_nonprivate_b256``  the same at batch 256 (micro-batches of 16 for both)
``dp_memory_over_nonprivate``  peak memory of one DP step over one non-private step, batch 64
                               in one micro-batch (CUDA: ``max_memory_allocated``; CPU: the
                               peak resident memory of a fresh subprocess per engine, above
                               its resident memory before the step)
``dp_step_over_opacus``        our DP step over Opacus' hooks (per-sample gradients), same loop;
                               ``details.nonprivate_over_opacus``, the non-private step over
                               Opacus' hooks in the same rounds, is the least this row can be
                               (a DP step does all of a non-private step's work)
``dp_step_over_opacus_ghost``  our DP step over Opacus' ghost clipping (its fast gradient
                               clipping module, two backward passes), both on the model's
                               untied twin (``lm_head`` a copy of the input embedding): Opacus
                               refuses tied parameters
``signals_over_forward``       :func:`dpaudit.signals.compute_signals` time over a bare forward
                               pass of the same batches (the goal of 0.9 throughput is a ratio
                               of at most 1.11)
``validate_over_training``     wall time of ``dpaudit validate`` (the ``tiny`` preset, trainer
                               ``dpaudit.train:nonprivate``) over ``dpaudit train`` of the
                               same run: one non-private training of the same model by the
                               same tool, data, tokenizer and base model included; each a
                               fresh process
=============================  ===============================================================

A ratio that cannot be measured (Opacus not installed, or unable to run on the model) is null,
with the reason under ``reasons``; ``details`` holds the seconds and bytes behind the ratios.
Ghost clipping: Li et al. 2021, arXiv 2110.05679; book-keeping: Bu et al. 2023, arXiv 2210.00038.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dpaudit.errors import InputError
from dpaudit.progress import Progress

KEYS = ("dp_step_over_nonprivate", "dp_step_over_nonprivate_b256", "dp_memory_over_nonprivate", "dp_step_over_opacus",
        "dp_step_over_opacus_ghost", "signals_over_forward", "validate_over_training", "model", "batch_size", "threads")
VOCAB = 2000  # the demo's tokenizer size; tokens are drawn from it
VOCABS = {"gpt2": 50257}  # size gpt2: GPT-2's own vocabulary, so that the model is the 124M one
LENGTH = 128
MICROBATCH = 16  # the config default, for the batch-256 row
MEMORY_BATCH = 64


# --------------------------------------------------------------------------- models and engines


def build_model(size: str, *, seed: int = 0, tied: bool = True):
    """A GPT-2-style model of ``size`` (:data:`dpaudit.models.SIZES`) with the vocabulary of
    :func:`vocabulary`, no dropout, train mode; ``tied=False``: its twin with the output layer
    a copy of the input embedding, not the same parameter (Opacus' ghost clipping refuses
    tied parameters)."""
    from dpaudit.models import SIZES
    from dpaudit.models import build_model as build

    if size not in SIZES:
        raise InputError(f"--size must be one of {', '.join(SIZES)}, got {size!r}")
    model = build(size=size, vocab_size=vocabulary(size), bos_token_id=0, eos_token_id=0, seed=seed)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.transformer.wte.weight.detach().clone())
    return model.train()


def vocabulary(size: str) -> int:
    """The model's vocabulary size: :data:`VOCABS` for ``size``, else :data:`VOCAB`."""
    return VOCABS.get(size, VOCAB)


def random_units(batch: int, *, length: int | None = None, seed: int = 1) -> list[list[torch.Tensor]]:
    """``batch`` units of one sequence of ``length`` (default :data:`LENGTH`) random tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randint(1, VOCAB, (length or LENGTH,), generator=generator)] for _ in range(batch)]


class OpacusGhostEngine:
    """Opacus' ghost clipping (``GradSampleModuleFastGradientClipping``; Opacus 1.5+) in our
    engine's shape, for the benchmark only: per micro-batch a backward pass for the per-sample
    norms, a second one of the clip-weighted loss for the clipped sum (Opacus'
    ``DPTensorFastGradientClipping.backward``), then the same noise and divisor as ours."""

    private = True

    def __init__(self, model, *, expected_batch_size, microbatch_size, pad_id, device, noise_multiplier,
                 max_grad_norm, autocast_dtype=None):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        from dpaudit.train.engine import trainable_parameters

        self.model, self.device = model, torch.device(device)
        self.expected_batch_size, self.microbatch_size, self.pad_id = expected_batch_size, microbatch_size, pad_id
        self.std = noise_multiplier * max_grad_norm
        self.autocast_dtype = autocast_dtype  # the same forward precision as ours (bf16 on CUDA)
        self.params = trainable_parameters(model)
        self._gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum", strict=False,
                                                         max_grad_norm=max_grad_norm, use_ghost_clipping=True)

    def close(self) -> None:
        self._gsm._close()

    def step(self, units, generator=None):
        from dpaudit.train.engine import autocast_context, collate, example_losses, forward_logits

        sequences = sorted((unit[0] for unit in units), key=len, reverse=True)
        total = {name: torch.zeros_like(p) for name, p in self.params.items()}
        for start in range(0, len(sequences), self.microbatch_size):
            batch = collate(sequences[start : start + self.microbatch_size], pad_id=self.pad_id, device=self.device)
            self._gsm.enable_hooks()
            with autocast_context(self.device, self.autocast_dtype):
                losses = example_losses(forward_logits(self._gsm, batch), batch.labels)
            with warnings.catch_warnings():  # "Full backward hook is firing ...": the inputs are token ids
                warnings.filterwarnings("ignore", message="Full backward hook")
                losses.sum().backward(retain_graph=True)
            coefficients = self._gsm.get_clipping_coef()
            self.model.zero_grad(set_to_none=True)
            self._gsm.disable_hooks()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Full backward hook")
                (coefficients.to(losses.device) * losses).sum().backward()
            for name, p in self.params.items():
                total[name] += p.grad
                p.grad, p._norm_sample = None, None
        for name, p in self.params.items():
            noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
            p.grad = (total[name] + self.std * noise) / self.expected_batch_size


def engine_factories(*, opacus: bool = True) -> tuple[dict[str, Callable], dict[str, str]]:
    """name -> engine class (or factory) for the timed rows, and why any is missing."""
    from dpaudit.train.engine import DPSGDEngine, NonPrivateEngine
    from dpaudit.train.ghost import choose_engine

    dp_class, options = choose_engine(DPSGDEngine, "auto")
    factories: dict[str, Callable] = {
        "nonprivate": NonPrivateEngine,
        "dpsgd": lambda model, **kw: dp_class(model, **options, **kw),
        "dpsgd_vmap": DPSGDEngine,
    }
    missing: dict[str, str] = {}
    if opacus:
        try:
            import opacus

            from dpaudit.train.opacus import OpacusEngine

            factories["opacus"] = OpacusEngine
            factories["opacus_ghost"] = OpacusGhostEngine
        except ImportError as err:
            missing["opacus"] = missing["opacus_ghost"] = f"Opacus is not installed ({err}): pip install 'dpaudit[opacus]'"
    else:
        missing["opacus"] = missing["opacus_ghost"] = "not measured (opacus=False)"
    return factories, missing


def _make(factory, model, *, batch: int, microbatch: int, device, private: bool, autocast_dtype=None):
    return factory(model, expected_batch_size=batch, microbatch_size=microbatch, pad_id=0, device=device,
                   noise_multiplier=1.0 if private else 0.0, max_grad_norm=1.0 if private else math.inf,
                   autocast_dtype=autocast_dtype)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(factory, model, units, *, batch: int, microbatch: int, device: torch.device, private: bool,
               steps: int, autocast_dtype=None) -> list[float]:
    """Seconds of ``steps`` engine + AdamW steps after one warm-up step: the process's CPU time
    on CPU (with one thread, the work done, whatever else runs on the machine), wall time on
    CUDA (synchronized). The model's weights
    are restored afterwards, so every engine starts from the same model."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    engine = _make(factory, model, batch=batch, microbatch=microbatch, device=device, private=private,
                   autocast_dtype=autocast_dtype)
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-5)
    generator = torch.Generator(device=device).manual_seed(0)
    times = []
    try:
        for i in range(steps + 1):
            _sync(device)
            start, cpu = time.perf_counter(), time.process_time()
            engine.step(units, generator)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(device)
            if i > 0:  # the clock of the ratios: CPU time on CPU (one thread), wall time on CUDA
                times.append(time.process_time() - cpu if device.type == "cpu" else time.perf_counter() - start)
    finally:
        engine.close()
        model.load_state_dict(state)
    return times


def interleaved(names: list[str], run: Callable[[str], list[float]], *, rounds: int, bar: Progress,
                errors: dict[str, str]) -> dict[str, list[float]]:
    """Per name, the median seconds per step of each of ``rounds`` interleaved rounds; a name
    whose engine fails is dropped, with its error in ``errors``."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            if name in errors:
                continue
            try:
                times[name].append(statistics.median(run(name)))
            except Exception as err:  # noqa: BLE001 - another library's engine: recorded as the reason
                errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
            bar.update(1)
    return {name: t for name, t in times.items() if t and name not in errors}


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float | None:
    """The median over rounds of ``a``'s time over ``b``'s in the same round; None when
    either was not measured."""
    if a not in times or b not in times:
        return None
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Median seconds per step of each name, over its rounds."""
    return {name: statistics.median(t) for name, t in times.items()}


# --------------------------------------------------------------------------- memory


def _rss(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def peak_step_memory(name: str, *, size: str, batch: int, device: torch.device) -> int:
    """Peak memory of one step (after a warm-up step) above the memory before it, in bytes."""
    if device.type == "cuda":
        return _memory_worker(name, size=size, batch=batch, device=device)
    if not Path("/proc/self/clear_refs").exists():
        raise OSError("peak memory on CPU needs Linux /proc")
    # a fresh process per engine, with a fixed mmap threshold so freed tensors leave the resident set
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    code = (f"import json, torch; torch.set_num_threads({torch.get_num_threads()}); from dpaudit.bench import "
            f"_memory_worker; print(json.dumps(_memory_worker({name!r}, size={size!r}, batch={batch}, "
            f"device=torch.device('cpu'))))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
    return int(json.loads(out.stdout.strip().splitlines()[-1]))


def _memory_worker(name: str, *, size: str, batch: int, device: torch.device) -> int:
    factories, _ = engine_factories(opacus=name.startswith("opacus"))
    model = build_model(size).to(device)
    units = random_units(batch)
    autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
    engine = _make(factories[name], model, batch=batch, microbatch=batch, device=device, private=name != "nonprivate",
                   autocast_dtype=autocast_dtype)
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


# --------------------------------------------------------------------------- signals, validate


def signals_vs_forward(size: str, *, device: torch.device, rounds: int, batch: int = 16,
                       texts: int = 128) -> tuple[float, dict[str, float]]:
    """:func:`dpaudit.signals.compute_signals` over a bare forward pass of the same batches under
    ``torch.inference_mode()``, interleaved (CPU time on CPU, as the steps): the median of the
    rounds' ratios, and the median seconds of each."""
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dpaudit.signals import compute_signals

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w0")
    model = build_model(size).to(device).eval()
    length = LENGTH
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(texts, length))
    strings = [" ".join(f"w{i}" for i in row) for row in ids]
    batches = [torch.as_tensor(ids[s : s + batch], device=device) for s in range(0, texts, batch)]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

    clock = time.process_time if device.type == "cpu" else time.perf_counter

    def bare():
        _sync(device)
        start = clock()
        with torch.inference_mode(), autocast:
            for x in batches:
                model(x, attention_mask=torch.ones_like(x), use_cache=False)
        _sync(device)
        return clock() - start

    def signals():
        _sync(device)
        start = clock()
        compute_signals(model, tokenizer, strings, batch_size=batch, max_length=length, device=device, progress=False)
        _sync(device)
        return clock() - start

    bare(), signals()  # warm-up
    runs: dict[str, list[float]] = {"forward": [], "signals": []}
    for _ in range(rounds):
        runs["forward"].append(bare())
        runs["signals"].append(signals())
    return paired_ratio(runs, "signals", "forward"), medians(runs)


def validate_vs_training(*, rounds: int = 1) -> tuple[float, dict[str, float]]:
    """Wall time of ``dpaudit validate`` (tiny preset, trainer ``dpaudit.train:nonprivate``)
    over ``dpaudit train`` of the same run (the same config, :func:`validate_overrides`):
    what validating a trainer costs beyond training its model once. Each command runs in a
    fresh process (imports, data, tokenizer and base model on both sides), interleaved,
    medians of ``rounds``. ``details`` also has the training loop alone, from the train log."""
    from dpaudit.stages.validate import MODEL, validate_overrides

    trainer = "dpaudit.train:nonprivate"
    sets = [arg for s in validate_overrides(trainer=trainer, config="tiny") for arg in ("--set", s)]
    commands = {
        "train": ["train", "--config", "tiny", *sets],
        "validate": ["validate", "--trainer", trainer, "--epsilon", "1", "--delta", "1e-3", "--config", "tiny"],
    }
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    walls: dict[str, list[float]] = {name: [] for name in commands}
    loop: list[float] = []
    # warm-up: the first import of torch and transformers reads them from disk
    subprocess.run([sys.executable, "-c", "import dpaudit.stages, dpaudit.models, dpaudit.attacks"], env=env,
                   capture_output=True, check=False)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for name, args in commands.items():
                out = Path(tmp) / f"{name}-{i}"
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "dpaudit", *args, "--out", str(out)], env=env,
                                      capture_output=True, text=True, check=False)
                walls[name].append(time.perf_counter() - start)
                if done.returncode not in (0, 3):  # validate: 3 is "inconclusive" (16 canaries)
                    tail = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
                    raise RuntimeError(f"dpaudit {name} failed: {tail}")
                if name == "validate":
                    log = (out / "models" / MODEL / "train_log.jsonl").read_text().splitlines()
                    loop.append(max(json.loads(line).get("elapsed_s") or 0.0 for line in log))
    median = {f"{name}_s": seconds for name, seconds in medians(walls).items()}
    median["training_loop_s"] = statistics.median(loop)
    median["validate_over_training_loop"] = median["validate_s"] / median["training_loop_s"]
    return paired_ratio(walls, "validate", "train"), median


# --------------------------------------------------------------------------- the bench


def run_bench(*, size: str = "small", batch: int = 16, rounds: int = 5, repeats: int = 3, device: str = "auto",
              threads: int = 1, opacus: bool = True, validate: bool = True) -> dict[str, Any]:
    """Measure every row (see the module docstring) and return the ``--json`` object."""
    if batch < 1 or rounds < 1 or repeats < 1:
        raise InputError("--batch, --rounds and --repeats must be positive")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda but CUDA is not available")
    if dev.type == "cpu" and threads:
        torch.set_num_threads(threads)
        if threads == 1:  # the tokenizer too: its thread pool's waiting counts as CPU time, not work
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    autocast_dtype = torch.bfloat16 if dev.type == "cuda" else None
    factories, missing = engine_factories(opacus=opacus)
    result: dict[str, Any] = {key: None for key in KEYS}
    result.update(model=f"gpt2-{size}", batch_size=batch, threads=torch.get_num_threads(), device=str(dev),
                  precision="bf16 autocast" if autocast_dtype else "fp32",
                  clock="process CPU time" if dev.type == "cpu" else "wall time")
    reasons: dict[str, str] = {}
    details: dict[str, Any] = {"length": LENGTH, "vocab": vocabulary(size), "rounds": rounds, "repeats": repeats}
    model = build_model(size).to(dev)
    errors: dict[str, str] = dict(missing)
    main_names = [n for n in ("nonprivate", "dpsgd", "dpsgd_vmap", "opacus") if n in factories]
    units = random_units(batch)
    total = rounds * (len(main_names) + 4) + 4 + rounds + (1 if validate else 0)
    bar = Progress(total=total, desc="bench")
    try:
        def run_main(name: str) -> list[float]:
            return time_steps(factories[name], model, units, batch=batch, microbatch=min(batch, MICROBATCH),
                              device=dev, private=name != "nonprivate", steps=repeats, autocast_dtype=autocast_dtype)

        step = interleaved(main_names, run_main, rounds=rounds, bar=bar, errors=errors)
        details["seconds_per_step"] = medians(step)
        result["dp_step_over_nonprivate"] = paired_ratio(step, "dpsgd", "nonprivate")
        result["dp_step_over_opacus"] = paired_ratio(step, "dpsgd", "opacus")
        if result["dp_step_over_opacus"] is None:
            reasons["dp_step_over_opacus"] = errors.get("opacus", "not measured")
        details["vmap_step_over_nonprivate"] = paired_ratio(step, "dpsgd_vmap", "nonprivate")
        # the least dp_step_over_opacus any DP step could reach: it does all of a non-private step's work
        details["nonprivate_over_opacus"] = paired_ratio(step, "nonprivate", "opacus")

        # Opacus' ghost clipping refuses tied parameters (GPT-2's embeddings): both engines
        # on the model's untied twin
        untied = build_model(size, tied=False).to(dev)

        def run_untied(name: str) -> list[float]:
            return time_steps(factories[name], untied, units, batch=batch, microbatch=min(batch, MICROBATCH),
                              device=dev, private=True, steps=repeats, autocast_dtype=autocast_dtype)

        ghost_names = [n for n in ("dpsgd", "opacus_ghost") if n in factories]
        step_untied = interleaved(ghost_names, run_untied, rounds=rounds, bar=bar, errors=errors)
        details["seconds_per_step_untied"] = medians(step_untied)
        result["dp_step_over_opacus_ghost"] = paired_ratio(step_untied, "dpsgd", "opacus_ghost")
        if result["dp_step_over_opacus_ghost"] is None:
            reasons["dp_step_over_opacus_ghost"] = errors.get("opacus_ghost", "not measured")

        big = random_units(256)

        def run_big(name: str) -> list[float]:
            return time_steps(factories[name], model, big, batch=256, microbatch=MICROBATCH, device=dev,
                              private=name != "nonprivate", steps=1, autocast_dtype=autocast_dtype)

        step256 = interleaved(["nonprivate", "dpsgd"], run_big, rounds=rounds, bar=bar, errors=errors)
        details["seconds_per_step_b256"] = medians(step256)
        result["dp_step_over_nonprivate_b256"] = paired_ratio(step256, "dpsgd", "nonprivate")
        if result["dp_step_over_nonprivate_b256"] is None:
            reasons["dp_step_over_nonprivate_b256"] = "; ".join(errors.values()) or "not measured"

        memory: dict[str, list[int]] = {}
        for _ in range(2):  # two fresh measurements each, interleaved; the median of two is their mean
            for name in ("nonprivate", "dpsgd"):
                try:
                    memory.setdefault(name, []).append(peak_step_memory(name, size=size, batch=MEMORY_BATCH, device=dev))
                except (OSError, RuntimeError) as err:
                    reasons["dp_memory_over_nonprivate"] = f"{type(err).__name__}: {err}"
                bar.update(1)
        if "dp_memory_over_nonprivate" not in reasons:
            peak = {name: statistics.median(v) for name, v in memory.items()}
            details["peak_step_bytes_b64"] = peak
            result["dp_memory_over_nonprivate"] = peak["dpsgd"] / peak["nonprivate"]

        ratio, seconds = signals_vs_forward(size, device=dev, rounds=rounds)
        bar.update(rounds)
        result["signals_over_forward"] = ratio
        details["signals_seconds"] = seconds
        if validate:
            ratio, seconds = validate_vs_training(rounds=2)
            result["validate_over_training"] = ratio
            details["validate_seconds"] = seconds
            bar.update(1)
        else:
            reasons["validate_over_training"] = "not measured (validate=False)"
    finally:
        bar.close()
    result["reasons"] = reasons
    result["details"] = details
    return result


def summary(result: dict[str, Any]) -> str:
    """The human-readable table of :func:`run_bench`'s result."""
    goals = {"dp_step_over_nonprivate": "<= 1.15", "dp_step_over_nonprivate_b256": "<= 1.3",
             "dp_memory_over_nonprivate": "<= 1.3", "dp_step_over_opacus": "<= 0.6",
             "dp_step_over_opacus_ghost": "<= 1.0", "signals_over_forward": "<= 1.11",
             "validate_over_training": "<= 1.5"}
    lines = [(f"model {result['model']} on {result['device']} ({result['precision']}, {result['threads']} thread(s)), "
              f"batch {result['batch_size']} x {LENGTH} tokens; medians of paired interleaved rounds, {result['clock']}")]
    for key, goal in goals.items():
        value = result[key]
        text = f"{value:.3f}" if value is not None else f"n/a ({result['reasons'].get(key, 'not measured')})"
        lines.append(f"  {key:<30} {text:<10} goal {goal}")
    floor = result["details"].get("nonprivate_over_opacus")
    if floor is not None:
        lines.append(f"  floor of dp_step_over_opacus (the non-private step over Opacus' hooks): {floor:.3f}")
    seconds = result["details"].get("seconds_per_step", {})
    lines.append("  seconds per step: " + ", ".join(f"{k} {v:.3f}" for k, v in seconds.items()))
    return "\n".join(lines)
