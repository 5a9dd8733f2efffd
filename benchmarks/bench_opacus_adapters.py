"""Opacus's ``make_private`` plug-ins (``dpaudit.adapters.opacus``) against the audits, for the
installed Opacus: one markdown row per run, mode x clipping x Opacus version x verdict, with
the sound bound, its ceiling and the seconds.

    python benchmarks/bench_opacus_adapters.py                      # step audits, then validate runs
    python benchmarks/bench_opacus_adapters.py --only steps
    python benchmarks/bench_opacus_adapters.py --only model-dir
    PYTHONPATH=.ci/opacus-oldest:. python benchmarks/bench_opacus_adapters.py   # the oldest Opacus

Step rows: :func:`dpaudit.stages.validate_step.validate_step` (``dpaudit validate --step``) at
S = 1, C = 1 and B = 8, every canary, on its own tiny GPT-2, or on its tiny GPT-NeoX
(``--arch gpt_neox``) for the modes that do not run GPT-2, 24 runs a side unless the row says
otherwise; ghost adaptive clipping at S = 1/3 on GPT-NeoX's ``spread`` canary alone, the embedding norm
fault at S = 0.5 also on the untied GPT-2's ``embedding`` canary alone; the faults
of ``tests/adapters/opacus_faults.py`` beside the correct steps. Model-directory rows (``--only
model-dir``): the user's own tiny Llama and GPT-NeoX (``tests/adapters/opacus_models.py``, saved
with ``save_pretrained(safe_serialization=True)``) through ``validate --step --model-dir DIR``
(ghost clipping, and its ``nn.Linear`` norm halved at S = 0.5) and ``validate --trainer`` with the
same fault (every parameter trained, 100 canaries, claimed epsilon 2.6 at delta 1e-3), as
``test_a_linear_norm_fault_is_caught_by_the_step_audit_and_missed_by_the_black_box`` runs them.
Trainer rows: :func:`dpaudit.stages.validate.validate` (``dpaudit validate --trainer``) on the
``tiny`` preset with 100 canaries, claimed epsilon 4 at delta 1e-3 (the accountant's is about
2.5); ExpandedWeights fine-tunes a tiny GPT-NeoX. One torch thread.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "adapters")]

import torch  # noqa: E402

STEP_ROWS = [  # (plug-in or fault, S, repetitions)
    *((f"step_{m}_{c}", 1.0, 24) for m, c in (
        ("hooks", "flat"), ("hooks", "per_layer"), ("hooks", "adaptive"), ("ew", "flat"), ("ew", "per_layer"),
        ("ew", "adaptive"), ("functorch", "flat"), ("functorch", "per_layer"), ("functorch", "adaptive"),
        ("ghost", "flat"), ("ghost", "adaptive"))),
    ("step_ghost_adaptive", 1 / 3, 600),
    ("tenth_noise_hooks", 1.0, 24), ("tenth_noise_functorch", 1.0, 24), ("tenth_noise_ghost", 1.0, 24),
    ("module_bound_ghost", 1.0, 24), ("half_linear_norm_ghost", 0.5, 300), ("half_embedding_norm_ghost", 1.0, 200),
    ("half_conv1d_norm_ghost", 1.0, 200), ("half_embedding_norm_ghost", 0.5, 100),
]
FAULT_ARCH = {"half_linear_norm_ghost": "gpt_neox", "half_embedding_norm_ghost": "gpt2",
              "half_conv1d_norm_ghost": "gpt2"}
ONE_CANARY = {("step_ghost_adaptive", 1 / 3): ["spread"],  # 600 runs a side of one canary
              ("half_embedding_norm_ghost", 0.5): ["embedding"]}  # on the untied GPT-2 (UNTIED)
UNTIED = {("half_embedding_norm_ghost", 0.5)}
MODEL_DIR_ROWS = [  # (arch, plug-in or fault, S, repetitions)
    ("llama", "step_ghost_flat", 1.0, 24), ("llama", "half_linear_norm_ghost", 0.5, 200),
    ("gpt_neox", "step_ghost_flat", 1.0, 24), ("gpt_neox", "half_linear_norm_ghost", 0.5, 100),
]


def step_rows(version: str):
    from opacus_faults import FAULTS

    from dpaudit.adapters import opacus as adapter
    from dpaudit.errors import InputError
    from dpaudit.stages.validate_step import validate_step

    for name, sigma, reps in STEP_ROWS:
        step = FAULTS.get(name) or getattr(adapter, name)
        mode = name.split("_")[1] if name.startswith("step_") else name.rsplit("_", 1)[1]
        arch = FAULT_ARCH.get(name) or (adapter.SUPPORT[mode][0] if sigma == 1.0 else "gpt_neox")
        canaries = ONE_CANARY.get((name, sigma))
        tied = False if (name, sigma) in UNTIED else None
        started = time.perf_counter()
        torch.manual_seed(0)  # ghost adaptive clipping draws from torch's global generator
        try:
            r = validate_step(step=step, noise_multiplier=sigma, max_grad_norm=1.0, expected_batch_size=8,
                              repetitions=reps, arch=arch, tied=tied, canaries=canaries)
            cells = _step_cells(r)
        except InputError as err:
            cells = ["refused: " + str(err).split(": ", 2)[-1][:70], "", "", ""]
        setting = (f"{arch}{' untied' if tied is False else ''}{' ' + canaries[0] if canaries else ''}, "
                   f"S={sigma:.3g}, C=1, R={reps}")
        print(f"| {name} | {setting} | {version} | {cells[0]} | {cells[1]} | {1 / sigma:.2f} | {cells[2]} | "
              f"{cells[3]} | {time.perf_counter() - started:.1f} |", flush=True)


def _step_cells(r: dict) -> list[str]:
    """verdict (and the canary that showed a violation), bound, ceiling, estimate."""
    verdict = r["verdict"] + (f" ({r['canary']})" if r["verdict"] == "violated" else "")
    return [verdict, *(f"{x:.2f}" for x in (r["mu_lower_bound"], r["mu_ceiling"], r["estimate"]["mu"]))]


def users_model(arch: str, directory: Path):
    """The user's own tiny ``arch`` and its tokenizer, saved in ``directory``."""
    from opacus_models import build

    from dpaudit.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer([f"w{i} w{i + 1} note {i % 7}" for i in range(200)], vocab_size=300)
    build(arch, vocab_size=len(tokenizer)).save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def model_dir_rows(version: str):
    """``validate --step --model-dir`` on the user's Llama and GPT-NeoX, then ``validate
    --trainer`` with the nn.Linear fault fine-tuning each (every parameter trained)."""
    from opacus_faults import FAULTS

    from dpaudit.adapters import opacus as adapter
    from dpaudit.stages.validate import validate
    from dpaudit.stages.validate_step import validate_step

    with tempfile.TemporaryDirectory(prefix="bench-opacus-") as work:
        dirs = {arch: users_model(arch, Path(work) / arch) for arch in ("llama", "gpt_neox")}
        for arch, name, sigma, reps in MODEL_DIR_ROWS:
            started = time.perf_counter()
            r = validate_step(step=FAULTS.get(name) or getattr(adapter, name), noise_multiplier=sigma,
                              max_grad_norm=1.0, expected_batch_size=8, repetitions=reps, model_dir=dirs[arch])
            cells = _step_cells(r)
            print(f"| {name} | --model-dir {arch}, S={sigma:.3g}, C=1, R={reps} | {version} | {cells[0]} | "
                  f"{cells[1]} | {1 / sigma:.2f} | {cells[2]} | {cells[3]} | {time.perf_counter() - started:.1f} |",
                  flush=True)
        for arch, directory in dirs.items():
            started = time.perf_counter()
            r = validate(trainer="tests.adapters.opacus_faults:train_half_linear_norm_ghost", epsilon=2.6, delta=1e-3,
                         canaries=100, config="tiny", out=Path(work) / f"run-{arch}", overrides=[
                             "train.dp.noise_multiplier=1.0", f"model.base_model={directory}",
                             "pretrain.enabled=false", "model.trainable=all"])
            print(f"| train_half_linear_norm_ghost | base model {arch}, all trained, 100 canaries | {version} | "
                  f"{r['verdict']} | {r['epsilon_lower_bound']:.2f} | 2.6 | {r['ceiling']:.2f} | | "
                  f"{time.perf_counter() - started:.1f} |", flush=True)


