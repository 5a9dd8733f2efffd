"""Step-time ratios of DP-SGD, measured side by side in one process on the same model and batch.

    python benchmarks/bench_dpsgd.py                     # demo model (size small), length 128, batch 16
    python benchmarks/bench_dpsgd.py --size tiny --repeats 5 --lora

Prints (and with --json, emits as one JSON object on stdout):
  dpsgd / nonprivate : our DP-SGD step time over the non-private step time
  dpsgd / opacus     : our DP-SGD step time over Opacus's (same loop, Opacus computing the
                       private gradient), when Opacus is installed

A step is the gradient engine (per-example gradients, clipping, noise for DP) plus the
optimizer step, on a fixed batch of ``--batch`` sequences of ``--length`` random tokens.
The engines are timed in interleaved rounds and the median per-step time is reported, so
background load affects all of them alike. On CPU the default is one torch thread (see
``--threads``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from dpaudit.models import SIZES
from dpaudit.train.engine import DPSGDEngine, NonPrivateEngine


def build_model(size: str, vocab: int, seed: int, lora: bool):
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, **SIZES[size])
    model = GPT2LMHeadModel(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, fan_in_fan_out=True, task_type="CAUSAL_LM"))
    model.train()
    return model


def time_engine(cls, model, units, *, batch: int, microbatch: int, device, steps: int) -> list[float]:
    engine = cls(model, expected_batch_size=batch, microbatch_size=microbatch, pad_id=0, device=device,
                 noise_multiplier=1.0 if cls is not NonPrivateEngine else 0.0,
                 max_grad_norm=1.0 if cls is not NonPrivateEngine else float("inf"))
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(0)
    times = []
    try:
        for i in range(steps + 1):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            engine.step(units, generator)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i > 0:  # the first step warms up
                times.append(time.perf_counter() - start)
    finally:
        engine.close()
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--microbatch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per engine per round")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1; 0 = torch's default): with several threads on a "
                             "shared machine, OpenMP barriers stall whenever another process takes a core, "
                             "and small ops slow down by 10-100x at random")
    parser.add_argument("--no-opacus", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    model = build_model(args.size, args.vocab, 0, args.lora).to(device)
    generator = torch.Generator().manual_seed(1)
    units = [[torch.randint(1, args.vocab, (args.length,), generator=generator)] for _ in range(args.batch)]

    engines = {"nonprivate": NonPrivateEngine, "dpsgd": DPSGDEngine}
    if not args.no_opacus:
        try:
            from dpaudit.train.opacus import OpacusEngine

            engines["opacus"] = OpacusEngine
        except Exception as err:  # noqa: BLE001 - an optional extra
            print(f"opacus not available: {err}", file=sys.stderr)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(args.rounds):
        for name, cls in engines.items():
            times[name] += time_engine(cls, model, units, batch=args.batch, microbatch=args.microbatch,
                                       device=device, steps=args.repeats)
            print(f"round {round_ + 1}/{args.rounds} {name}: {statistics.median(times[name]):.3f} s/step",
                  file=sys.stderr)
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "model": f"gpt2-{args.size}" + ("+lora" if args.lora else ""),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "length": args.length,
        "microbatch": args.microbatch,
        "seconds_per_step": median,
        "dpsgd_over_nonprivate": median["dpsgd"] / median["nonprivate"],
    }
    if "opacus" in median:
        result["dpsgd_over_opacus"] = median["dpsgd"] / median["opacus"]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"model {result['model']} on {device} ({result['threads']} threads), batch {args.batch} x {args.length} tokens")
        for name, value in median.items():
            print(f"  {name:<10} {value * 1000:9.1f} ms/step")
        print(f"  dpsgd / nonprivate = {result['dpsgd_over_nonprivate']:.2f}")
        if "dpsgd_over_opacus" in result:
            print(f"  dpsgd / opacus     = {result['dpsgd_over_opacus']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
