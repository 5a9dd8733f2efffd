"""How close do the one-run black-box bounds come to the accountant's epsilon on DP models?

    python benchmarks/bench_audit_power.py [--fine-tune] [--canaries M] [--run DIR] [--out DIR] [--trials 20] [--json]

Trains the demo preset's DP-SGD models at epsilon 1, 4 and 16 (note level, one run; with
``--run DIR``, reads a finished ``dpaudit run`` instead) and prints, per model:

* the best sound bound and its ratio to epsilon, per method and per attack;
* the idealized ceiling: the median one-run bound that m canaries give when each is an
  exact Gaussian mechanism at the model's epsilon (delta) and the attack sees the exact
  score, simulated over ``--trials`` draws with the same significance and guess grid;
* beside it, the order-statistics estimate (Xiang et al. 2025, arXiv 2509.08704) on the
  same simulated scores: what a test that assumes independent canaries would read there;
* the final-model ideal: the sound bound and the DP-SGD family test for an attack that
  sees each canary's last-iterate statistic exactly (simulated), the most a black-box
  audit of this training regime can show with m canaries;
* the last-iterate heuristic epsilon (Steinke et al. 2025, arXiv 2410.06186), what any
  audit of the final model alone can hope to show.

By default the models are trained in the design ``dpaudit validate`` uses (``ISOLATED`` and
``LINEAR`` of ``dpaudit.stages.validate``): 4,096 (``--canaries``, at most 4,096)
``new_token_bare`` canaries, only the input embedding trains, by plain SGD at learning rate
0.01, full-batch DP-SGD (q = 1, 10 steps: the regime whose last iterate shows the most), and
the reference attack calibrated by the base model alone. ``--fine-tune`` trains the demo's
own DP models instead: every parameter, its prefixed canaries, its DP regime and attacks.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np

MODELS = ("dp-eps1", "dp-eps4", "dp-eps16")


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The mu of the Gaussian mechanism that is exactly (epsilon, delta)-DP (Dong, Roth, Su 2019)."""
    from scipy.optimize import brentq

    from dpaudit.audit import gdp_delta

    return brentq(lambda mu: gdp_delta(mu=mu, epsilon=epsilon) - delta, 1e-6, 100.0)


def idealized_ceiling(*, epsilon: float, delta: float, m: int, significance: float, trials: int, seed: int = 0):
    """Median and spread of the one-run bound of m exact Gaussian mechanisms at epsilon, and
    the median order-statistics estimate on the same scores (independent channels, where it
    is exact)."""
    from dpaudit.audit import CanaryScores

    mu = gaussian_mu(epsilon, delta)
    rng = np.random.default_rng(seed)
    values, estimates = [], []
    for _ in range(trials):
        member = rng.random(m) < 0.5
        scores = rng.normal(mu * member, 1.0)
        cs = CanaryScores(in_scores=scores[member], out_scores=scores[~member], seed=0)
        values.append(cs.bound("one_run", delta=delta, significance=significance).epsilon)
        estimates.append(cs.bound("order_statistics", delta=delta, significance=significance).epsilon)
    return float(np.median(values)), float(np.min(values)), float(np.max(values)), float(np.median(estimates))


def final_model_ideal(*, sigma: float, q: float, steps: int, m: int, delta: float, significance: float, trials: int,
                      seed: int = 0):
    """Medians of the sound bound and the DP-SGD family test for the best conceivable
    black-box attack on the final model, and the family test's range over the trials: each
    canary's score is the last-iterate statistic of linear losses (Steinke et al. 2025, arXiv
    2410.06186), k + N(0, T sigma^2) with k ~ Binomial(T, q) the steps that sampled it (0 when
    left out)."""
    from dpaudit.audit import CanaryScores, claimed_curve_bound

    rng = np.random.default_rng(seed)
    one_run, family = [], []
    for _ in range(trials):
        member = rng.random(m) < 0.5
        scores = rng.binomial(steps, q, size=m) * member + rng.normal(0.0, math.sqrt(steps) * sigma, size=m)
        cs = CanaryScores(in_scores=scores[member], out_scores=scores[~member], seed=0)
        one_run.append(cs.bound("one_run", delta=delta, significance=significance).epsilon)
        family.append(claimed_curve_bound(cs, noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta,
                                          significance=significance).epsilon)
    return float(np.median(one_run)), float(np.median(family)), (float(np.min(family)), float(np.max(family)))


