"""What an audit costs beyond a model's own work: signal extraction over a bare forward pass,
and ``dpaudit validate`` over ``dpaudit train`` of the same run."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dpaudit.bench import workload
from dpaudit.bench.timing import Budget, clock, medians, paired_ratio, sync


def signals_vs_forward(size: str, *, device: torch.device, rounds: int, batch: int = 16, texts: int = 128,
                       budget: Budget | None = None) -> tuple[float, dict[str, float]]:
    """:func:`dpaudit.signals.compute_signals` over a bare forward pass of the same batches under
    ``torch.inference_mode()``, interleaved (CPU time on CPU, as the steps): the median of the
    rounds' ratios, and the median seconds of each. Fewer rounds when ``budget`` runs out."""
    import numpy as np

    from dpaudit.signals.compute import compute_signals

    tokenizer = _word_tokenizer()
    model = workload.build_model(size).to(device).eval()
    length = workload.LENGTH
    ids = np.random.default_rng(0).integers(1, workload.VOCAB, size=(texts, length))
    strings = [" ".join(f"w{i}" for i in row) for row in ids]
    batches = [torch.as_tensor(ids[s : s + batch], device=device) for s in range(0, texts, batch)]
    cuda = device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    now = clock(device)

    def bare():
        sync(device)
        start = now()
        with torch.inference_mode(), autocast:
            for x in batches:
                model(x, attention_mask=torch.ones_like(x), use_cache=False)
        sync(device)
        return now() - start

    def signals():
        sync(device)
        start = now()
        compute_signals(model, tokenizer, strings, batch_size=batch, max_length=length, device=device, progress=False)
        sync(device)
        return now() - start

    bare(), signals()  # warm-up
    runs: dict[str, list[float]] = {"forward": [], "signals": []}
    for done in range(rounds):
        if budget is not None and budget.stop(done):
            break
        runs["forward"].append(bare())
        runs["signals"].append(signals())
    return paired_ratio(runs, "signals", "forward"), medians(runs)


def _word_tokenizer():
    """A word-level tokenizer whose words ``w0`` ... are the token ids of :data:`workload.VOCAB`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(workload.VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w0")


def validate_vs_training(*, rounds: int = 1) -> tuple[float, dict[str, float]]:
    """Wall time of ``dpaudit validate`` (tiny preset, trainer ``dpaudit.train:nonprivate``)
    over ``dpaudit train`` of the same run (the same config,
    :func:`~dpaudit.stages.validate.validate_overrides`): what validating a trainer costs
    beyond training its model once. Each command runs in a fresh process (imports, data,
    tokenizer and base model on both sides), interleaved, medians of ``rounds``. ``details``
    also has the training loop alone, from the train log."""
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
