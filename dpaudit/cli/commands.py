"""The commands of the command line: each parses nothing, calls a stage, prints, and returns its
exit status (:class:`dpaudit.errors.ExitCode`). With ``--json`` a command prints exactly one
JSON object on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path

from dpaudit.errors import ExitCode, InputError


def _emit(args: argparse.Namespace, obj: dict, text: str) -> None:
    """One JSON object on stdout with --json, else the human summary."""
    print(json.dumps(obj, indent=2) if args.json else text, file=getattr(args, "stdout", None) or sys.stdout)


# --------------------------------------------------------------------------- commands


def cmd_train(args: argparse.Namespace) -> int:
    from dpaudit.config import load_config
    from dpaudit.stages import run

    config = load_config(args.config, overrides=args.overrides)
    result = run(config, out=args.out, force=args.force, until="train", command=sys.argv)
    rows = []
    for md in (result.rundir.model(n) for n in config.model_names()):
        log = [r for r in md.read_train_log() if r.get("heldout_perplexity") is not None]
        rows.append({"name": md.name, "trained": md.is_trained(), "error": result.failed.get(md.name),
                     "heldout_perplexity": log[-1]["heldout_perplexity"] if log else None})
    text = "\n".join(f"{r['name']}: " + (f"failed: {r['error']}" if r["error"] else
                                        f"held-out perplexity {_fmt(r['heldout_perplexity'], '.2f')}") for r in rows)
    _emit(args, {"run_dir": str(result.rundir.root), "models": rows}, f"{text}\ntrained in {result.rundir.root}")
    return ExitCode.OK if result.ok else ExitCode.FAILED


def cmd_run(args: argparse.Namespace) -> int:
    from dpaudit.config import load_config
    from dpaudit.stages import run

    config = load_config(args.config, overrides=args.overrides)
    out = Path(args.out or f"runs/{Path(args.config).stem}-{datetime.now():%Y%m%d-%H%M%S}")
    args.out = str(out)  # named by the line that says how to resume after Ctrl-C
    result = run(config, out=out, force=args.force, command=sys.argv)
    return _finish_audit(args, out, result.report)


def cmd_attack(args: argparse.Namespace) -> int:
    from dpaudit.stages import attack_run

    names = _attack_names(args.attacks)
    result = attack_run(args.run_dir, attacks=names)
    models = {name: md.read_results() for name in result.rundir.read_config().model_names()
              if (md := result.rundir.model(name)).results_dir.is_dir()}
    summary = {name: {a: r["splits"]["members"] for a, r in res.items() if names is None or a in names}
               for name, res in models.items()}
    text = "\n\n".join(f"{name}:\n{_attack_table(s)}" for name, s in summary.items())
    _emit(args, {"run_dir": str(args.run_dir), "models": summary, "failed": result.failed}, text)
    return ExitCode.OK if result.ok else ExitCode.FAILED


def cmd_extract(args: argparse.Namespace) -> int:
    from dpaudit.stages.extract import JSON_KEYS, extract_run

    results = extract_run(args.run_dir, force=args.force)
    models = {name: {k: r.get(k) for k in JSON_KEYS} for name, r in results.items()}
    lines = []
    for name, r in models.items():
        parts = [(f"new-token canaries extracted {r['included_extracted']}/{r['included_total']} included, "
                  f"{r['excluded_extracted']}/{r['excluded_total']} excluded")]
        for g in r["by_repetitions"] or []:
            parts.append(f"secret canaries x{g['repetitions']}: mean exposure {g['mean_exposure']:.1f} of "
                         f"{r['space_bits']:.1f} bits, greedy {g['extracted']:.0%}, sampled {g['extracted_sampled']:.0%}")
        for field, v in ((r["pii"] or {}).get("members") or {}).items():
            h = r["pii"]["heldout"].get(field) or {}
            parts.append(f"{field}: members {v['extracted']}/{v['num']}, held-out {h.get('extracted')}/{h.get('num')}")
        k = r["k_extractable"] or {}
        if k:
            parts.append(f"{k['k']}-extractable: members {_fmt(k['members']['fraction'], '.1%')}, "
                         f"held-out {_fmt(k['heldout']['fraction'], '.1%')}")
        lines.append(f"{name}:\n  " + "\n  ".join(parts))
    _emit(args, {"run_dir": str(args.run_dir), "models": models}, "\n".join(lines) or "no trained models")
    return ExitCode.OK


def cmd_audit_model(args: argparse.Namespace) -> int:
    from dpaudit.stages.audit_model import audit_model
    from dpaudit.stages.report import build_report

    if args.batch_size <= 0 or args.max_length <= 0:
        raise InputError("--batch-size and --max-length must be positive")
    given = [f for f, v in (("--reference-base", args.reference_base), ("--reference-config", args.reference_config),
                            ("--reference-design", args.reference_design)) if v is not None]
    if given and not args.train_references:
        raise InputError(f"{', '.join(given)} go with --train-references N")
    audit_model(
        args.model_dir,
        members=args.members,
        nonmembers=args.nonmembers,
        reference_models=args.reference_models,
        population=args.population,
        train_references=args.train_references,
        reference_base=args.reference_base,
        reference_config=args.reference_config,
        reference_design=args.reference_design or "online",
        out=args.out,
        attacks=_attack_names(args.attacks),
        batch_size=args.batch_size,
        max_length=args.max_length,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        choose=_ask_references if sys.stdin.isatty() and sys.stderr.isatty() else None,
    )
    report = build_report(args.out, include_texts=args.include_texts)
    return _finish_audit(args, Path(args.out), report)


def _ask_references(estimate, n: int) -> int | None:
    """On a terminal, after the cost line: how many reference models to train (Enter: ``n``;
    a smaller number; q: stop). The prompt goes to stderr, so that stdout keeps its JSON."""
    hint = f" (e.g. {estimate.smaller})" if estimate.smaller else ""
    while True:
        print(f"dpaudit audit-model: train {n} reference models? [Enter: {n}, a smaller number{hint}, q: stop] ",
              end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        if not answer or answer.strip().lower() in ("q", "quit", "n", "no"):
            return None
        answer = answer.strip()
        if not answer or answer.lower() in ("y", "yes"):
            return n
        if answer.isdigit() and 1 <= int(answer) <= n:
            return int(answer)
        print(f"dpaudit audit-model: a number from 1 to {n}, Enter or q", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    from dpaudit.stages.validate import JSON_KEYS, validate

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # the user's trainer module, as `python -m` would find it
    if args.step is not None:
        return _validate_step(args)
    step_only = [f for f, v in (("--noise-multiplier", args.noise_multiplier), ("--max-grad-norm", args.max_grad_norm),
                                ("--expected-batch-size", args.expected_batch_size), ("--sample-rate", args.sample_rate),
                                ("--steps", args.steps), ("--model", args.model), ("--model-dir", args.model_dir),
                                ("--arch", args.arch)) if v is not None]
    step_only += [f for f, v in (("--untied", args.untied), ("--trust-remote-code", args.trust_remote_code)) if v]
    if step_only:
        raise InputError(f"{', '.join(step_only)} go with --step, not --trainer")
    if args.epsilon is None or args.delta is None:
        raise InputError("--trainer needs the claim: --epsilon E --delta D")
    out = Path(args.out or f"runs/validate-{datetime.now():%Y%m%d-%H%M%S}")
    result = validate(trainer=args.trainer, epsilon=args.epsilon, delta=args.delta, canaries=args.canaries,
                      config=args.config, overrides=args.overrides, full_batch=args.full_batch, out=out,
                      command=sys.argv)
    text = (f"{result['verdict']}: {result['reason']}\n"
            f"lower bound {_fmt(result['epsilon_lower_bound'], '.3f')} ({result['method'] or 'no sound bound'}) "
            f"against the claim {args.epsilon:g} at delta {args.delta:g}; the ceiling of this audit is "
            f"{_fmt(result['ceiling'], '.3f')} (every guess of its strongest test right)\n{_ladder_line(result['rungs'])}\n"
            f"run: {out}")
    _emit(args, {k: result[k] for k in JSON_KEYS}, text)
    return result["exit_code"]


def _ladder_line(rungs: list[dict]) -> str:
    """The threat-model ladder in a line: each rung's bound (its ideal), or that it was refused."""
    return "ladder: " + ", ".join(
        f"{r['rung'].replace('_', '-')} refused" if r.get("epsilon") is None else
        f"{r['rung'].replace('_', '-')} {r['epsilon']:.2f} (ideal {_fmt(r.get('ideal'), '.2f')})"
        for r in rungs if r.get("epsilon") is not None or r.get("refused"))


