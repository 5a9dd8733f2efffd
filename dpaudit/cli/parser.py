"""The command line's parser: one sub-command per job, each handled in :mod:`dpaudit.cli.commands`."""

from __future__ import annotations

import argparse

from dpaudit.cli.commands import (
    cmd_accountant,
    cmd_attack,
    cmd_audit_model,
    cmd_bench,
    cmd_extract,
    cmd_report,
    cmd_run,
    cmd_train,
    cmd_validate,
)
from dpaudit.version import __version__


def _config_args(p: argparse.ArgumentParser, *, default: str) -> None:
    p.add_argument("--config", default=default, metavar="FILE|PRESET",
                   help=f"a YAML file or a preset: tiny, demo, gpu (default: {default})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set train.dp.noise_multiplier=1.1 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpaudit",
        description="Audit memorization and membership leakage in language models, "
        "and check that DP-SGD earns the epsilon it claims.",
    )
    parser.add_argument("--version", action="version", version=f"dpaudit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_pipeline(sub)
    _add_audits(sub)
    _add_tools(sub)
    return parser


def _add_pipeline(sub) -> None:
    p = sub.add_parser("run", help="train every model of the run, attack them and write the report (the main job)")
    _config_args(p, default="demo")
    p.add_argument("--out", help="run directory (default: runs/<preset>-<time>); an existing one with the same "
                                 "config is resumed")
    p.add_argument("--force", action="store_true", help="start the run directory over")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("train", help="prepare the data and train every model of the run (no attacks)")
    _config_args(p, default="demo")
    p.add_argument("--out", required=True, help="run directory (an existing one with the same config is resumed)")
    p.add_argument("--force", action="store_true", help="start the run directory over")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("attack", help="reference fleet, membership attacks and extraction on a trained run directory")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--attacks", help="comma-separated attack names (default: every one the inputs allow)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_attack)

    p = sub.add_parser("extract", help="exposure of the secret canaries, extraction of canaries, PII fields and "
                                       "k-extractable records, for every model of a run directory")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--force", action="store_true", help="recompute results already in place")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_extract)


