"""Where does a released model hold its canaries' signal, and which read of it sees most?

    python benchmarks/bench_canary_reads.py --run RUN [--run RUN ...] [--model NAME ...]

For a run whose canaries are two new tokens (a, b) with no prefix (the demo's
``new_token_pairs``), a canary's loss on the final model is the log-probability of b at the
hidden state after a: up to a shared offset, b's output row read along that state. DP-SGD
moves b's row along the state it had at each step that sampled the canary, and the fine-tune
moves that state (every canary's alike: the new tokens' rows start equal). For every DP model
the script prints the cosine between the state at the base and at the final model (median
over the canaries), their cosine with one another at the final model, and the canary AUC of
five reads of b's row:

- ``loss``: the canary's log-probability on the final model (what the released rung's
  attacks read, black-box);
- ``row . h_final``, ``row . h_base``, ``row . both``: b's row change from the base read along
  the final state, the base state, and the sum of the two (unit vectors): white-box;
- ``held-out direction``: the members' mean row change minus the non-members', found on a
  random half of the canaries and read on the other half (20 halves): the best direction
  that labels can show, with no overfitting.

A read that beat ``loss`` would be an attack the released rung lacks; none does on the
demo's runs (docs/ceilings.md, "Why the released rung stays short").

Then how much of each inclusion the canaries keep. The released rung's ideal counts every
inclusion of a canary as its whole clipped gradient on a row of its own; the base isolates
the rows so that it is (``own share``: the share of a canary's squared gradient norm on b's
row, median over 30 canaries, at the base and at the final model). As training moves b's row
away from the pool's mean, the canary's gradient reaches the shared weights through the state
after a, and its clipped norm on b's row falls: with a row that drifts as a random walk, the
squared norm on the shared weights grows linearly in the step, so 1 / share - 1 goes linearly
from its value at the base to its value at the final model (what
``benchmarks/bench_canary_levers.py --trace`` measures step by step). ``perfect`` is the canary
AUC of a perfect attack on the rung's regime and optimizer (its ideal), ``perfect, kept``
the same on canaries that keep sqrt(share) of the clipping norm at each step
(``dpaudit.audit.ladder.ideal_scores(signal=...)``), both over 20,000 canaries.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from bench_audit_power import perfect_auc
from sklearn.metrics import roc_auc_score


def reads(run: Path, report: dict, model_names: list[str]) -> dict[str, dict[str, float]]:
    """The reads of every model of ``model_names`` of the run (``report``: its report.json),
    the base's state and share taken once."""
    from dpaudit.canaries import canaries_from_dict
    from dpaudit.models import load_model
    from dpaudit.rundir import RunDir
    from dpaudit.stages.artifacts import read_tokenizer

    rundir = RunDir(run)
    tok = read_tokenizer(rundir)
    canaries = [c for c in canaries_from_dict(rundir.read_canary_file())[0] if c.kind == "new_token"]
    ids = [tok(c.text)["input_ids"] for c in canaries]
    if not canaries or any(len(i) != 2 for i in ids):
        raise SystemExit(f"{run}: the canaries are not two new tokens each (the demo's new_token_pairs)")
    member = np.array([c.included for c in canaries])
    first, second = torch.tensor([i[0] for i in ids]), torch.tensor([i[1] for i in ids])
    base = load_model(rundir.base_dir).eval()

    def state(model):  # the last hidden state after a, and the log-probabilities there
        with torch.no_grad():
            out = model(first[:, None], output_hidden_states=True)
        return out.hidden_states[-1][:, 0].double(), out.logits[:, 0].double().log_softmax(-1)

    h_base, _ = state(base)
    base_share = own_share(base, ids[:30])
    unit = torch.nn.functional.normalize
    out = {}
    for name in model_names:
        final = load_model(rundir.model(name).root / "model").eval()
        h_final, logp = state(final)
        change = (final.get_output_embeddings().weight - base.get_output_embeddings().weight).detach().double()[second]
        aucs = {
            "loss": roc_auc_score(member, logp[torch.arange(len(second)), second].numpy()),
            "row . h_final": roc_auc_score(member, (change * h_final).sum(1).numpy()),
            "row . h_base": roc_auc_score(member, (change * h_base).sum(1).numpy()),
            "row . both": roc_auc_score(member, (change * (unit(h_base, dim=1) + unit(h_final, dim=1))).sum(1).numpy()),
        }
        rng, held = np.random.default_rng(0), []
        for _ in range(20):
            half = rng.random(len(member)) < 0.5
            direction = change[half & member].mean(0) - change[half & ~member].mean(0)
            held.append(roc_auc_score(member[~half], (change[~half] @ direction).numpy()))
        aucs["held-out direction"] = float(np.mean(held))
        hf = unit(h_final, dim=1)
        pairwise = (hf @ hf.T).numpy()[np.triu_indices(len(hf), 1)]
        share = {"own share base": base_share, "own share final": own_share(final, ids[:30])}
        rung = next(r for m in report["models"] if m["name"] == name for r in m["rungs"] if r["rung"] == "released")
        steps = rung["regime"]["steps"]
        kept = 1 / base_share - 1 + (1 / share["own share final"] - 1 / base_share) * (np.arange(steps) / steps)
        out[name] = {"cos base-final": float(torch.nn.functional.cosine_similarity(h_base, h_final).median()),
                     "cos across canaries": float(pairwise.mean()), **{k: float(v) for k, v in aucs.items()},
                     **share, "perfect": perfect_auc(run, name, rung),
                     "perfect, kept": perfect_auc(run, name, rung, signal=np.sqrt(1 / (1 + kept)))}
    return out


def own_share(model, pairs: list[list[int]]) -> float:
    """Median over the canaries ``pairs`` (token ids a, b) of the share of the squared norm of
    the gradient of -log p(b | a) that lies on b's output row."""
    params = list(model.parameters())
    row = next(i for i, p in enumerate(params) if p is model.get_output_embeddings().weight)
    shares = []
    for a, b in pairs:
        loss = -model(torch.tensor([[a, b]])).logits[0, 0].log_softmax(-1)[b]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        total = sum(g.square().sum() for g in grads if g is not None)
        shares.append(float(grads[row][b].square().sum() / total))
    return float(np.median(shares))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, action="append", required=True, help="a finished run (repeatable)")
    parser.add_argument("--model", action="append", help="a DP model of the runs (default: every DP model of its report)")
    args = parser.parse_args()

    columns = ["cos base-final", "cos across canaries", "loss", "row . h_final", "row . h_base", "row . both",
               "held-out direction", "own share base", "own share final", "perfect", "perfect, kept"]
    print(f"{'run':<28}{'model':<18}" + "".join(f"{c:>20}" for c in columns))
    for run in args.run:
        report = json.loads((run / "report.json").read_text())
        names = args.model or [m["name"] for m in report["models"] if m["privacy"] == "dp" and not m["error"]]
        for name, r in reads(run, report, names).items():
            print(f"{str(run)[-27:]:<28}{name:<18}" + "".join(f"{r[c]:>20.3f}" for c in columns))


if __name__ == "__main__":
    main()
