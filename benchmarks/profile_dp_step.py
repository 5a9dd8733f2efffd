"""Where a DP-SGD step's time goes beyond a non-private step's, operator by operator.

    OMP_NUM_THREADS=1 python benchmarks/profile_dp_step.py [--size small] [--batch 16] [--steps 6]
    OMP_NUM_THREADS=1 python benchmarks/profile_dp_step.py --stages [--rounds 15]
    OMP_NUM_THREADS=1 python benchmarks/profile_dp_step.py --floor [--rounds 15]
    python benchmarks/profile_dp_step.py --launches [--as-accelerator] [--bf16] [--size gpt2] [--batch 2]

Profiles (``torch.profiler``, CPU self time) the bench's workload (:mod:`dpaudit.bench.workload`:
a GPT-2-style model of ``--size``, ``--batch`` random sequences of 128 tokens) under the
non-private engine and under the toolkit's DP-SGD engine (``auto``: ghost clipping with
per-example products where they are cheaper), each with its AdamW step, after warm-up steps;
then prints the milliseconds per step of each engine and the operators whose time differs most.
The DP step's own work shows as the per-example products (``aten::bmm``) in place of the
weight gradients' ``aten::mm``, the per-example norms (``aten::linalg_vector_norm``), the noise
(``aten::normal_``) and the LayerNorm closed form. Book-keeping ghost clipping: Bu et al. 2023,
arXiv 2210.00038.

With ``--stages``, the DP step's time by stage, without the profiler: the engine's own methods
timed by the process's CPU clock, both engines stepped in interleaved rounds. On a machine where
the profiler's own allocations make the step take page faults it would not take alone (2026-12-05:
12,000-16,000 a step, the profiled DP step 1.35-1.84 times the non-private one against 1.09-1.12
unprofiled), this is the breakdown to read. It needs the DP engine on ghost clipping (``auto``
chooses it at 128 tokens).

With ``--floor``, the least an exact per-example clipped step can cost over the non-private
step on this machine with torch's kernels. It records the factors of every per-example product
(``bmm``) and the noise of one DP step, then times alone, layer by layer and in interleaved
rounds with both steps, what each design must do:

- materialized (this engine at 128 tokens): the per-example products, in the faster of their
  two orientations, less the weight gradients they replace (the same factors as one product
  over all tokens, in the slower orientation), then one norm pass and one clip-weighted pass
  over the per-example gradients;
- ghost norms (Li et al. 2021, arXiv 2110.05679): the two T x T Gram matrices of each layer
  and their inner product (the clipped sum by book-keeping replaces the weight gradient);
- the cheaper of the two per layer (mixed ghost clipping, Bu et al. 2022, arXiv 2205.10683);
- norms from products kept in cache, never written: the products, no faster than the weight
  gradients of the same flops (the clipped sum by book-keeping replaces the weight gradient);

each plus the noise. Every part runs at its best case, its inputs warm; the LayerNorm closed
form, the bias sums and the tied embedding's rows count as free: each floor is a lower bound.

With ``--launches``, the operations of one step of each engine (with its AdamW step) after a
warm-up, counted by a ``TorchDispatchMode``: those that compute, each a kernel launch on an
accelerator, and the views and other metadata operations, which launch nothing. Where a step's
kernels are small (GPT-2 124M at 16 x 128 tokens on a GPU), the launches set its time rather
than the flops; the count depends on the model's depth and the engine, not on the batch. With
``--as-accelerator`` the noise and the ghosted layers take the accelerator's path (one draw for
all of a step's sums; the layers of one shape stacked, ``GhostClippingEngine._stacks``);
with ``--bf16`` both steps run under bfloat16 autocast, as on a GPU, so that the casts count.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from dpaudit.allocator import keep_freed_memory
from dpaudit.bench import workload
from dpaudit.bench.engines import engine_factories, make_engine
from dpaudit.bench.timing import clock, medians, paired_ratio
from dpaudit.train.engine import DPSGDEngine, NonPrivateEngine
from dpaudit.train.ghost import GhostClippingEngine


def stepper(name: str, *, size: str, batch: int, autocast_dtype=None):
    """One engine + AdamW step of engine ``name`` on the bench's workload, and the engine."""
    model = workload.build_model(size)
    units = workload.random_units(batch)
    factories, _ = engine_factories(opacus=False)
    engine = make_engine(factories[name], model, batch=batch, microbatch=min(batch, workload.MICROBATCH),
                         device=torch.device("cpu"), private=name != "nonprivate", autocast_dtype=autocast_dtype)
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-5)
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        engine.step(units, generator)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, engine


