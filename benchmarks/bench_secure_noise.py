"""What secure mode's noise costs at GPT-2 124M size, as a share of a DP-SGD step measured beside it.

    OMP_NUM_THREADS=1 python benchmarks/bench_secure_noise.py            # 5 rounds, a table
    OMP_NUM_THREADS=1 python benchmarks/bench_secure_noise.py --json     # one JSON object
    OMP_NUM_THREADS=1 python benchmarks/bench_secure_noise.py --batch 4  # the step of 4 sequences

The model is GPT-2 124M (``dpaudit.bench.build_model("gpt2")``: 12 layers, width 768, GPT-2's
vocabulary of 50,257, tied embeddings: 124.4 million trainable parameters). Each round times, one
after the other:

- ``noise_chacha``: one step's noise for every trainable parameter the way the DP engine adds it
  in secure mode (``DPSGDEngine.add_noise`` with a :class:`~dpaudit.train.sampling.SecureGenerator`:
  ChaCha20 keystream, Gaussians, the sum snapped to its grid), onto float32 sums of the
  parameters' shapes;
- ``noise_torch``: the same with a seeded ``torch.Generator`` (reproducible mode, ``torch.randn``);
- ``noise_urandom`` (``--urandom-rounds``, default 1: about 15 s each): the secure noise as it was
  before, ``os.urandom`` and Box-Muller in float64 on the CPU, per parameter, then added;
- ``dp_step``: one DP-SGD step of the toolkit's engine (``train.dp.engine: auto``), secure mode,
  on a batch of ``--batch`` sequences of 128 random tokens (default 16, the batch of ``dpaudit
  bench``'s DP-step row; micro-batches of 4), plus the AdamW step, as ``dpaudit bench`` times a
  step (a warm-up step first). The noise does not grow with the batch; the step does.

The clock is the process's CPU time (with one thread: the work done, whatever else the machine
runs); the share of a round is its ``noise_chacha`` over its ``dp_step``, and the summary is the
median and the range of the rounds' shares. Draws of 2^18 normals and more run through
``torch.compile``; the warm-up compiles them before any timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

from dpaudit import bench
from dpaudit.train.engine import trainable_parameters
from dpaudit.train.sampling import SecureGenerator

MICROBATCH = 4


def urandom_standard_normal(shape) -> torch.Tensor:
    """The secure noise of the toolkit before ChaCha20: 16 bytes of ``os.urandom`` per pair of
    normals, Box-Muller in float64 on the CPU, cast to float32."""
    n = math.prod(shape)
    pairs = (n + 1) // 2
    u = (np.frombuffer(os.urandom(16 * pairs), dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    u = u.reshape(2, pairs)
    radius = np.sqrt(-2.0 * np.log1p(-u[0]))
    angle = 2.0 * np.pi * u[1]
    z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]
    return torch.from_numpy(z).reshape(shape).to(torch.float32)


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def run(*, rounds: int, urandom_rounds: int, threads: int, batch: int = 16) -> dict:
    torch.set_num_threads(threads)
    model = bench.build_model("gpt2")
    factories, _ = bench.engine_factories(opacus=False)
    engine = factories["dpsgd"](model, expected_batch_size=batch, microbatch_size=min(batch, MICROBATCH), pad_id=0, device="cpu",
                                noise_multiplier=1.0, max_grad_norm=1.0)
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-5)
    units = bench.random_units(batch)
    sums = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}
    secure = SecureGenerator()
    seeded = torch.Generator().manual_seed(0)

    def noise_chacha():
        secure.next_step()
        engine.add_noise(sums, secure)

    def noise_torch():
        engine.add_noise(sums, seeded)

    def noise_urandom():
        for g in sums.values():
            g.add_(urandom_standard_normal(g.shape), alpha=engine.noise_std())

    def dp_step():
        secure.next_step()
        engine.step(units, secure)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    timers = {"noise_chacha": noise_chacha, "noise_torch": noise_torch, "dp_step": dp_step}
    for fn in timers.values():  # warm-up: compiles the noise kernels, first-step allocations
        fn()
    times: dict[str, list[float]] = {name: [] for name in [*timers, "noise_urandom"]}
    for r in range(rounds):
        for name, fn in timers.items():
            times[name].append(cpu_seconds(fn))
        if r < urandom_rounds:
            times["noise_urandom"].append(cpu_seconds(noise_urandom))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items() if len(v) > r),
              file=sys.stderr, flush=True)
    engine.close()
    shares = [a / b for a, b in zip(times["noise_chacha"], times["dp_step"])]
    return {
        "model": "gpt2 (124M)",
        "parameters": sum(p.numel() for p in params.values()),
        "tensors": len(params),
        "batch": f"{batch} x {bench.LENGTH} tokens",
        "threads": torch.get_num_threads(),
        "clock": "process CPU time",
        "rounds": rounds,
        "seconds": times,
        "share_of_dp_step": {"median": statistics.median(shares), "min": min(shares), "max": max(shares),
                             "rounds": shares},
        "chacha_over_torch_randn": statistics.median(a / b for a, b in zip(times["noise_chacha"], times["noise_torch"])),
        "urandom_over_chacha": (statistics.median(times["noise_urandom"]) / statistics.median(times["noise_chacha"])
                                if times["noise_urandom"] else None),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, Python {platform.python_version()}",
    }


def table(result: dict) -> str:
    s = result["seconds"]

    def span(values):
        return f"{min(values):.3f}-{max(values):.3f} s (median {statistics.median(values):.3f})" if values else "not measured"

    share = result["share_of_dp_step"]
    return "\n".join([
        f"{result['model']}, {result['parameters']:,} parameters in {result['tensors']} tensors; DP step at batch "
        f"{result['batch']}; {result['threads']} thread(s); {result['clock']}; {result['rounds']} rounds",
        f"  secure noise, ChaCha20 (one step, all parameters)   {span(s['noise_chacha'])}",
        f"  reproducible noise, torch.randn                       {span(s['noise_torch'])}",
        f"  secure noise before, os.urandom + Box-Muller float64  {span(s['noise_urandom'])}",
        f"  DP-SGD step (engine + AdamW), secure mode             {span(s['dp_step'])}",
        f"  ChaCha20 noise / DP step: median {share['median']:.3f}, rounds {share['min']:.3f}-{share['max']:.3f} (goal <= 0.05)",
        f"  ChaCha20 noise / torch.randn noise: {result['chacha_over_torch_randn']:.2f}",
        f"  os.urandom noise / ChaCha20 noise: {result['urandom_over_chacha']:.1f}" if result["urandom_over_chacha"] else "",
    ]).rstrip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--urandom-rounds", type=int, default=1, help="rounds that also time the old os.urandom noise")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16, help="sequences in the timed DP step")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(rounds=args.rounds, urandom_rounds=args.urandom_rounds, threads=args.threads, batch=args.batch)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
