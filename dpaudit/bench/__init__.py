"""``dpaudit bench``: what DP-SGD and an audit cost, as ratios measured side by side in one process.

Every row is a ratio of two things timed on the same model and the same inputs, in
interleaved rounds (A, B, C, A, B, C, ...): the ratio of each round (A and B timed back to
back, so a slow spell of the machine hits both) and the median of those ratios. On CPU torch
(and, with one thread, the tokenizer) runs on ``threads`` threads: with several threads on a
shared machine, OpenMP barriers stall whenever another process takes a core; and the clock is
the process's CPU time, the work done whatever else the machine runs (the wall times of a
loaded machine swing by 2-3x). On CUDA the clock is the wall time. A step is the gradient
engine (per-unit gradients, clipping, noise for DP) plus an AdamW step, on a fixed batch of
``batch`` random sequences of ``length`` tokens on the GPT-2-style model of ``size``
(``small``: the demo's, vocabulary 2,000; ``gpt2``: GPT-2 124M, its own vocabulary of 50,257,
for a GPU: ``dpaudit bench --device cuda --size gpt2``).

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

``dpaudit bench --suite gpu --size gpt2 --out gpu_check.json`` is the GPU check
(:mod:`dpaudit.bench.gpu`): these rows plus training throughput, peak GPU memory and the secure
noise's share of a DP step, in one JSON file, within 8 minutes on one H200.

The modules: :mod:`~dpaudit.bench.workload` (model and tokens), :mod:`~dpaudit.bench.engines`
(the engines compared), :mod:`~dpaudit.bench.timing` (steps timed in interleaved rounds, paired
ratios, a time budget), :mod:`~dpaudit.bench.memory` (peak memory of a step),
:mod:`~dpaudit.bench.audit_cost` (signals and validate), :mod:`~dpaudit.bench.rows` (the
default suite), :mod:`~dpaudit.bench.gpu` (the GPU check), :mod:`~dpaudit.bench.text` (the
printed summaries).
"""

from dpaudit.bench.audit_cost import signals_vs_forward, validate_vs_training
from dpaudit.bench.engines import OpacusGhostEngine, engine_factories, make_engine
from dpaudit.bench.gpu import GPU_KEYS, run_gpu_check
from dpaudit.bench.memory import peak_step_memory
from dpaudit.bench.rows import KEYS, run_bench
from dpaudit.bench.text import gpu_summary, summary
from dpaudit.bench.timing import Budget, interleaved, medians, paired_ratio, time_steps
from dpaudit.bench.workload import (LENGTH, MEMORY_BATCH, MICROBATCH, VOCAB, VOCABS, build_model, random_units,
                                    vocabulary)

__all__ = ["GPU_KEYS", "KEYS", "LENGTH", "MEMORY_BATCH", "MICROBATCH", "VOCAB", "VOCABS", "Budget",
           "OpacusGhostEngine", "build_model", "engine_factories", "gpu_summary", "interleaved", "make_engine",
           "medians", "paired_ratio", "peak_step_memory", "random_units", "run_bench", "run_gpu_check",
           "signals_vs_forward", "summary", "time_steps", "validate_vs_training", "vocabulary"]
