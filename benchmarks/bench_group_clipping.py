"""Who is clipped at which clipping norm: the lever behind the report's clipping table.

    python benchmarks/bench_group_clipping.py --run RUN [--norms 1,2,3,4,6,8] [--json]

RUN is a run directory whose corpus names groups (the built-in clinical corpus does). For
every member note, the norm of the gradient of its mean token loss at the run's base model
(what the first DP-SGD step of a per-note fine-tune clips), then, per clipping norm C and per
group, the share of notes clipped and the mean of min(norm, C) / norm (the fraction of its
gradient a note keeps), each with a 95% bootstrap interval over units (patients; the notes of
one patient are not independent). At the demo's C = 1 every note is clipped, so the rate
cannot tell groups apart; this shows at which C it could (Bagdasaryan et al. 2019, arXiv
1905.12101, on clipping as the source of DP's disparate impact).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch


def note_norms(model, tokenizer, texts: list[str], *, max_length: int) -> np.ndarray:
    """The gradient norm of each text's mean token NLL, over every trainable parameter."""
    model.train(False)
    params = [p for p in model.parameters() if p.requires_grad]
    out = np.empty(len(texts))
    for i, text in enumerate(texts):
        ids = torch.tensor([tokenizer(text, truncation=True, max_length=max_length)["input_ids"]])
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        out[i] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)))
    return out


def main() -> None:
    from dpaudit.audit.groups import by_unit, ratio_estimate
    from dpaudit.models import load_model
    from dpaudit.rundir import RunDir
    from dpaudit.stages.artifacts import read_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--norms", default="1,2,3,4,6,8", help="clipping norms C, comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    norms = [float(c) for c in args.norms.split(",")]

    rundir = RunDir(args.run)
    config = rundir.read_config()
    members = [c for c in rundir.read_candidates() if c["role"] == "member" and c.get("group") is not None]
    if not members:
        parser.error(f"{args.run}: no member record names a group")
    norm = note_norms(load_model(rundir.base_dir), read_tokenizer(rundir), [c["text"] for c in members],
                      max_length=config.data.max_length)
    groups = sorted({c["group"] for c in members})
    result = {"run": str(args.run), "notes": len(members), "groups": {}}
    for g in groups:
        keep = np.array([c["group"] == g for c in members])
        units = [c["unit_id"] for c, k in zip(members, keep) if k]
        rows = {"notes": int(keep.sum()), "mean_norm": float(norm[keep].mean()), "by_norm": {}}
        for c in norms:
            _, (clipped, kept, count) = by_unit(units, norm[keep] > c, np.minimum(norm[keep], c) / norm[keep],
                                               np.ones(int(keep.sum())))
            rows["by_norm"][c] = {"clipped_share": ratio_estimate(clipped, count).to_dict(),
                                  "kept_fraction": ratio_estimate(kept, count).to_dict()}
        result["groups"][g] = rows
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.run}: {len(members)} member notes at the base model; mean gradient norm "
          + ", ".join(f"{g} {r['mean_norm']:.2f} ({r['notes']} notes)" for g, r in result["groups"].items()))
    print(f"{'C':>5}  " + "  ".join(f"{g + ' clipped':>24}  {g + ' kept':>24}" for g in groups))
    for c in norms:
        cells = []
        for g in groups:
            for key in ("clipped_share", "kept_fraction"):
                e = result["groups"][g]["by_norm"][c][key]
                cells.append(f"{e['value']:.2f} [{e['low']:.2f}, {e['high']:.2f}]".rjust(24))
        print(f"{c:>5g}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