def self_times(name: str, *, size: str, batch: int, steps: int, warmup: int = 3) -> dict[str, float]:
    """Milliseconds of CPU self time per step, by operator, of engine ``name``."""
    step, engine = stepper(name, size=size, batch=batch)
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


class _Record(TorchDispatchMode):
    """Copies of the factors of every per-example product of a step, and the sizes of its
    noise draws (``randn`` and ``normal_``)."""

    def __init__(self):
        super().__init__()
        self.products: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.noise: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        aten = torch.ops.aten
        if func is aten.bmm.default:
            self.products.append((args[0].clone(), args[1].clone()))
        elif func is aten.normal_.default:
            self.noise.append(args[0].numel())
        elif func is aten.randn.generator:
            self.noise.append(torch.Size(args[0]).numel())
        return func(*args, **(kwargs or {}))


def _ops(a: torch.Tensor, b: torch.Tensor, clip: torch.Tensor) -> dict[str, list]:
    """What each design does with one layer's factors, a (B, R, T) and b (B, T, C): the
    per-example products (both orientations), the weight gradient they replace (one product
    over the B T tokens, both orientations), one norm pass and one clip-weighted pass over the
    products, and the ghost norm's two T x T Gram matrices and their inner product."""
    batch = a.shape[0]
    out = torch.bmm(a, b)
    flat_a, flat_b = a.transpose(0, 1).reshape(a.shape[1], -1), b.reshape(-1, b.shape[2])
    return {
        "products": [lambda: torch.bmm(a, b), lambda: torch.bmm(b.transpose(1, 2), a.transpose(1, 2))],
        "weight gradients": [lambda: torch.mm(flat_a, flat_b), lambda: torch.mm(flat_b.t(), flat_a.t())],
        "norms": [lambda: torch.linalg.vector_norm(out.reshape(batch, -1), dim=1)],
        "clipped sum": [lambda: clip @ out.reshape(batch, -1)],
        "Gram matrices": [lambda: (torch.bmm(a.transpose(1, 2), a) * torch.bmm(b, b.transpose(1, 2))).sum((1, 2))],
    }