def _validate_step(args: argparse.Namespace) -> int:
    from dpaudit.stages.validate_step import DEFAULT_DELTA, JSON_KEYS, validate_step

    missing = [f for f, v in (("--noise-multiplier", args.noise_multiplier), ("--max-grad-norm", args.max_grad_norm),
                              ("--expected-batch-size", args.expected_batch_size)) if v is None]
    if missing:
        raise InputError(f"--step needs the claim: {', '.join(missing)}")
    if args.epsilon is not None or args.canaries is not None or args.full_batch:
        raise InputError("--epsilon, --canaries and --full-batch go with --trainer; --step's claim is "
                         "--noise-multiplier S")
    out = Path(args.out or f"runs/validate-step-{datetime.now():%Y%m%d-%H%M%S}")
    delta = DEFAULT_DELTA if args.delta is None else args.delta
    r = validate_step(step=args.step, noise_multiplier=args.noise_multiplier, max_grad_norm=args.max_grad_norm,
                      expected_batch_size=args.expected_batch_size, repetitions=args.repetitions, delta=delta,
                      sample_rate=args.sample_rate, steps=args.steps, out=out, model=args.model,
                      model_dir=args.model_dir, arch=args.arch, tied=False if args.untied else None,
                      trust_remote_code=args.trust_remote_code)
    est, run = r["estimate"], r["run"]
    lines = [f"{r['verdict']}: {r['reason']}",
             f"model: {r['setting']['model']}; canaries: " + ", ".join(
                 f"{k['name']} (|g| {k['kind_gradient_norm']:.3g})" for k in r["canaries"]) + "".join(
                 f"; skipped {name}: {why}" for name, why in r["setting"]["skipped_canaries"].items()),
             (f"mu >= {r['mu_lower_bound']:.3f} ({r['confidence']:.0%} confidence) against the claimed 1/S = "
              f"{r['claimed_mu']:.3f}; ceiling {r['mu_ceiling']:.3f} with {r['repetitions']} runs a side; epsilon >= "
              f"{r['epsilon_lower_bound']:.3f} against {r['claimed_epsilon']:.3f} at delta {delta:g} (one step)"),
             f"estimate (canary {est['canary']}; assumes Gaussian projections, not a bound): mu = " + (
                 f"{est['mu']:.3f} [{est['mu_interval'][0]:.3f}, {est['mu_interval'][1]:.3f}]"
                 if est["mu"] is not None else "inf (no noise seen)")]
    if run is not None:
        interval = run["estimate"]["epsilon_interval"]
        lines.append(f"the run (q = {run['sample_rate']:.4g}, T = {run['steps']}): claimed epsilon "
                     f"{_fmt(run['claimed_epsilon'])}; the step's measured noise implies epsilon >= "
                     f"{_fmt(run['epsilon_lower_bound'])} ({run['confidence']:.0%}; noise multiplier <= "
                     f"{_fmt(run['noise_multiplier_upper_bound']) if run['noise_multiplier_upper_bound'] else 'inf'}), estimate {_fmt(run['estimate']['epsilon'])} "
                     f"[{_fmt(interval[0])}, {_fmt(interval[1])}]")
    lines.append(f"step audit: {out / 'step_audit.json'}")
    _emit(args, {k: r[k] for k in JSON_KEYS}, "\n".join(lines))
    return r["exit_code"]


