"""What white-box gradient canaries cost: a DP-SGD step with 10^6 of them over the same step without.

    OMP_NUM_THREADS=1 python benchmarks/bench_gradient_canaries.py            # 5 rounds, a table
    OMP_NUM_THREADS=1 python benchmarks/bench_gradient_canaries.py --json     # one JSON object

The model is the demo's (``model.size: small``: GPT-2-style, 4 layers, width 128, vocabulary
2,000, as ``dpaudit bench`` builds it); a step is the toolkit's DP-SGD engine
(``train.dp.engine: auto``) on a batch of 16 sequences (``--batch``) of 128 random tokens
plus the AdamW step, as ``dpaudit bench`` times a step. With canaries the same engine carries
:class:`~dpaudit.train.gradient_canaries.GradientCanaries` (``--canaries``, default 10^6, at
Poisson rate ``--sample-rate``): each step draws the members' inclusions, builds the block,
puts it through the engine's noise and adds it to the scores (:mod:`dpaudit.train.gradient_canaries`).

Both modes are timed: reproducible (seeded torch noise, seeded canary draws and noise) and
secure (the default of DP training: ChaCha20 noise from a
:class:`~dpaudit.train.sampling.SecureGenerator`, canary draws from a
:class:`~dpaudit.train.sampling.SecureRandom`). Each round times ``--steps`` steps without
canaries and ``--steps`` with them, back to back, in alternating order; the clock is the
process's CPU time (one thread: the work done, whatever else the machine runs). The ratio of
a round is its time with canaries over its time without; the summary is the median and the
range of the rounds' ratios (goal: at most 1.05). Each round also times the canaries' work
alone (``GradientEngine.canary_step``, ``--steps`` times) as a share of the steps without them:
the part of the ratio that is the canaries' own arithmetic; and the secure members' inclusion
draws alone, from the keystream of :class:`~dpaudit.train.sampling.SecureRandom` and, as they
were drawn before it, from ``os.urandom`` for every draw.
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
from dpaudit.train.gradient_canaries import GradientCanaries
from dpaudit.train.sampling import RunSeeds, SecureGenerator, SecureRandom

MICROBATCH = 16


def urandom_bernoulli(p: float, size: int) -> np.ndarray:
    """The secure canaries' inclusion draws before :class:`~dpaudit.train.sampling.SecureRandom`:
    32-bit words of ``os.urandom`` (a system call for every draw), below floor(p 2^32)."""
    return np.frombuffer(os.urandom(4 * size), dtype=np.uint32) < np.uint32(math.floor(p * 2.0**32))


def run(*, rounds: int, steps: int, canaries: int, sample_rate: float, batch: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    model = bench.build_model("small")
    factories, _ = bench.engine_factories(opacus=False)
    engine = bench.make_engine(factories["dpsgd"], model, batch=batch, microbatch=MICROBATCH, device="cpu",
                               private=True)
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-5)
    units = bench.random_units(batch)
    seeds = RunSeeds.from_seed(0)
    modes = {
        "reproducible": (torch.Generator().manual_seed(0), GradientCanaries(
            num_canaries=canaries, sample_rate=sample_rate, max_grad_norm=engine.max_grad_norm,
            rng=seeds.canary_generator(), noise_generator=seeds.canary_noise_generator())),
        "secure": (SecureGenerator(), GradientCanaries(
            num_canaries=canaries, sample_rate=sample_rate, max_grad_norm=engine.max_grad_norm, rng=SecureRandom())),
    }

    def timed(generator, attached) -> float:
        engine.canaries = attached
        start = time.process_time()
        for _ in range(steps):
            if isinstance(generator, SecureGenerator):
                generator.next_step()
            engine.step(units, generator)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return time.process_time() - start

    members, keystream = int(modes["secure"][1].included.sum()), modes["secure"][1].rng

    def draws(bernoulli) -> float:
        """The secure members' inclusion draws alone, ``steps`` times."""
        start = time.process_time()
        for _ in range(steps):
            bernoulli(sample_rate, members)
        return time.process_time() - start

    def canary_part(generator, attached) -> float:
        """The canaries' own work alone, ``steps`` times: block, noise, scores."""
        engine.canaries = attached
        start = time.process_time()
        for _ in range(steps):
            engine.canary_step(generator)
        return time.process_time() - start

    for generator, attached in modes.values():  # warm-up: first-step allocations, both paths
        timed(generator, None)
        timed(generator, attached)
    seconds = {mode: {"without": [], "with": [], "canaries_alone": []} for mode in modes}
    secure_draws = {"keystream": [], "urandom": []}
    for r in range(rounds):
        for mode, (generator, attached) in modes.items():
            order = ("without", "with") if r % 2 == 0 else ("with", "without")
            for side in order:
                seconds[mode][side].append(timed(generator, attached if side == "with" else None))
            seconds[mode]["canaries_alone"].append(canary_part(generator, attached))
        secure_draws["keystream"].append(draws(keystream.bernoulli))
        secure_draws["urandom"].append(draws(urandom_bernoulli))
        print(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{mode} {s['without'][-1]:.3f} s / {s['with'][-1]:.3f} s" for mode, s in seconds.items()),
              file=sys.stderr, flush=True)
    engine.close()
    ratios, shares = {}, {}
    for mode, s in seconds.items():
        per_round = [b / a for a, b in zip(s["without"], s["with"])]
        ratios[mode] = {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round),
                        "rounds": per_round}
        share = [c / a for a, c in zip(s["without"], s["canaries_alone"])]
        shares[mode] = {"median": statistics.median(share), "min": min(share), "max": max(share)}
    return {
        "model": "small (demo)",
        "parameters": sum(p.numel() for p in engine.params.values()),
        "batch": f"{batch} x {bench.LENGTH} tokens",
        "canaries": canaries,
        "sample_rate": sample_rate,
        "steps_per_side": steps,
        "threads": torch.get_num_threads(),
        "clock": "process CPU time",
        "rounds": rounds,
        "seconds": seconds,
        "with_over_without": ratios,
        "canaries_alone_over_without": shares,
        "secure_draws_ms": {k: 1000 * statistics.median(v) / steps for k, v in secure_draws.items()},
        "goal": "<= 1.05",
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }


