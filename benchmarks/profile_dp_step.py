"""Where a DP-SGD step's time goes beyond a non-private step's, operator by operator.

    OMP_NUM_THREADS=1 python benchmarks/profile_dp_step.py [--size small] [--batch 16] [--steps 6]

Profiles (``torch.profiler``, CPU self time) the bench's workload (:mod:`dpaudit.bench.workload`:
a GPT-2-style model of ``--size``, ``--batch`` random sequences of 128 tokens) under the
non-private engine and under the toolkit's DP-SGD engine (``auto``: ghost clipping with
per-example products where they are cheaper), each with its AdamW step, after warm-up steps;
then prints the milliseconds per step of each engine and the operators whose time differs most.
The DP step's own work shows as the per-example products (``aten::bmm``) in place of the
weight gradients' ``aten::mm``, the per-example norms (``aten::linalg_vector_norm``), the noise
(``aten::normal_``) and the LayerNorm closed form. Book-keeping ghost clipping: Bu et al. 2023,
arXiv 2210.00038.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile


def self_times(name: str, *, size: str, batch: int, steps: int, warmup: int = 3) -> dict[str, float]:
    """Milliseconds of CPU self time per step, by operator, of engine ``name``."""
    from dpaudit.bench import workload
    from dpaudit.bench.engines import engine_factories, make_engine

    model = workload.build_model(size)
    units = workload.random_units(batch)
    factories, _ = engine_factories(opacus=False)
    engine = make_engine(factories[name], model, batch=batch, microbatch=min(batch, workload.MICROBATCH),
                         device=torch.device("cpu"), private=name != "nonprivate")
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-5)
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        engine.step(units, generator)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        for _ in range(warmup):
            step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
    finally:
        if hasattr(engine, "close"):
            engine.close()
    return {event.key: event.self_cpu_time_total / steps / 1000 for event in prof.key_averages()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    times = {name: self_times(name, size=args.size, batch=args.batch, steps=args.steps) for name in ("nonprivate", "dpsgd")}
    total = {name: sum(t.values()) for name, t in times.items()}
    print(f"ms per step: non-private {total['nonprivate']:.1f}, DP-SGD {total['dpsgd']:.1f}, "
          f"ratio {total['dpsgd'] / total['nonprivate']:.3f}")
    ops = set(times["nonprivate"]) | set(times["dpsgd"])

    def diff(op: str) -> float:
        return times["dpsgd"].get(op, 0.0) - times["nonprivate"].get(op, 0.0)

    print(f"{'operator':<40} {'non-private':>11} {'DP-SGD':>8} {'difference':>10}")
    for op in sorted(ops, key=lambda op: -abs(diff(op)))[: args.top]:
        print(f"{op[:40]:<40} {times['nonprivate'].get(op, 0.0):>11.2f} {times['dpsgd'].get(op, 0.0):>8.2f} "
              f"{diff(op):>+10.2f}")


if __name__ == "__main__":
    main()