def floor(*, size: str, batch: int, rounds: int) -> dict[str, float]:
    """Median CPU milliseconds of the non-private and DP steps and of each design's necessary
    extra work timed alone (module docstring), in ``rounds`` interleaved rounds, and the floors."""
    nonprivate, np_engine = stepper("nonprivate", size=size, batch=batch)
    dp, dp_engine = stepper("dpsgd", size=size, batch=batch)
    try:
        dp()
        record = _Record()
        with record:
            dp()
        if not record.products:
            raise SystemExit("the DP step made no per-example products: nothing to floor")
        clip = torch.rand(batch)
        layers = [_ops(a, b, clip) for a, b in record.products]
        noise = [torch.empty(n) for n in record.noise]
        steps = {"non-private step": nonprivate, "DP step": dp, "noise": lambda: [x.normal_() for x in noise]}
        times: dict[tuple, list[float]] = {}
        now = clock(torch.device("cpu"))

        def timed(key: tuple, run) -> None:
            start = now()
            run()
            times.setdefault(key, []).append(1000 * (now() - start))

        for warm in (True,) + (False,) * rounds:
            for name, run in steps.items():
                timed((name,), run)
            for i, ops in enumerate(layers):
                for part, runs in ops.items():
                    for k, run in enumerate(runs):
                        timed((part, i, k), run)
            if warm:
                times.clear()
    finally:
        for engine in (np_engine, dp_engine):
            if hasattr(engine, "close"):
                engine.close()
    med = medians(times)
    ms = {name: med[(name,)] for name in steps}
    ms["ratio"] = paired_ratio(times, ("DP step",), ("non-private step",))
    # per layer, each part at its best case: the products in their faster orientation, the
    # weight gradients they replace in their slower one
    part = {name: [(min if name != "weight gradients" else max)(med[(name, i, k)] for k in range(len(ops[name])))
                   for i, ops in enumerate(layers)] for name in layers[0]}
    for name, values in part.items():
        ms[name] = sum(values)
    materialize = [p - w + n + c for p, w, n, c in zip(part["products"], part["weight gradients"], part["norms"],
                                                       part["clipped sum"])]
    extra = {
        "materialized": sum(materialize),
        "ghost norms": sum(part["Gram matrices"]),
        "the cheaper per layer": sum(min(m, g) for m, g in zip(materialize, part["Gram matrices"])),
        # norms from products kept in cache (the clipped sum then takes the weight gradient's
        # place): the products, no faster than the weight gradients of the same flops
        "products kept in cache": ms["weight gradients"],
    }
    for design, value in extra.items():
        ms[f"floor, {design}"] = 1 + (value + ms["noise"]) / ms["non-private step"]
    ms["floor"] = min(ms[f"floor, {design}"] for design in extra)
    ms["per-example MB"] = sum(batch * a.shape[1] * b.shape[2] for a, b in record.products) * 4 / 1e6
    return ms


class _Count(TorchDispatchMode):
    """Counts the aten operations that run inside it: ``computing`` (a kernel on an
    accelerator) and ``metadata`` (views and in-place shape changes: no kernel)."""

    METADATA = frozenset({"squeeze_", "unsqueeze_", "t_", "transpose_", "as_strided_", "detach_"})

    def __init__(self):
        super().__init__()
        self.computing: dict[str, int] = defaultdict(int)
        self.metadata = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view or func.overloadpacket.__name__ in self.METADATA:
            self.metadata += 1
        else:
            self.computing[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def launches(*, size: str, batch: int, autocast_dtype=None) -> dict[str, dict]:
    """Per engine (non-private, DP-SGD): the operations of one step after a warm-up step."""
    counts = {}
    for name in ("nonprivate", "dpsgd"):
        step, engine = stepper(name, size=size, batch=batch, autocast_dtype=autocast_dtype)
        try:
            step()
            with _Count() as count:
                step()
        finally:
            if hasattr(engine, "close"):
                engine.close()
        counts[name] = {"computing": sum(count.computing.values()), "metadata": count.metadata,
                        "by operator": dict(count.computing)}
    return counts


# the DP engine's methods timed by --stages (a method's time includes the methods it calls)
STAGES = {
    "micro-batch": (GhostClippingEngine, "_microbatch"),
    "forward and backward": (GhostClippingEngine, "_forward_backward"),
    "per-example gradients and norms": (GhostClippingEngine, "_norms"),
    "per-example products": (GhostClippingEngine, "_materialize"),
    "LayerNorm closed form": (GhostClippingEngine, "_generic_rows"),
    "noise": (DPSGDEngine, "add_noise"),
    "non-private forward and backward": (NonPrivateEngine, "summed_gradients"),
}


@contextlib.contextmanager
def _timed_methods(spent: dict[str, float]):
    """Add each :data:`STAGES` method's CPU seconds to ``spent[stage]`` while inside."""
    now = clock(torch.device("cpu"))
    saved = []
    for stage, (cls, method) in STAGES.items():
        original = vars(cls)[method]

        def timed(*args, _original=original, _stage=stage, **kwargs):
            start = now()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_stage] += now() - start

        saved.append((cls, method, original))
        setattr(cls, method, timed)
    try:
        yield
    finally:
        for cls, method, original in saved:
            setattr(cls, method, original)