def table(result: dict) -> str:
    lines = [f"{result['model']}, {result['parameters']:,} parameters; DP-SGD step (engine auto + AdamW) at batch "
             f"{result['batch']}; {result['canaries']:,} gradient canaries at q = {result['sample_rate']:g}; "
             f"{result['threads']} thread(s); {result['clock']}; {result['rounds']} rounds of "
             f"{result['steps_per_side']} steps a side"]
    for mode, r in result["with_over_without"].items():
        s, share = result["seconds"][mode], result["canaries_alone_over_without"][mode]
        step = statistics.median(s["without"]) / result["steps_per_side"]
        alone = statistics.median(s["canaries_alone"]) / result["steps_per_side"]
        lines.append(f"  {mode:12s} with / without canaries: median {r['median']:.3f}, rounds {r['min']:.3f}-"
                     f"{r['max']:.3f} (a step without: {step:.3f} s; goal {result['goal']})")
        lines.append(f"  {'':12s} the canaries' work alone: {1000 * alone:.1f} ms a step, {share['median']:.3f} of a "
                     f"step without (rounds {share['min']:.3f}-{share['max']:.3f})")
    d = result["secure_draws_ms"]
    lines.append(f"  secure members' inclusion draws: {d['keystream']:.2f} ms a step from the keystream, "
                 f"{d['urandom']:.2f} ms from os.urandom for every draw")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps a side in each round")
    parser.add_argument("--canaries", type=int, default=10**6)
    parser.add_argument("--sample-rate", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=16, help="sequences a step, in micro-batches of 16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(rounds=args.rounds, steps=args.steps, canaries=args.canaries, sample_rate=args.sample_rate,
                 batch=args.batch, threads=args.threads)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
