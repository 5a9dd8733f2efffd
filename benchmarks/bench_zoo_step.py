"""The faulty-trainer zoo against the white-box step validator (``dpaudit validate --step``).

    python benchmarks/bench_zoo_step.py                                  # every row, print the table
    python benchmarks/bench_zoo_step.py --results /tmp/zoo_step.json --doc docs/zoo.md

For each row of docs/zoo.md (made by ``benchmarks/bench_zoo.py``, which trains and audits the
final model: long), runs :func:`dpaudit.stages.validate_step.validate_step` once per claim on
the step built from the same engine (``dpaudit.train.faulty:KEY_step``; the toolkit's
``dpaudit.train:dpsgd_step``; Opacus's ``dpaudit.train.opacus:dpsgd_step``), with the zoo's
claim: the noise multiplier the toolkit's trainer calibrates for epsilon 1 and 4 at the zoo's
q = 32/561, T = 71, delta 1e-5, the zoo's C = 0.1 (C = 10 for ``unscaled_noise@C=10``) and
B = 32. Rows whose bug is not in the update (``shuffle_as_poisson``: sampling;
``microstep_accounting``: accounting) have no step of their own and are marked so.

With ``--doc`` the results become a column "step validator" of the zoo table (added, or
replaced when there) and a section saying how it was made; ``--results`` keeps the rows in a
JSON file and reuses them on a later call (so the column can be put back after
``bench_zoo.py`` rewrote the page).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from datetime import date
from pathlib import Path

CLAIMS = (1.0, 4.0)
NUM_UNITS, BATCH, STEPS, DELTA, CLIP = 561, 32, 71, 1e-5, 0.1
REPETITIONS = 200
# rows that are not less private than claimed here: the correct steps, the over-noised one, and
# unscaled_noise at the zoo's C = 0.1 (its missing factor C gives 10x the noise)
CONTROLS = frozenset({"dpsgd", "opacus", "noisy_microsteps", "unscaled_noise"})
COLUMN = "step validator"
SECTION = "## The white-box step validator column"
NO_STEP = {"shuffle_as_poisson": "n/a: the bug is in the sampling, the update is correct",
           "microstep_accounting": "n/a: the bug is in the accounting, the update is correct"}


def plan() -> list[tuple[str, str | None, float]]:
    """(zoo row, step, C) for every row of the zoo table."""
    from dpaudit.train.faulty import SPECS

    rows = [(key, None if key in NO_STEP else f"dpaudit.train.faulty:{key}_step", CLIP) for key in SPECS]
    rows.append(("unscaled_noise@C=10", "dpaudit.train.faulty:unscaled_noise_step", 10.0))
    rows.append(("dpsgd", "dpaudit.train:dpsgd_step", CLIP))
    try:
        import opacus  # noqa: F401

        rows.append(("opacus", "dpaudit.train.opacus:dpsgd_step", CLIP))
    except ImportError:
        pass
    return rows


def run_all(repetitions: int) -> list[dict]:
    from dpaudit import accounting
    from dpaudit.stages.validate_step import validate_step

    q = BATCH / NUM_UNITS
    out = []
    for claim in CLAIMS:
        sigma = accounting.noise_multiplier(target_epsilon=claim, sample_rate=q, steps=STEPS, delta=DELTA)
        for row, step, c in plan():
            entry = {"row": row, "claim": claim, "noise_multiplier": sigma, "max_grad_norm": c, "step": step}
            if step is not None:
                started = time.perf_counter()
                r = validate_step(step=step, noise_multiplier=sigma, max_grad_norm=c, expected_batch_size=BATCH,
                                  repetitions=repetitions, delta=DELTA)
                entry.update({k: r[k] for k in ("verdict", "mu_lower_bound", "claimed_mu", "mu_ceiling", "statistic")},
                             estimate=r["estimate"]["mu"], seconds=round(time.perf_counter() - started, 1))
                print(f"{row} eps={claim:g}: {r['verdict']}, mu >= {r['mu_lower_bound']:.2f} against "
                      f"{r['claimed_mu']:.2f}, estimate {r['estimate']['mu']}, {entry['seconds']:.0f}s",
                      file=sys.stderr, flush=True)
            out.append(entry)
    return out


def cell(entry: dict | None) -> str:
    if entry is None:
        return "-"
    if entry["step"] is None:
        return NO_STEP[entry["row"]]
    est = "∞" if entry["estimate"] is None else f"{entry['estimate']:.2f}"
    return (f"{entry['verdict']} (mu >= {entry['mu_lower_bound']:.2f} vs 1/S = {entry['claimed_mu']:.2f}; "
            f"estimate {est})")


def add_column(text: str, rows: list[dict]) -> str:
    """The zoo table with the step-validator column (replacing an earlier one)."""
    by_key = {(e["row"], e["claim"]): e for e in rows}
    lines, current = text.splitlines(), None
    out = []
    for line in lines:
        if line.startswith("| trainer |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if COLUMN not in cells:
                line = line + f" {COLUMN} |"
        elif line.startswith("| --- |") and "| ---: | ---: | ---: |" in line:
            if line.count("|") == 10:
                line = line + " --- |"
        elif line.startswith("| ") and line.count("|") >= 10 and not line.startswith("| trainer"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            name = re.fullmatch(r"`(.+)`", cells[0])
            if name:
                current = name.group(1)
            try:
                claim = float(cells[3])
            except ValueError:
                out.append(line)
                continue
            cells = cells[:9] + [cell(by_key.get((current, claim)))]
            line = "| " + " | ".join(cells) + " |"
        out.append(line)
    return "\n".join(out) + "\n"


def section(rows: list[dict], repetitions: int, command: str) -> str:
    import torch

    caught = sorted({e["row"] for e in rows if e.get("verdict") == "violated"})
    tested = {e["row"] for e in rows if e.get("verdict") in ("consistent", "inconclusive")} - set(caught)
    missed, controls = sorted(tested - CONTROLS), sorted(tested & CONTROLS)
    flagged = sorted(set(caught) & CONTROLS)
    seconds = [e["seconds"] for e in rows if "seconds" in e]
    own = next(e for e in rows if e["row"] == "dpsgd")
    correct, claimed = f"{own['estimate']:.2f}", f"{own['claimed_mu']:.2f}"
    return f"""{SECTION}