def stages(*, size: str, batch: int, rounds: int, steps: int = 3) -> dict[str, float]:
    """Median CPU milliseconds per step, over ``rounds`` interleaved rounds of ``steps`` steps of
    each engine: both steps, the DP step's stages, and what the DP step adds to the
    non-private one, part by part."""
    spent: dict[str, float] = defaultdict(float)
    times: dict[str, list[float]] = defaultdict(list)
    now = clock(torch.device("cpu"))
    with _timed_methods(spent):
        engines = {name: stepper(name, size=size, batch=batch) for name in ("nonprivate", "dpsgd")}
        try:
            for warm in (True,) + (False,) * rounds:
                for name, (step, _) in engines.items():
                    spent.clear()
                    start = now()
                    for _ in range(steps):
                        step()
                    if not warm:
                        times[f"{name} step"].append(1000 * (now() - start) / steps)
                        for stage, seconds in spent.items():
                            times[stage].append(1000 * seconds / steps)
        finally:
            for _, engine in engines.values():
                if hasattr(engine, "close"):
                    engine.close()
    missing = [stage for stage in STAGES if stage not in times]
    if missing:
        raise SystemExit(f"the DP step did not run {', '.join(missing)}: not on ghost clipping")
    ms = medians(times)
    ms["ratio"] = paired_ratio(times, "dpsgd step", "nonprivate step")
    # the DP step skips the weight and bias gradients (its parameters are frozen in the backward pass)
    ms["weight and bias gradients (non-private)"] = ms["non-private forward and backward"] - ms["forward and backward"]
    ms["added: products over those"] = ms["per-example products"] - ms["weight and bias gradients (non-private)"]
    ms["added: norms and bias sums"] = (ms["per-example gradients and norms"] - ms["per-example products"]
                                        - ms["LayerNorm closed form"])
    ms["added: clipped sum"] = (ms["micro-batch"] - ms["forward and backward"]
                                - ms["per-example gradients and norms"])
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--floor", action="store_true", help="the least the DP step can cost here (docstring)")
    parser.add_argument("--stages", action="store_true", help="the DP step by stage, unprofiled (docstring)")
    parser.add_argument("--rounds", type=int, default=15, help="with --floor or --stages: interleaved rounds")
    parser.add_argument("--launches", action="store_true", help="operations per step, kernels and views (docstring)")
    parser.add_argument("--as-accelerator", action="store_true",
                        help="with --launches: the noise as on an accelerator, one draw for all the step's sums")
    parser.add_argument("--bf16", action="store_true", help="with --launches: under bfloat16 autocast, as on a GPU")
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as the command line runs: freed tensors kept for the next step
    if args.launches:
        if args.as_accelerator:
            from dpaudit.train import sampling

            sampling.one_draw = lambda device: True
            GhostClippingEngine._stacks = lambda self: True
        counts = launches(size=args.size, batch=args.batch, autocast_dtype=torch.bfloat16 if args.bf16 else None)
        for name, count in counts.items():
            print(f"{name:<12} computing {count['computing']:>6}   metadata {count['metadata']:>6}")
        extra = {op: counts["dpsgd"]["by operator"].get(op, 0) - counts["nonprivate"]["by operator"].get(op, 0)
                 for op in set(counts["dpsgd"]["by operator"]) | set(counts["nonprivate"]["by operator"])}
        print("computing operations the DP step adds, by operator:")
        for op in sorted(extra, key=lambda op: -abs(extra[op]))[: args.top]:
            print(f"  {op:<38} {extra[op]:>+6}")
        return
    if args.floor or args.stages:
        ms = (floor if args.floor else stages)(size=args.size, batch=args.batch, rounds=args.rounds)
        for name, value in ms.items():
            print(f"{name:<40} {value:>9.3f}")
        return
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