def _add_audits(sub) -> None:
    p = sub.add_parser("audit-model", help="black-box membership audit of a released model")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument("--members", required=True, metavar="FILE", help="jsonl with a 'text' field, or txt, one text a line")
    p.add_argument("--nonmembers", required=True, metavar="FILE", help="same format as --members")
    p.add_argument("--reference-model", dest="reference_models", action="append", default=[], metavar="DIR",
                   help="a reference model trained without the members (repeatable)")
    p.add_argument("--out", default="audit", help="output directory (default: audit)")
    p.add_argument("--attacks", help="comma-separated attack names (default: every one the inputs allow)")
    p.add_argument("--batch-size", type=int, default=16, help="texts per forward pass (default: 16)")
    p.add_argument("--max-length", type=int, default=512, help="tokens per text (default: 512)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    p.add_argument("--include-texts", action="store_true", help="put member texts into the report")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run the model's own code")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_audit_model)

    p = sub.add_parser("validate", help="does a DP-SGD trainer earn its claimed (epsilon, delta)? one run with canaries",
                       description="Train once with TRAINER (a MODULE:FUNCTION plug-in, imported from the current "
                       "directory and PYTHONPATH) on the preset's corpus with M canaries, audit the canaries and say "
                       "violated (exit 1), consistent (exit 0) or inconclusive (exit 3). The audit's design is "
                       "the default (canaries.set=new_token_bare, model.trainable=input_embeddings, "
                       "and, when the run trains a base model, train.optimizer=sgd, train.momentum=0, train.lr=0.01; "
                       "--set changes any of them). Full-batch "
                       "training (--full-batch) shows the most. With --step instead: a "
                       "white-box audit of one DP-SGD update step(model, batch, *, generator) against the claim "
                       "(S, C, B), from R runs of the step with and without a canary.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--trainer", metavar="MODULE:FUNCTION")
    what.add_argument("--step", metavar="MODULE:FUNCTION", help="white-box audit of one update step instead")
    p.add_argument("--epsilon", type=float, metavar="E", help="the claimed epsilon (--trainer)")
    p.add_argument("--delta", type=float, metavar="D",
                   help="the claimed delta (required with --trainer; with --step default 1e-05)")
    p.add_argument("--canaries", type=int, metavar="M", help="number of canaries (default: the preset's)")
    p.add_argument("--full-batch", action="store_true", help="every unit in every step (q = 1), 10 steps unless "
                   "the config sets train.steps (or --set train.steps=T): the most power; the sampler is then not "
                   "tested (--trainer)")
    _config_args(p, default="demo")
    p.add_argument("--noise-multiplier", type=float, metavar="S", help="the step's claimed noise multiplier (--step)")
    p.add_argument("--max-grad-norm", type=float, metavar="C", help="the step's claimed clipping norm (--step)")
    p.add_argument("--expected-batch-size", type=int, metavar="B",
                   help="the step's claimed divisor, the expected batch size (--step)")
    p.add_argument("--repetitions", type=int, default=200, metavar="R",
                   help="runs of the step with and without the canary, each (--step; default: 200)")
    p.add_argument("--sample-rate", type=float, metavar="Q", help="the run's Poisson rate, for the run's epsilon "
                   "the step implies (--step, with --steps; default: from --out's DP-SGD model)")
    p.add_argument("--steps", type=int, metavar="T", help="the run's number of steps (--step, with --sample-rate)")
    p.add_argument("--model", metavar="NAME", help="the model of the run directory --out whose q and T the step "
                   "audit composes (--step; default: its only DP-SGD model)")
    on = p.add_mutually_exclusive_group()
    on.add_argument("--model-dir", metavar="DIR", help="audit the step on this local Hugging Face causal-LM directory "
                    "(safetensors weights) instead of the tiny GPT-2 (--step)")
    on.add_argument("--arch", choices=("gpt2", "llama", "opt", "gpt_neox"), help="audit the step on a tiny model of "
                    "this family, built from a config (--step; default: gpt2)")
    p.add_argument("--untied", action="store_true", help="untie the tiny model's output layer from its input "
                   "embedding (--step; gpt2 and opt tie by default, llama and gpt_neox do not)")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run the code that --model-dir "
                   "ships (--step)")
    p.add_argument("--out", help="run directory (default: runs/validate-<time>); --step writes step_audit.json "
                             "there (into an existing run: `dpaudit report` shows it)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_validate)


def _add_tools(sub) -> None:
    p = sub.add_parser("report", help="rebuild report.json, figures and report.html from saved results")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--include-texts", action="store_true", help="put member texts into the report")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser("accountant", help="epsilon of Poisson-sampled Gaussian DP-SGD, or the noise for a target")
    noise = p.add_mutually_exclusive_group(required=True)
    noise.add_argument("--noise-multiplier", type=float, metavar="S")
    noise.add_argument("--target-epsilon", type=float, metavar="E")
    p.add_argument("--sample-rate", type=float, required=True, metavar="Q")
    p.add_argument("--steps", type=int, required=True, metavar="T")
    p.add_argument("--delta", type=float, required=True, metavar="D")
    p.add_argument("--method", choices=("pld", "rdp"), default="pld", help="accountant (default: pld)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_accountant)

    p = sub.add_parser("bench", help="DP-SGD step, memory, Opacus, signals and validate cost as side-by-side ratios")
    p.add_argument("--suite", choices=("default", "gpu"), default="default",
                   help="default: the ratios; gpu: the ratios plus training throughput, peak GPU memory and the "
                   "secure noise's share of a DP step, within a time budget (see benchmarks/README.md)")
    p.add_argument("--size", help="model size: tiny, small (the default suite's default, the demo's), medium, gpt2 "
                   "(124M, GPT-2's vocabulary; the gpu suite's default)")
    p.add_argument("--batch", type=int, default=16, metavar="B", help="batch of the step-time rows (default: 16)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row (default: 5)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    p.add_argument("--out", metavar="FILE", help="also write the result JSON to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=cmd_bench)