def cmd_report(args: argparse.Namespace) -> int:
    from dpaudit.stages.report import build_report
    from dpaudit.rundir import RunDir

    RunDir(args.run_dir).check()
    report = build_report(args.run_dir, include_texts=args.include_texts)
    return _finish_audit(args, Path(args.run_dir), report)


def _fmt(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def _finish_audit(args: argparse.Namespace, out: Path, report: dict) -> int:
    """Print the verdict of every model (or the report with --json); the exit status of the worst."""
    header = f"{'model':<16}{'epsilon':>9}{'bound':>8}{'ceiling':>9}{'ppl':>9}  verdict"
    lines = [header]
    statuses = []
    for m in report["models"]:
        audit, verdict = m.get("audit") or {}, m.get("verdict") or {}
        status = "failed" if m.get("error") else verdict.get("status", "n/a")
        statuses.append(status)
        eps = (m.get("dp") or {}).get("epsilon")
        eps_text = "no DP" if (m.get("dp") or {}).get("enabled") is False else _fmt(eps, ".2f")
        lines.append(f"{m['name']:<16}{eps_text:>9}{_fmt(audit.get('epsilon_lower_bound'), '.2f'):>8}"
                     f"{_fmt(audit.get('ceiling'), '.2f'):>9}{_fmt((m.get('utility') or {}).get('heldout_perplexity'), '.1f'):>9}"
                     f"  {status}")
        if m.get("rungs") and not m.get("error"):
            lines.append("  " + _ladder_line(m["rungs"]))
        if m.get("error"):
            lines.append(f"  error: {m['error']}")
        elif verdict.get("reason") and status in ("violated", "inconclusive"):
            lines.append(f"  {verdict['reason']}")
        multi = m.get("multi_run")
        if multi and not m.get("error"):  # the multi-run audit is a verdict of its own
            statuses.append(multi["verdict"]["status"])
            lines.append(f"  multi-run audit, {multi['num_runs']} runs per side: Clopper-Pearson epsilon >= "
                         f"{_fmt(multi['clopper_pearson']['epsilon'], '.2f')} (ceiling {_fmt(multi['ceiling'], '.2f')}): "
                         f"{multi['verdict']['status']}")
    step = report.get("step_audit")
    if step:  # the white-box step audit (validate --step --out RUN) is a verdict of its own
        statuses.append(step["verdict"])
        lines.append(f"step audit of {step['step']}: mu >= {_fmt(step['mu_lower_bound'])} against the claimed 1/S = "
                     f"{_fmt(step['claimed_mu'])} (ceiling {_fmt(step['mu_ceiling'])}): {step['verdict']}")
    refs = report.get("references")
    if refs:  # audit-model --train-references: what the reference models are
        lines.append(f"reference models: {refs['trained']} trained for this audit ({refs['start']}, {refs['design']} "
                     f"design), held-out loss on the non-members {_fmt(refs.get('reference_loss'), '.2f')} against "
                     f"the target's {_fmt(refs.get('target_loss'), '.2f')} nats a token")
    lines.append(f"report: {out / 'report.html'}")
    for warning in report.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    _emit(args, report, "\n".join(lines))
    if "violated" in statuses:
        return ExitCode.VIOLATION
    if "failed" in statuses:
        return ExitCode.FAILED
    return ExitCode.INCONCLUSIVE if "inconclusive" in statuses else ExitCode.OK


def _attack_names(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


def _attack_table(results: dict) -> str:
    def fmt(value):
        return "  n/a " if value is None else f"{value:6.3f}"

    rows = [f"{'attack':<14}{'AUC':>7}{'TPR@10%':>9}{'TPR@1%':>9}{'TPR@0.1%':>10}"]
    for name, r in results.items():
        tpr = r.get("tpr_at_fpr", {})
        rows.append(f"{name:<14}{fmt(r.get('auc')):>7}{fmt(tpr.get('0.1')):>9}{fmt(tpr.get('0.01')):>9}"
                    f"{fmt(tpr.get('0.001')):>10}")
    return "\n".join(rows)


def cmd_accountant(args: argparse.Namespace) -> int:
    from dpaudit import accounting

    common = dict(sample_rate=args.sample_rate, steps=args.steps, delta=args.delta, method=args.method)
    if args.noise_multiplier is not None:
        eps = accounting.epsilon(noise_multiplier=args.noise_multiplier, **common)
        _emit(args, {"epsilon": eps, "delta": args.delta, "method": args.method},
              f"epsilon = {eps:.4f} at delta = {args.delta:g} ({args.method})")
    else:
        sigma = accounting.noise_multiplier(target_epsilon=args.target_epsilon, **common)
        eps = accounting.epsilon(noise_multiplier=sigma, **common)
        _emit(args, {"noise_multiplier": sigma, "epsilon": eps, "target_epsilon": args.target_epsilon,
                     "delta": args.delta, "method": args.method},
              f"noise multiplier = {sigma:.4f} (epsilon = {eps:.4f} at delta = {args.delta:g}, {args.method})")
    return ExitCode.OK


def cmd_bench(args: argparse.Namespace) -> int:
    from dpaudit.bench import gpu_summary, run_bench, run_gpu_check, summary
    from dpaudit.rundir import write_json_atomic

    common = dict(batch=args.batch, rounds=args.rounds, device=args.device)
    if args.suite == "gpu":
        result = run_gpu_check(size=args.size or "gpt2", **common)
        text = gpu_summary(result)
    else:
        result = run_bench(size=args.size or "small", **common)
        text = summary(result)
    if args.out:
        write_json_atomic(args.out, result)
    _emit(args, result, text)
    return ExitCode.OK