def measure(report: dict, *, trials: int) -> list[dict]:
    rows = []
    for m in report["models"]:
        if m["privacy"] != "dp" or m["error"]:
            continue
        eps, delta = m["dp"]["epsilon"], m["dp"]["delta"]
        bounds = {}
        for attack, a in m["canary_attacks"].items():
            for method, b in a["bounds"].items():
                bounds[f"{attack}/{method}"] = {"epsilon": b["epsilon"], "sound": b["sound"],
                                                "ratio": b["epsilon"] / eps}
        audit = m["audit"]
        # the attack stage's level per test: 0.05 over the attacks and its two sound tests
        sig = (audit["significance"] or 0.05) / max(1, len(m["canary_attacks"])) / 2
        ideal = idealized_ceiling(epsilon=eps, delta=delta, m=audit["num_canaries"] or report["canaries"]["count"],
                                  significance=sig, trials=trials)
        final = final_model_ideal(sigma=m["dp"]["noise_multiplier"], q=m["dp"]["sample_rate"], steps=m["dp"]["steps"],
                                  m=audit["num_canaries"] or report["canaries"]["count"], delta=delta,
                                  significance=sig, trials=max(3, trials // 4))
        rows.append({
            "model": m["name"], "epsilon": eps, "delta": delta, "sigma": m["dp"]["noise_multiplier"],
            "sample_rate": m["dp"]["sample_rate"], "steps": m["dp"]["steps"],
            "best_sound_bound": audit["epsilon_lower_bound"], "method": audit["method"], "attack": audit["attack"],
            "ratio": None if audit["epsilon_lower_bound"] is None else audit["epsilon_lower_bound"] / eps,
            "canary_auc": {k: a["auc"] for k, a in m["canary_attacks"].items()},
            "ceiling": audit["ceiling"], "idealized_ceiling": ideal[0], "idealized_range": ideal[1:3],
            "idealized_order_statistics": ideal[3], "final_model_ideal_one_run": final[0],
            "final_model_ideal_family": final[1], "final_model_ideal_family_range": final[2],
            "last_iterate_epsilon": m["dp"]["last_iterate_epsilon"], "heldout_perplexity":
                m["utility"]["heldout_perplexity"], "bounds": bounds,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a finished run directory to read instead of training")
    parser.add_argument("--out", type=Path, help="where to train (default: a temporary directory)")
    parser.add_argument("--fine-tune", action="store_true", help="the demo's own design: full fine-tuning")
    parser.add_argument("--canaries", type=int, help="canaries (default and most: 4,096; not with --fine-tune)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.fine_tune and args.canaries is not None:
        parser.error("--canaries goes with validate's design; --fine-tune keeps the demo's canaries")

    import dpaudit
    from dpaudit.config import load_config
    from dpaudit.stages.validate import FULL_BATCH_STEPS, ISOLATED, LINEAR, full_batch_size

    if args.run is None:
        out = args.out or Path(tempfile.mkdtemp(prefix="dpaudit-power-")) / "run"
        overrides = ["fleet.num_models=0"]
        if args.fine_tune:
            demo = {m.name: m.train for m in load_config("demo").models}
            models = "models=" + json.dumps([{"name": n, "train": demo[n]} for n in MODELS])
        else:
            overrides += [*ISOLATED, *LINEAR, f"canaries.num={args.canaries or 4096}", "attack.attacks=[reference]"]
            batch = full_batch_size(load_config("demo", overrides=overrides))
            models = "models=" + json.dumps([{"name": n, "train": {
                "trainer": "dpaudit.train:dpsgd", "dp": {"target_epsilon": float(n.rsplit("eps", 1)[1])},
                "batch_size": batch, "steps": FULL_BATCH_STEPS}} for n in MODELS])
        result = dpaudit.run(load_config("demo", overrides=[models, *overrides]), out=out)
        run = result.rundir.root
    else:
        run = args.run
    report = json.loads((Path(run) / "report.json").read_text())
    rows = measure(report, trials=args.trials)
    if args.json:
        print(json.dumps({"run": str(run), "models": rows}, indent=2, default=float))
        return
    print(f"run: {run}")
    head = f"{'model':<16}{'eps':>7}{'sigma':>7}{'q':>7}{'T':>5}{'best sound':>12}{'ratio':>7}" \
           f"{'ceiling':>9}{'ideal':>7}{'ideal OS':>9}{'final':>7}{'family':>7}{'(range)':>12}{'last-it.':>9}{'ppl':>7}  best by"
    print(head)
    for r in rows:
        b = r["best_sound_bound"]
        print(f"{r['model']:<16}{r['epsilon']:>7.2f}{r['sigma']:>7.2f}{r['sample_rate']:>7.3f}{r['steps']:>5}"
              f"{(b if b is not None else math.nan):>12.3f}{(r['ratio'] or 0):>7.2f}{r['ceiling'] or math.nan:>9.2f}"
              f"{r['idealized_ceiling']:>7.2f}{r['idealized_order_statistics']:>9.2f}"
              f"{r['final_model_ideal_one_run']:>7.2f}{r['final_model_ideal_family']:>7.2f}"
              f"{'%.2f-%.2f' % tuple(r['final_model_ideal_family_range']):>12}"
              f"{r['last_iterate_epsilon'] or math.nan:>9.2f}"
              f"{r['heldout_perplexity'] or math.nan:>7.2f}  {r['attack']}/{r['method']}")
    print("\nper attack and method (epsilon, ratio to the accountant's; * = sound):")
    for r in rows:
        cells = ", ".join(f"{k}{'*' if v['sound'] else ''} {v['epsilon']:.2f} ({v['ratio']:.2f})"
                          for k, v in sorted(r["bounds"].items()))
        print(f"  {r['model']}: {cells}")


if __name__ == "__main__":
    main()