Made by `{command}` on {date.today().isoformat()} ({platform.machine()}, torch {torch.__version__}, 1 thread,
cores shared with other jobs; median {sorted(seconds)[len(seconds) // 2]:.0f} s a row): a separate small run, not part
of `bench_zoo.py` (which it does not rerun). Each cell is one run of

    dpaudit validate --step dpaudit.train.faulty:KEY_step --noise-multiplier S --max-grad-norm 0.1 --expected-batch-size 32 --repetitions {repetitions}

with S the noise multiplier the toolkit's trainer calibrates for the row's claimed epsilon (q = 32/561, T = 71, delta
1e-5: S = {rows[0]['noise_multiplier']:.3f} at 1, {rows[-1]['noise_multiplier']:.3f} at 4), C = 10 for `unscaled_noise@C=10`;
`dpsgd` is `dpaudit.train:dpsgd_step`, `opacus` is `dpaudit.train.opacus:dpsgd_step` (Opacus's `DPOptimizer.step`).
The step of each faulty trainer is its engine followed by plain SGD (`dpaudit.train.step.make_step`); `reused_noise`'s
step keeps its noise vector from one call to the next, as the trainer keeps it from step to step. The verdict compares
the rigorous mu lower bound (95%) with the claimed 1/S; the estimate is the Gaussian one (not a bound).

- caught by the step validator: {", ".join(f"`{k}`" for k in caught) or "none"};
- leaking, and not caught: {", ".join(f"`{k}`" for k in missed) or "none"};
- correct or over-noised here, `consistent` as they must be: {", ".join(f"`{k}`" for k in controls) or "none"}
  (flagged, which must be none: {", ".join(f"`{k}`" for k in flagged) or "none"}).

Every cell uses seed 0, hence the same noise draws and the same split: the estimates of the rows move together (the
correct step's is {correct} against 1/S = {claimed} at claim 1, and the other rows' deviate alike).
`batch_clipping` is not caught here: the canary's share of a batch sum clipped as a whole is at most C and, with the
batch's gradients aligned with the canary's, less (the estimate is well below 1/S); its worst case (sensitivity 2C) needs a
batch whose sum points against the canary. `realised_batch_size` rescales the whole update by 1/b instead of 1/B,
which leaves the canary's signal-to-noise ratio unchanged. The white-box column catches the four leaks that nothing
else caught: `nonfinite_passthrough` at claim 4, `unclipped_params`, `reused_noise` and `unscaled_noise@C=10`.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=REPETITIONS)
    parser.add_argument("--results", help="JSON file of the rows: reused when it exists, written otherwise")
    parser.add_argument("--doc", help="add the column to this zoo page (docs/zoo.md)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    command = "python benchmarks/bench_zoo_step.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results = Path(args.results) if args.results else None
    if results is not None and results.is_file():
        saved = json.loads(results.read_text())
        rows, command = saved["rows"], saved["command"]
    else:
        rows = run_all(args.repetitions)
        if results is not None:
            results.write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    for e in rows:
        print(f"{e['row']:<24}{e['claim']:>4g}  {cell(e)}")
    if args.doc:
        doc = Path(args.doc)
        text = doc.read_text(encoding="utf-8")
        if SECTION in text:  # replace the earlier section (it runs to the next "## " or the end)
            head, _, rest = text.partition(SECTION)
            nxt = rest.find("\n## ")
            text = head.rstrip("\n") + "\n\n" + (rest[nxt + 1:] if nxt >= 0 else "")
        text = add_column(text, rows)
        marker = "## The configuration, and why"
        part = section(rows, args.repetitions, command)
        text = text.replace(marker, part + "\n" + marker, 1) if marker in text else text.rstrip("\n") + "\n\n" + part
        doc.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
