"""Time all four epsilon bounds for m = 10,000 canaries (Gaussian scores, known mu).

    python benchmarks/bench_bounds.py [--m 10000] [--mu 2.0] [--seed 0]

Prints, for each bound, the seconds taken (best of 3) by the pure function on one set
of counts, and by the CanaryScores method with the default Bonferroni strategy (which
evaluates every grid candidate). The issue's target: all four pure bounds together in
under a second.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpaudit.audit import (
    CanaryScores,
    epsilon_clopper_pearson,
    epsilon_from_gdp,
    epsilon_one_run,
    epsilon_one_run_fdp,
    gdp_epsilon,
)


def _best_of(fn, repeats: int = 3):
    best, value = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=10_000)
    parser.add_argument("--mu", type=float, default=2.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    member = rng.random(args.m) < 0.5
    scores = rng.normal(args.mu * member, 1.0)
    ins, outs = scores[member], scores[~member]
    delta = args.delta
    print(f"m={args.m} canaries ({ins.size} in, {outs.size} out), scores N(mu={args.mu},1) vs N(0,1), "
          f"delta={delta:g}, true epsilon {gdp_epsilon(mu=args.mu, delta=delta):.3f}")

    # Counts for the pure functions: a median threshold, and the top/bottom 10% as guesses.
    thr = np.median(scores)
    tp, fn = int(np.sum(ins > thr)), int(np.sum(ins <= thr))
    fp, tn = int(np.sum(outs > thr)), int(np.sum(outs <= thr))
    order = np.argsort(scores)
    k = args.m // 20
    correct = int(member[order[-k:]].sum() + (~member[order[:k]]).sum())
    one_run_counts = dict(num_canaries=args.m, num_guesses=2 * k, num_correct=correct, delta=delta)
    pure = {
        "epsilon_clopper_pearson": lambda: epsilon_clopper_pearson(tp=tp, fp=fp, tn=tn, fn=fn, delta=delta),
        "epsilon_one_run": lambda: epsilon_one_run(**one_run_counts),
        "epsilon_one_run_fdp": lambda: epsilon_one_run_fdp(**one_run_counts),
        "epsilon_from_gdp": lambda: epsilon_from_gdp(tp=tp, fp=fp, tn=tn, fn=fn, delta=delta),
    }
    total = 0.0
    print(f"\npure functions (one set of counts; {2 * k} guesses, {correct} correct):")
    for name, fn_ in pure.items():
        sec, eps = _best_of(fn_)
        total += sec
        print(f"  {name:26s} {sec:8.4f} s   epsilon >= {eps:.3f}")
    print(f"  {'all four':26s} {total:8.4f} s")

    cs = CanaryScores(in_scores=ins, out_scores=outs, seed=args.seed)
    total = 0.0
    print("\nCanaryScores methods (default Bonferroni strategy, every grid candidate):")
    for name in ("epsilon_clopper_pearson", "epsilon_one_run", "epsilon_one_run_fdp", "epsilon_gdp"):
        sec, res = _best_of(lambda n=name: getattr(cs, n)(delta=delta))
        total += sec
        print(f"  {name:26s} {sec:8.4f} s   epsilon >= {res.epsilon:.3f}")
    print(f"  {'all four':26s} {total:8.4f} s")


if __name__ == "__main__":
    main()
