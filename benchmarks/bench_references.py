"""Measured power of ``audit-model``'s own reference models (``--train-references N``).

    OMP_NUM_THREADS=1 python benchmarks/bench_references.py --out DIR [--json]
    python benchmarks/bench_references.py --out DIR --members 64 --nonmembers 64 --population 128 --refs 4

Builds two released models from the built-in clinical corpus (:mod:`dpaudit.data.clinical`),
whose texts are the lines of its notes (headers, names and MRNs, vitals, plans), split by
patient into members, non-members, a population and a clean training set:

* ``memorized``: a tiny GPT-2 trained from scratch for many epochs on the members alone
  (memorized on purpose);
* ``clean``: the same recipe on the clean set, which holds neither a member nor a non-member,
  so that for it the two are exchangeable and every attack must stay at chance.

Each is audited by ``dpaudit.stages.audit_model.audit_model`` with ``N`` (4, then 8) reference
models trained from scratch in its architecture on random halves of the population, with the
target's own recipe (``--reference-config``, the file this script writes). The table gives TPR
at 1% and 0.1% FPR of the loss attack (Yeom et al. 2018) against LiRA (Carlini et al. 2022,
arXiv 2112.03570) and RMIA (Zarifzadeh et al. 2024, arXiv 2312.03262), each with its 95%
percentile-bootstrap interval, and the minutes each audit took on this machine. The reference
models are cached under ``DIR``: a rerun resumes (and costs only the scoring).

``--design offline`` (default) trains the references on the population alone, so the number
of non-members (10,000 by default: the 0.1% FPR needs ``10 / 0.001`` of them) does not grow
their training sets; ``--design online`` puts each audited text in a random half of them too
(online LiRA), at the cost of training on every audited text.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

FPRS = (0.01, 0.001)
ATTACKS = ("loss", "lira_offline", "lira_online", "rmia")
MIN_CHARS = 24  # a text is a line of a note of at least this many characters
PER_PATIENT = 3


def recipe(*, epochs: float, lr: float = 0.003, batch_size: int = 16, max_length: int = 48,
           size: str = "tiny") -> dict:
    """The run config (a dict) of the targets and of their reference models: non-private, from scratch."""
    return {
        "seed": 0,
        "data": {"max_length": max_length},
        "model": {"size": size},
        "pretrain": {"enabled": False},
        "train": {"trainer": "dpaudit.train:nonprivate", "lr": lr, "epochs": epochs, "batch_size": batch_size,
                  "microbatch_size": batch_size, "schedule": "constant", "eval_every": 10_000,
                  "max_eval_examples": 32},
        "fleet": {"num_models": 0, "workers": 1},
    }


def texts_by_patient(*, patients: int, seed: int) -> tuple[list[str], list[str]]:
    """``(texts, unit_ids)``: every line of at least :data:`MIN_CHARS` characters of every note
    of ``patients`` patients (a header, a name and MRN, vitals, a plan: texts of very different
    difficulty, which is what reference models calibrate)."""
    from dpaudit.data.clinical import generate_clinical_notes

    notes = generate_clinical_notes(num_patients=patients, seed=seed)
    texts, units = [], []
    for note, unit in zip(notes["text"], notes["unit_id"]):
        for line in note.splitlines():
            if len(line.strip()) >= MIN_CHARS:
                texts.append(line.strip())
                units.append(str(unit))
    return texts, units


def split(texts: list[str], units: list[str], *, sizes: dict[str, int], seed: int) -> dict[str, tuple[list, list]]:
    """Disjoint groups of patients, each of ``sizes[name]`` texts, in the order of ``sizes``:
    exact duplicate texts dropped, then :data:`PER_PATIENT` lines of each patient at most."""
    rng = np.random.default_rng(seed)
    seen, by_unit = set(), {}
    for t, u in zip(texts, units):
        if t not in seen:
            seen.add(t)
            by_unit.setdefault(u, []).append(t)
    for u, lines in by_unit.items():  # a few lines a patient: many patients, so that the split is not a few clusters
        by_unit[u] = [lines[i] for i in sorted(rng.choice(len(lines), min(PER_PATIENT, len(lines)), replace=False))]
    order = list(by_unit)
    rng.shuffle(order)
    out, it = {}, iter(order)
    for name, size in sizes.items():
        got_t, got_u = [], []
        while len(got_t) < size:
            try:
                u = next(it)
            except StopIteration:
                raise SystemExit(f"not enough patients for {sizes}: generate more") from None
            got_t += by_unit[u]
            got_u += [u] * len(by_unit[u])
        out[name] = (got_t[:size], got_u[:size])
    return out


def write_jsonl(path: Path, texts: list[str], units: list[str] | None = None) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"text": t, **({"unit_id": units[i]} if units else {})}) + "\n")
    return path


def train_target(directory: Path, texts: list[str], tokenizer, *, config: dict, seed: int) -> Path:
    """A model trained on ``texts`` with ``config`` and saved (with ``tokenizer``) in ``directory``
    (kept when it is already there)."""
    import datasets

    from dpaudit.config import load_config
    from dpaudit.data.corpus import tokenize_dataset
    from dpaudit.train import nonprivate

    if (directory / "config.json").is_file():
        return directory
    cfg = load_config(config)
    data = tokenize_dataset(datasets.Dataset.from_dict({"text": texts, "unit_id": [str(i) for i in range(len(texts))]}),
                            tokenizer, max_length=cfg.data.max_length)
    model = nonprivate(data, tokenizer, seed=seed, config=cfg)
    tmp = directory.with_name(directory.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(directory)
    return directory


def build(root: Path, *, members: int, nonmembers: int, population: int, epochs: float, seed: int = 0,
          max_length: int = 48, size: str = "tiny", population_units: bool = False) -> dict:
    """The files of the experiment under ``root``: members, non-members, population (jsonl with
    ``unit_id``), ``reference.yaml`` and the two targets ``memorized`` and ``clean``."""
    import yaml

    from dpaudit.data.tokenizer import train_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    need = members + nonmembers + population + members + 256
    texts, units = texts_by_patient(patients=int(need / PER_PATIENT) + 64, seed=seed)
    groups = split(texts, units, sizes={"members": members, "nonmembers": nonmembers, "population": population,
                                        "clean": members, "tokenizer": 256}, seed=seed)
    config = recipe(epochs=epochs, max_length=max_length, size=size)
    # by default the population without unit ids: each line its own unit (a half need not keep a patient's lines together)
    files = {name: write_jsonl(root / f"{name}.jsonl", groups[name][0], groups[name][1]
                               if name != "population" or population_units else None)
             for name in ("members", "nonmembers", "population")}
    files["config"] = root / "reference.yaml"
    files["config"].write_text(yaml.safe_dump(config), encoding="utf-8")
    tokenizer = train_tokenizer(groups["tokenizer"][0], vocab_size=400)
    files["memorized"] = train_target(root / "memorized", groups["members"][0], tokenizer, config=config, seed=seed)
    files["clean"] = train_target(root / "clean", groups["clean"][0], tokenizer, config=config, seed=seed + 1)
    return files


def measure(files: dict, *, target: str, refs: int, out: Path, design: str, progress: bool = False) -> dict:
    """Audit ``files[target]`` with ``refs`` reference models; ``{attack: {fpr: (tpr, low, high)}, "auc": ...,
    "minutes": ...}``."""
    from dpaudit.audit import CanaryScores
    from dpaudit.rundir import ModelDir
    from dpaudit.stages.audit_model import audit_model

    start = time.perf_counter()
    attacks = [a for a in ATTACKS if design == "online" or a != "lira_online"]
    audit_model(files[target], members=files["members"], nonmembers=files["nonmembers"],
                population=files["population"], train_references=refs, reference_config=files["config"],
                reference_design=design, out=out, attacks=attacks, batch_size=64, max_length=64,
                device="cpu", progress=progress)
    minutes = (time.perf_counter() - start) / 60
    results = ModelDir(out / "models" / Path(files[target]).name).read_results()
    row = {"minutes": minutes, "attacks": {}}
    for name in attacks:
        scores, labels = results[name]["arrays"]["members"]
        cs = CanaryScores.from_labels(scores=scores, is_member=labels, seed=0)
        cell = {"auc": float(cs.auc())}
        for a in FPRS:
            tpr = cs.tpr_at_fpr(a).value
            ci = cs.bootstrap_ci("tpr_at_fpr", fpr=a, num_samples=200, seed=0) if tpr is not None else None
            cell[str(a)] = None if tpr is None else [tpr, ci.low, ci.high]
        row["attacks"][name] = cell
    return row


def _cell(v) -> str:
    return "n/a" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def table(rows: list[dict]) -> str:
    lines = ["| target | references | attack | AUC | TPR at 1% FPR [95%] | TPR at 0.1% FPR [95%] | minutes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        for name, cell in r["attacks"].items():
            lines.append(f"| {r['target']} | {r['refs']} | {name} | {cell['auc']:.3f} | {_cell(cell['0.01'])} | "
                         f"{_cell(cell['0.001'])} | {r['minutes']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--members", type=int, default=1000)
    p.add_argument("--nonmembers", type=int, default=10_000)
    p.add_argument("--population", type=int, default=2000)
    p.add_argument("--epochs", type=float, default=12)
    p.add_argument("--refs", type=int, nargs="+", default=[4, 8])
    p.add_argument("--design", choices=("offline", "online"), default="offline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    start = time.perf_counter()
    files = build(args.out / "inputs", members=args.members, nonmembers=args.nonmembers, population=args.population,
                  epochs=args.epochs, seed=args.seed)
    setup_min = (time.perf_counter() - start) / 60
    rows = []
    for target in ("memorized", "clean"):
        for n in sorted(args.refs):
            # one reference directory per N and design, shared by both targets (same population and recipe)
            out = args.out / f"{target}-{args.design}-{n}"
            first = args.out / f"memorized-{args.design}-{n}" / "references"
            if target != "memorized" and first.is_dir() and not (out / "references").exists():
                shutil.copytree(first, out / "references")  # the same population, recipe and architecture
            row = measure(files, target=target, refs=n, out=out, design=args.design)
            rows.append({"target": target, "refs": n, **row})
            print(f"{target}, {n} references: {row['minutes']:.1f} min", file=sys.stderr)
    total = (time.perf_counter() - start) / 60
    if args.json:
        print(json.dumps({"rows": rows, "setup_minutes": setup_min, "total_minutes": total, "args": {
            k: str(v) for k, v in vars(args).items()}}))
    else:
        print(table(rows))
        print(f"\nsetup (corpus, tokenizer, two targets) {setup_min:.1f} min; total {total:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