def trainer_rows(version: str):
    from opacus_models import build

    from dpaudit.adapters import opacus as adapter
    from dpaudit.data.tokenizer import train_tokenizer
    from dpaudit.stages.validate import validate

    for mode, clipping in adapter.PLUG_INS:
        if (mode, clipping) == ("ghost", "adaptive"):
            continue  # needs realised batches above 10 sigma; in Opacus 1.6.0 it does not clip per example
        with tempfile.TemporaryDirectory(prefix="bench-opacus-") as work:
            sets = ["train.dp.noise_multiplier=1.0"]
            if mode == "ew":
                tokenizer = train_tokenizer([f"patient {i} seen on day {i % 30}" for i in range(300)], vocab_size=400)
                build("gpt_neox", vocab_size=len(tokenizer)).save_pretrained(Path(work) / "neox")
                tokenizer.save_pretrained(Path(work) / "neox")
                sets += [f"model.base_model={Path(work) / 'neox'}", "pretrain.enabled=false"]
            started = time.perf_counter()
            r = validate(trainer=f"dpaudit.adapters.opacus:train_{mode}_{clipping}", epsilon=4.0, delta=1e-3,
                         canaries=100, config="tiny", overrides=sets, out=Path(work) / "v")
            print(f"| train_{mode}_{clipping} | {'GPT-NeoX' if mode == 'ew' else 'GPT-2'}, tiny, 100 canaries | "
                  f"{version} | {r['verdict']} | {r['epsilon_lower_bound']:.2f} | 4 | {r['ceiling']:.2f} | | "
                  f"{time.perf_counter() - started:.1f} |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("steps", "model-dir", "trainers"))
    args = parser.parse_args(argv)
    import opacus

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print("| plug-in | setting | Opacus | verdict | bound (mu; epsilon for trainers) | claim | ceiling | "
          "estimate | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    if args.only in (None, "steps"):
        step_rows(opacus.__version__)
    if args.only in (None, "model-dir"):
        model_dir_rows(opacus.__version__)
    if args.only in (None, "trainers"):
        trainer_rows(opacus.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
