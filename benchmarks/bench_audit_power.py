"""How close does each rung of the threat-model ladder come to the accountant's epsilon?

    python benchmarks/bench_audit_power.py --run RUN [--run RUN ...] [--json]
    python benchmarks/bench_audit_power.py --seeds 3 --out DIR [--json]
    python benchmarks/bench_audit_power.py --run RUN --ladder-seeds 3 [--json]
    python benchmarks/bench_audit_power.py --run RUN [--run RUN ...] --own-share 0.13
    python benchmarks/bench_audit_power.py --run RUN [--run RUN ...] --ideal-draws 40

Reads the ladder (``report.json``: ``models[i].rungs``) of finished ``dpaudit run``s, or first
trains the default demo (``dpaudit run``, its ladder on) with the seeds 0 .. N-1 into
``DIR/seed-K``, and prints, for every DP model and rung, the bound over the runs (median and
range), its ratio to the accountant's epsilon and to the rung's own ideal (the median bound
of the same tests on the ideal scores of the rung's regime, a perfect attack on a run that
keeps the claim: ``dpaudit.audit.ladder``; the report's ``rungs[].ideal``), then the goals,
each with the figures that meet it or not. ``--own-share S`` adds, for the released rung, a
perfect attack on canaries that own only S of their squared gradient norm. ``--ladder-seeds K``
adds, for each ``--run``, K - 1 copies of it (hard links, ``RUN-ladder-seed-S``) whose ladder
alone is redone with seed S: the twins' training, their canaries and the gradient canaries'
noise are drawn again, the released models are the run's own (their rung does not change).
``--ideal-draws N`` draws each released rung's ideal N times: how often a perfect attack on its
regime reaches 0.8 of its own median (one run's bound spreads that far by chance alone), and
sets each run's best canary AUC beside a perfect attack's on its regime (20,000 canaries): the
share of the perfect attack's AUC above 0.5 that the attack reaches, free of that spread.

The goals:

- the strongest rung reaches at least 0.45 at epsilon 1, 2.4 at epsilon 4, and 0.6 epsilon at
  the largest epsilon whose claim is testable;
- every rung reaches at least 0.8 times its own ideal;
- the released model's rung is above 0 on at least the largest-epsilon DP model.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

GOALS = {1.0: 0.45, 4.0: 2.4}  # epsilon -> the strongest rung's bound it must reach
LARGEST_RATIO = 0.6  # at the largest testable epsilon: 0.6 epsilon
IDEAL_RATIO = 0.8  # every rung: 0.8 x its own ideal


def train(seeds: int, out: Path) -> list[Path]:
    """The default demo with seeds 0 .. seeds-1 (resumed where they are in place)."""
    import dpaudit
    from dpaudit.config import load_config

    runs = []
    for seed in range(seeds):
        result = dpaudit.run(load_config("demo", overrides=[f"seed={seed}"]), out=out / f"seed-{seed}")
        runs.append(result.rundir.root)
    return runs


def reseed_ladders(run: Path, seeds: int) -> list[Path]:
    """``seeds - 1`` copies of the finished run ``run`` with the ladder redone at seeds 1 ..
    seeds-1 (resumed where a copy is complete)."""
    import dataclasses
    import shutil
    import subprocess

    from dpaudit.rundir import RunDir
    from dpaudit.stages import run as run_stage
    from dpaudit.stages.ladder import TWIN_DIR, ladder_run
    from dpaudit.stages.report import build_report

    copies = []
    for seed in range(1, seeds):
        copy = run.parent / f"{run.name}-ladder-seed-{seed}"
        if not (copy / "report.json").is_file():
            shutil.rmtree(copy, ignore_errors=True)
            subprocess.run(["cp", "-al", str(run), str(copy)], check=True)
            shutil.rmtree(copy / TWIN_DIR, ignore_errors=True)
            (copy / "report.json").unlink()
            rundir = RunDir(copy)
            config = rundir.read_config()
            for name in config.model_names():
                rundir.model(name).ladder_path.unlink(missing_ok=True)
            ladder_run(rundir, dataclasses.replace(config, seed=seed), run=run_stage)
            build_report(rundir)
        copies.append(copy)
    return copies


def collect(runs: list[Path]) -> dict[str, dict]:
    """``{model: {"epsilon", "unit", "verdicts", "rungs": {rung: {"bounds", "ideals", "refused"}}}}``."""
    models: dict[str, dict] = {}
    for run in runs:
        report = json.loads((Path(run) / "report.json").read_text())
        for m in report["models"]:
            if m["privacy"] != "dp" or m["error"]:
                continue
            entry = models.setdefault(m["name"], {"epsilon": m["dp"]["epsilon"], "unit": m["dp"]["unit"],
                                                  "verdicts": [], "rungs": {}, "canary_auc": [], "attacks": 0})
            entry["verdicts"].append(m["verdict"]["status"])
            aucs = [a["auc"] for a in (m.get("canary_attacks") or {}).values() if a]
            entry["canary_auc"].append(max(aucs, default=math.nan))
            entry["attacks"] = len(aucs)
            for r in m.get("rungs", []):
                cell = entry["rungs"].setdefault(r["rung"], {"bounds": [], "ideals": [], "refused": [], "rungs": [],
                                                             "runs": []})
                if r["epsilon"] is None:
                    cell["refused"].append(r["refused"])
                else:
                    cell["bounds"].append(r["epsilon"])
                    cell["ideals"].append(r["ideal"])
                    cell["rungs"].append(r)
                    cell["runs"].append((str(run), entry["canary_auc"][-1]))  # (run, its best canary AUC)
    return models


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{np.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def share_ideal(rung: dict, *, share: float, attacks: int, trials: int = 15) -> tuple[float, float]:
    """(median bound, mean AUC) of the released rung's tests on ideal scores whose inclusions
    each count ``sqrt(share)``: what a perfect attack shows when only ``share`` of a canary's
    squared clipped-gradient norm is its own (its own rows'; ``bench_canary_levers.py`` prints
    it) and the rest, on the shared weights, tells nothing (docs/ceilings.md)."""
    from sklearn.metrics import roc_auc_score

    from dpaudit.audit.canary_scores import CanaryScores
    from dpaudit.audit.ladder import ideal_scores, rung_bound

    g = rung["regime"]
    family = {"noise_multiplier": g["noise_multiplier"], "sample_rate": g["sample_rate"], "steps": g["steps"]}
    rng, bounds, aucs = np.random.default_rng(0), [], []
    for _ in range(trials):
        member = rng.random(rung["num_canaries"]) < 0.5
        s = ideal_scores(rng, member=member, **family, signal=np.full(g["steps"], math.sqrt(share)))
        aucs.append(roc_auc_score(member, s))
        cs = CanaryScores.from_labels(scores=s, is_member=member, seed=0)
        bounds.append(rung_bound(cs, methods=("one_run", "claimed_curve"), **family, delta=g["delta"],
                                 significance=rung["significance"] / max(1, attacks)).epsilon)
    return float(np.median(bounds)), float(np.mean(aucs))


def _released(models: dict[str, dict]):
    """(model, its entry, its released rung's cell) of every model whose released rung has a bound."""
    for m, e in models.items():
        c = e["rungs"].get("released")
        if c and c["rungs"]:
            yield m, e, c


def ideal_spread(run: Path, model: str, rung: dict, *, attacks: int, draws: int) -> list[float]:
    """``draws`` bounds of a perfect attack on the released rung's regime, its optimizer
    included (``dpaudit.audit.ladder.ideal_bounds``, as the ladder computes its ideal): how
    far one run's bound falls from the median by chance alone."""
    from dpaudit.audit.ladder import ideal_bounds
    from dpaudit.rundir import RunDir
    from dpaudit.train.plan import optimizer_response

    g = rung["regime"]
    train = RunDir(run).read_config().for_model(model).train
    return ideal_bounds(noise_multiplier=g["noise_multiplier"], sample_rate=g["sample_rate"], steps=g["steps"],
                        num_canaries=rung["num_canaries"], delta=g["delta"],
                        significance=rung["significance"] / max(1, attacks), methods=("one_run", "claimed_curve"),
                        trials=draws, seed=1, optimizer=optimizer_response(train, g["steps"]))


def perfect_auc(run: Path, model: str, rung: dict, *, canaries: int = 20_000, signal=None) -> float:
    """The canary AUC of a perfect attack on the released rung's regime, its optimizer included
    (``dpaudit.audit.ladder.ideal_scores``), over ``canaries`` canaries: what the rung's best
    attack would read if it were perfect, without the spread of one run's 1,000 canaries. With
    ``signal`` (per step, the norm of a sampled canary's clipped gradient on its own row), a
    perfect attack on canaries that keep only that much (``benchmarks/bench_canary_reads.py``)."""
    from sklearn.metrics import roc_auc_score

    from dpaudit.audit.ladder import ideal_scores
    from dpaudit.rundir import RunDir
    from dpaudit.train.plan import optimizer_response

    g = rung["regime"]
    train = RunDir(run).read_config().for_model(model).train
    rng = np.random.default_rng(2)
    member = rng.random(canaries) < 0.5
    scores = ideal_scores(rng, member=member, noise_multiplier=g["noise_multiplier"], sample_rate=g["sample_rate"],
                          steps=g["steps"], optimizer=optimizer_response(train, g["steps"]), signal=signal)
    return float(roc_auc_score(member, scores))


def goals(models: dict[str, dict]) -> list[dict]:
    """Each goal of the issue with its figures (every bound over the runs) and whether it holds."""
    out = []
    note = {m: e for m, e in models.items() if e["unit"] == "example"}
    strongest = {m: [max(vals) for vals in zip(*[c["bounds"] for c in e["rungs"].values() if c["bounds"]])]
                 for m, e in note.items()}
    for eps, target in GOALS.items():
        for m, e in note.items():
            if math.isclose(e["epsilon"], eps, rel_tol=1e-3):
                out.append({"goal": f"strongest rung >= {target} at epsilon {eps:g}", "model": m,
                            "values": strongest[m], "met": bool(strongest[m]) and min(strongest[m]) >= target})
    testable = [m for m, e in note.items() if all(v != "inconclusive" for v in e["verdicts"])]
    if testable:
        m = max(testable, key=lambda n: note[n]["epsilon"])
        target = LARGEST_RATIO * note[m]["epsilon"]
        out.append({"goal": f"strongest rung >= {LARGEST_RATIO} epsilon at the largest testable epsilon "
                            f"({note[m]['epsilon']:g})", "model": m, "values": strongest[m],
                    "met": bool(strongest[m]) and min(strongest[m]) >= target})
    for m, e in models.items():
        for rung, c in e["rungs"].items():
            ratios = [b / ideal for b, ideal in zip(c["bounds"], c["ideals"]) if ideal]
            out.append({"goal": f"{rung} >= {IDEAL_RATIO} x its ideal", "model": m, "values": ratios,
                        # an ideal of 0 on every run: a perfect attack shows nothing, the goal says nothing
                        "met": None if c["bounds"] and not ratios else
                        bool(ratios) and float(np.median(ratios)) >= IDEAL_RATIO})
    largest = max(note, key=lambda n: note[n]["epsilon"], default=None)
    if largest is not None:
        released = note[largest]["rungs"].get("released", {}).get("bounds", [])
        out.append({"goal": "released rung > 0 at the largest epsilon", "model": largest, "values": released,
                    "met": bool(released) and min(released) > 0})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, action="append", default=[], help="a finished run directory (repeatable)")
    parser.add_argument("--seeds", type=int, help="train the demo with this many seeds first")
    parser.add_argument("--out", type=Path, help="where --seeds trains (DIR/seed-K)")
    parser.add_argument("--ladder-seeds", type=int, help="redo each run's ladder with this many seeds in all")
    parser.add_argument("--own-share", type=float, help="also compare the released rung with a perfect attack on "
                        "canaries that own this share of their squared gradient norm (e.g. 0.13)")
    parser.add_argument("--ideal-draws", type=int, help="also draw the released rung's ideal this many times: "
                        "how often a perfect attack reaches 0.8 of its own median")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.seeds:
        if args.out is None:
            parser.error("--seeds needs --out")
        args.run += train(args.seeds, args.out)
    if not args.run:
        parser.error("give --run RUN (repeatable) or --seeds N --out DIR")
    if args.ladder_seeds:
        args.run += [c for r in list(args.run) for c in reseed_ladders(r, args.ladder_seeds)]
    models = collect(args.run)
    checked = goals(models)
    if args.json:
        print(json.dumps({"runs": [str(r) for r in args.run], "models": models, "goals": checked}, indent=2))
        return
    print(f"{len(args.run)} run(s): {', '.join(str(r) for r in args.run)}")
    print(f"{'model':<16}{'epsilon':>8}  {'rung':<12}{'bound median [range]':>24}{'/ epsilon':>10}"
          f"{'ideal':>24}{'/ ideal':>10}")
    for m, e in models.items():
        for rung, c in e["rungs"].items():
            if not c["bounds"]:
                print(f"{m:<16}{e['epsilon']:>8.2f}  {rung:<12} refused: {c['refused'][0]}")
                continue
            b = float(np.median(c["bounds"]))
            ideal = float(np.median(c["ideals"])) if all(x for x in c["ideals"]) else math.nan
            print(f"{m:<16}{e['epsilon']:>8.2f}  {rung:<12}{_spread(c['bounds']):>24}{b / e['epsilon']:>10.2f}"
                  f"{_spread([x for x in c['ideals'] if x is not None]):>24}{b / ideal:>10.2f}")
    if args.own_share:
        print(f"\nreleased rung against a perfect attack (AUC: the best attack's on the canaries, median over the runs;"
              f" ideal: every inclusion whole; own rows: {args.own_share:g} of the squared norm)")
        for m, e, c in _released(models):
            whole = [share_ideal(r, share=1.0, attacks=e["attacks"]) for r in c["rungs"]]
            own = [share_ideal(r, share=args.own_share, attacks=e["attacks"]) for r in c["rungs"]]
            print(f"  {m:<16} bound {_spread(c['bounds'])}, AUC {np.nanmedian(e['canary_auc']):.3f};"
                  f" ideal {np.median([w[0] for w in whole]):.2f} (AUC {np.median([w[1] for w in whole]):.3f});"
                  f" own rows {np.median([o[0] for o in own]):.2f} (AUC {np.median([o[1] for o in own]):.3f})")
    if args.ideal_draws:
        print("\nreleased rung's attack against a perfect one on each run's regime (canary AUC: the best of the"
              " attacks; a perfect attack's over 20,000 canaries): the share of the perfect attack's AUC above 0.5"
              " that the best attack reaches, a measure of the attack that one run's bound spread does not blur")
        for m, e, c in _released(models):
            shares = []
            for (run, auc), r in zip(c["runs"], c["rungs"]):
                perfect = perfect_auc(Path(run), m, r)
                shares.append((auc - 0.5) / (perfect - 0.5))
                print(f"  {m:<16} {run}: AUC {auc:.3f}, perfect {perfect:.3f}, share {shares[-1]:.2f}")
            print(f"  {m:<16} share median {np.median(shares):.2f} [{min(shares):.2f}, {max(shares):.2f}]")
        print(f"\nreleased rung's ideal over {args.ideal_draws} draws (a perfect attack on the regime of the first run,"
              f" its optimizer included): median [quartiles], and the share of draws at {IDEAL_RATIO} of the median or more")
        for m, e, c in _released(models):
            b = np.asarray(ideal_spread(args.run[0], m, c["rungs"][0], attacks=e["attacks"], draws=args.ideal_draws))
            med = float(np.median(b))
            print(f"  {m:<16} {med:.2f} [{np.quantile(b, 0.25):.2f}, {np.quantile(b, 0.75):.2f}],"
                  f" {np.mean(b >= IDEAL_RATIO * med):.2f} of draws at {IDEAL_RATIO} x median or more")
    print("\ngoals:")
    for g in checked:
        values = ", ".join(f"{v:.2f}" for v in g["values"]) or "none"
        status = "n/a    " if g["met"] is None else "met    " if g["met"] else "NOT met"
        values = "its ideal is 0 on every run" if g["met"] is None else values
        print(f"  {status}  {g['model']}: {g['goal']} ({values})")


if __name__ == "__main__":
    main()
