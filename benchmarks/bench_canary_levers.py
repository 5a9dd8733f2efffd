"""What do canary designs and training choices do to a one-run audit of a DP model?

    python benchmarks/bench_canary_levers.py --run RUN_DIR [--levers default,distinct,...] [--json]

RUN_DIR is a run directory with a trained base model (``dpaudit train --config demo``
makes one). For each lever the script

1. measures cross-talk: the cosine between the training gradients of 60 canaries at the base
   model (canaries whose gradients point the same way move each other's scores, the
   interference between canaries that limits one-run audits);
2. trains one DP-SGD model at ``--epsilon`` with that lever on the run's members plus a
   fresh set of m canaries (each in with probability 1/2) and scores the canaries five ways:
   the loss of the whole canary, the log-probability of its secret tokens, both minus the
   base model's, and the white-box projection of the total update on the canary's gradient
   at the base (what no black-box score can beat);
3. prints each score's AUC and its sound bounds (Steinke et al. 2023, arXiv 2305.08846; the
   DP-SGD family test, Mahloujifar et al. 2024, arXiv 2410.22235) at 0.05 over every test.

Levers: ``default`` (the demo's canaries), ``distinct`` (no token in two canaries),
``same_init`` (distinct, and every canary token's embedding set to their mean, so canaries
start alike), ``lr2e-5`` (distinct, a learning rate ten times smaller), ``m4000`` (4,000 canaries),
``length1`` and ``length16`` (canaries of 1 and 16 new tokens instead of 4), ``lr2e-3`` and ``lr1e-2`` (the
demo's canaries, a learning rate 10 and 50 times larger), ``sigma0.2``
(distinct, noise multiplier 0.2 instead of the target epsilon's: how much of the gap is
noise), ``no_notes`` (distinct, canaries only: how much is interference from the records),
``dp_references`` (the demo's canaries, and the secret score calibrated by 4 reference models
trained by the same DP trainer, each with its own random half of the canaries), and the
isolated designs, where only the input embedding trains (``model.trainable``):
``isolated_prefixed`` (distinct prefixed canaries), ``isolated`` (4 new tokens, no prefix),
``isolated_q1`` (the same at full batch, q = 1, 10 steps) and ``isolated_q1_m2000`` (2,000
canaries of 2 tokens, the ``new_token_bare`` set, at full batch); and ``pairs``
(the demo's ``new_token_pairs`` canaries in its full fine-tune: every parameter trains; on a
run prepared with them, as the demo is), ``pairs_redrawn`` (the same, with the canary tokens'
rows drawn afresh from the normal law of the other rows' mean and covariance) and
``pairs_sgd1``, ``pairs_sgd3`` (the same, trained by plain SGD at learning rate 1 and 3),
``pairs500`` and ``quads500`` (500 canaries of two and of four new tokens), ``pairs_zero_body`` (the
canary rows isolated as the train stage now does on a new run's base: on a run prepared before,
``pairs`` has them as pretraining left them) and ``pairs_zero_body_sgd1`` (the same, trained by
plain SGD at learning rate 1), ``shared_first`` and ``shared_first2000`` (the rows isolated, and one new
token, no secret's, first in every canary, its second token its own: 1,000 and 2,000 canaries from the
pairs' pool, every canary read at one hidden state), ``pairs_zero_body_lr1.5e-3`` and
``pairs_zero_body_lr2.5e-3`` (the rows isolated, the fine-tune's learning rate 1.5e-3 and 2.5e-3
instead of the demo's 5e-3: the canaries' rows drift less from the pool's mean) and
``pairs_zero_body_scale4``, ``pairs_zero_body_scale16`` (the rows isolated, then the whole pool's
rows, tied input and output, scaled by 4 and 16: a larger residual stream after a canary's first
token, so a smaller gradient from its state to the shared weights), ``pairs_zero_body_q0.2_T20`` and
``pairs_zero_body_q0.4_T10`` (the rows isolated, the batch 2 and 4 times the demo's for half and a
quarter of its steps: the same examples seen, a larger sampling rate at the same epsilon).

With ``--trace`` (levers of two-token canaries whose every parameter trains), each step of the
training also records, through a step hook on the optimizer, the share of a canary's squared
gradient norm on its second token's row (median over 30 canaries), the state after its first
token and that row of the step's noisy sum; the script then prints the share every fifth step
and the canary AUC of the white-box read of every step (the noisy sum on the canary's row, read
along that step's state, summed over the steps: what the mechanism put on the canary's row)
beside a perfect attack on plain SGD in that regime, whole (the ladder's final-model ideal
without the optimizer) and with the traced shares (``dpaudit.audit.ladder.ideal_scores``, signal
sqrt(share)), and how far the state after a first token moved (its cosine between the first
step and the last, median over the canaries). See docs/ceilings.md, "Where the rest of the gap lies".

Besides the five scores, two black-box ones: ``secret contrast``, a canary's secret-token
log-probabilities minus the mean log-probability of the whole new-token pool at the same
positions (what training does to all new tokens alike cancels), and the same minus the base
model's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_canary_reads import own_share
from torch.optim.optimizer import register_optimizer_step_pre_hook

LEVERS = {
    "default": {},
    "distinct": {"distinct": True},
    "same_init": {"distinct": True, "same_init": True},
    "lr2e-5": {"distinct": True, "lr": 2e-5},
    "sigma0.2": {"distinct": True, "sigma": 0.2},
    "no_notes": {"distinct": True, "no_notes": True},
    "m4000": {"num": 4000},
    "length1": {"length": 1},
    "length16": {"length": 16},
    "lr2e-3": {"lr": 2e-3},
    "lr1e-2": {"lr": 1e-2},
    "dp_references": {"references": 4},
    "isolated": {"distinct": True, "bare": True, "trainable": "input_embeddings", "length": 4},
    "isolated_prefixed": {"distinct": True, "trainable": "input_embeddings"},
    "isolated_q1": {"distinct": True, "bare": True, "trainable": "input_embeddings", "q": 1.0, "steps": 10,
                    "length": 4},
    "isolated_q1_m2000": {"distinct": True, "bare": True, "trainable": "input_embeddings", "q": 1.0, "steps": 10,
                          "num": 2000, "length": 2},
    "pairs": {"set": "new_token_pairs", "distinct": True},
    "pairs_redrawn": {"set": "new_token_pairs", "distinct": True, "redrawn": True},
    "pairs_sgd1": {"set": "new_token_pairs", "distinct": True, "optimizer": "sgd", "lr": 1.0},
    "pairs_sgd3": {"set": "new_token_pairs", "distinct": True, "optimizer": "sgd", "lr": 3.0},
    "pairs_zero_body": {"set": "new_token_pairs", "distinct": True, "zero_body": True},
    "pairs_zero_body_sgd1": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "optimizer": "sgd",
                             "lr": 1.0},
    "pairs500": {"set": "new_token_pairs", "distinct": True, "num": 500},
    "quads500": {"set": "new_token_pairs", "distinct": True, "num": 500, "length": 4},
    "pairs_zero_body_lr1.5e-3": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "lr": 1.5e-3},
    "pairs_zero_body_lr2.5e-3": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "lr": 2.5e-3},
    "pairs_zero_body_scale4": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "row_scale": 4.0},
    "pairs_zero_body_scale16": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "row_scale": 16.0},
    "pairs_zero_body_q0.2_T20": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "q": 0.2, "steps": 20},
    "pairs_zero_body_q0.4_T10": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "q": 0.4, "steps": 10},
    "shared_first": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "shared_first": True},
    "shared_first2000": {"set": "new_token_pairs", "distinct": True, "zero_body": True, "shared_first": True,
                         "num": 2000},
}


def canary_set(*, num: int, distinct: bool, seed: int, length: int | None = None, bare: bool = False,
               name: str | None = None):
    from dpaudit.canaries import load_canary_spec, make_canaries

    spec = load_canary_spec(name or ("new_token_bare" if bare else "new_token"))
    spec["secret"] = {**spec["secret"], "distinct": distinct, "length": length or spec["secret"]["length"]}
    return spec, make_canaries(spec=spec, num_canaries=num, seed=seed)


def unit_gradients(model, tokenizer, texts, project=None, embedding_only: bool = False):
    """Per-text gradients of the mean token NLL (the training loss), as unit vectors, over every
    parameter or (``embedding_only``) the input embedding alone; with ``project`` (a flat
    vector), each one's inner product with it instead (no gradient kept)."""
    out = []
    model.train(False)
    params = [model.get_input_embeddings().weight] if embedding_only else list(model.parameters())
    for text in texts:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        model.zero_grad(set_to_none=True)
        logp = model(ids).logits[0, :-1].log_softmax(-1).gather(1, ids[0, 1:, None])
        (-logp.mean()).backward()
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        g = g / g.norm()
        out.append(g if project is None else g @ project)
    return torch.stack(out)


def pool_contrast(model, tokenizer, texts, pool_ids, n_secret: int, batch: int = 64) -> np.ndarray:
    """Per canary: the sum over its secret positions of log p(its token) minus the mean log p
    of the whole new-token pool at that position (black-box: next-token distributions only).
    What the training of every canary does to all new tokens alike cancels; what the
    canary's own inclusions did to its tokens stays."""
    pool = torch.tensor(pool_ids)
    out = []
    model.train(False)
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            enc = tokenizer(texts[start:start + batch], return_tensors="pt", padding=True)
            logp = model(**enc).logits.float().log_softmax(-1)
            for row in range(logp.shape[0]):
                n = int(enc["attention_mask"][row].sum())
                k = min(n_secret, n - 1)  # a canary with no prefix: its first token is not predicted
                ids = enc["input_ids"][row, n - k:n]
                lp = logp[row, n - k - 1:n - 1]  # the predictions of the secret tokens
                out.append(float((lp.gather(1, ids[:, None]).squeeze(1) - lp[:, pool].mean(1)).sum()))
    return np.array(out)


def cross_talk(model, tokenizer, canaries, pool_ids, embedding_only: bool = False) -> dict:
    """The pairwise cosines of 60 canaries' gradients (over the parameters that train), and the
    share of each one's squared gradient norm on the embedding rows of its own tokens (the
    parameters nothing else trains when no token is in two canaries)."""
    texts = [c.text for c in canaries[:60]]
    g = unit_gradients(model, tokenizer, texts, embedding_only=embedding_only)
    cos = (g @ g.T).numpy()
    off = cos[np.triu_indices(len(cos), 1)]
    embedding = model.get_input_embeddings().weight
    if next(model.parameters()) is not embedding:
        raise ValueError("the input embedding is not the model's first parameter")
    width, new = embedding.shape[1], set(pool_ids)
    share = []
    for text, row in zip(texts, g):
        own = sorted(set(tokenizer(text)["input_ids"]) & new)
        share.append(float(row.view(-1)[: embedding.numel()].view(-1, width)[own].square().sum()))
    return {"mean_cos": float(off.mean()), "std_cos": float(off.std()), "own_rows_share": float(np.mean(share)),
            "own_rows_share_range": [float(min(share)), float(max(share))]}


def equalized_base(rundir, tokenizer, spec, out: Path) -> Path:
    """A copy of the base whose canary-token embeddings all equal their mean."""
    from dpaudit.canaries import canary_token_ids
    from dpaudit.models import load_model, save_model

    model = load_model(rundir.base_dir)
    ids = canary_token_ids(tokenizer, spec)
    with torch.no_grad():
        w = model.get_input_embeddings().weight
        w[ids] = w[ids].mean(0, keepdim=True)
    save_model(model, tokenizer, out)
    return out


def redrawn_base(rundir, tokenizer, spec, out: Path, *, seed: int) -> Path:
    """A copy of the base whose new-token rows are drawn afresh from the normal law with the
    mean and covariance of the other rows (what ``resize_token_embeddings`` does for tokens
    added after training): pretraining, which never sees them, pushes them all one way."""
    from dpaudit.canaries import canary_token_ids
    from dpaudit.models import load_model, save_model

    model = load_model(rundir.base_dir)
    ids = torch.tensor(canary_token_ids(tokenizer, spec))
    with torch.no_grad():
        w = model.get_input_embeddings().weight
        old = w[torch.ones(len(w), dtype=torch.bool).index_fill_(0, ids, False)]
        law = torch.distributions.MultivariateNormal(old.mean(0), covariance_matrix=torch.cov(old.T)
                                                     + 1e-6 * torch.eye(w.shape[1]))
        torch.manual_seed(seed)
        w[ids] = law.sample((len(ids),))
    save_model(model, tokenizer, out)
    return out


def zero_body_base(rundir, tokenizer, spec, canaries, out: Path, *, scale: float = 1.0) -> Path:
    """A copy of the base with the new-token rows isolated (:func:`dpaudit.models.isolate_token_rows`,
    what the train stage does to the base of a run with new-token canaries), then multiplied by
    ``scale``."""
    from dpaudit.canaries import canary_token_ids
    from dpaudit.models import isolate_token_rows, load_model, save_model

    model = load_model(rundir.base_dir)
    isolate_token_rows(model, token_ids=canary_token_ids(tokenizer, spec),
                       example_ids=tokenizer(canaries[0].text)["input_ids"])
    if scale != 1.0:
        with torch.no_grad():
            model.get_input_embeddings().weight[canary_token_ids(tokenizer, spec)] *= scale
    save_model(model, tokenizer, out)
    return out


class Tracer:
    """A step hook for every optimizer (``register_optimizer_step_pre_hook``): before each step
    of the training it copies the trained parameters into a copy of the base and records, for
    the two-token canaries ``pairs`` (token ids a, b), the state after a, the row of b in the
    step's noisy sum (``.grad`` of the output embedding: what the mechanism releases, divided
    by the expected batch size) and the median share of the squared gradient norm of
    -log p(b | a) on b's row over the first 30 canaries (``bench_canary_reads.own_share``)."""

    def __init__(self, base_dir: Path, pairs: list[list[int]]):
        from dpaudit.models import load_model

        if any(len(p) != 2 for p in pairs):
            raise SystemExit("--trace needs canaries of two tokens (the new_token_pairs set)")
        self.model = load_model(base_dir).eval()
        self.first, self.second = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
        self.states, self.rows, self.shares = [], [], []

    def __call__(self, optimizer, args, kwargs) -> None:
        trained = [p for group in optimizer.param_groups for p in group["params"]]
        params = list(self.model.parameters())
        if [p.shape for p in trained] != [p.shape for p in params]:
            raise SystemExit("--trace needs a training of every parameter")
        head = self.model.get_output_embeddings().weight
        where = next(i for i, p in enumerate(params) if p is head)
        with torch.no_grad():
            for mine, theirs in zip(params, trained):
                mine.copy_(theirs)
            self.states.append(self.model(self.first[:, None], output_hidden_states=True).hidden_states[-1][:, 0]
                               .double())
            self.rows.append(trained[where].grad[self.second].double().clone())
        self.shares.append(own_share(self.model, list(zip(self.first[:30].tolist(), self.second[:30].tolist()))))

    def result(self, member: np.ndarray, family: dict) -> dict:
        from sklearn.metrics import roc_auc_score

        from dpaudit.audit.ladder import ideal_scores

        states = torch.nn.functional.normalize(torch.stack(self.states), dim=2)
        white_box = -(torch.stack(self.rows) * states).sum(2).sum(0)  # descending the loss moves b's row along h
        shares = np.array(self.shares)
        rng = np.random.default_rng(0)
        perfect = rng.random(20_000) < 0.5
        whole, kept = (roc_auc_score(perfect, ideal_scores(np.random.default_rng(1), member=perfect, **family,
                                                           signal=signal))
                       for signal in (None, np.sqrt(shares)))
        return {"own_share_by_step": shares.tolist(), "white_box_auc": float(roc_auc_score(member, white_box.numpy())),
                "perfect_auc": float(whole), "perfect_auc_kept": float(kept),
                "state_cosine": float((states[0] * states[-1]).sum(1).median())}


def measure(rundir, *, lever: dict, num: int, epsilon: float, seed: int, work: Path, model: str | None = None,
            trace: bool = False) -> dict:
    import datasets

    from dpaudit.audit import CanaryScores, claimed_curve_bound
    from dpaudit.canaries import canary_token_ids, insert_canaries
    from dpaudit.data.corpus import tokenize_dataset
    from dpaudit.models import load_model
    from dpaudit.signals import compute_signals
    from dpaudit.stages.artifacts import read_tokenizer
    from dpaudit.stages.prepare import derive_seeds
    from dpaudit.stages.train import effective_config
    from dpaudit.train import TrainingRecord, dpsgd

    config, tok = rundir.read_config(), read_tokenizer(rundir)
    num = lever.get("num", num)
    spec, canaries = canary_set(num=num, distinct=lever.get("distinct", False), seed=seed,
                                length=1 if lever.get("shared_first") else lever.get("length"),
                                bare=lever.get("bare", False), name=lever.get("set"))
    if lever.get("shared_first"):  # one new token, not a secret's, first in every canary
        from dpaudit.canaries import new_tokens
        first = next(t for t in reversed(new_tokens(spec)) if all(c.secret != t for c in canaries))
        canaries = [dataclasses.replace(c, prefix=first, text=first + c.text) for c in canaries]
    embedding_only = lever.get("trainable") == "input_embeddings"
    included = np.array([c.included for c in canaries])
    base_dir = (equalized_base(rundir, tok, spec, work / "base") if lever.get("same_init")
                else redrawn_base(rundir, tok, spec, work / "base", seed=seed) if lever.get("redrawn")
                else zero_body_base(rundir, tok, spec, canaries, work / "base", scale=lever.get("row_scale", 1.0)) if lever.get("zero_body") else rundir.base_dir)
    base = load_model(base_dir)
    pool_ids = canary_token_ids(tok, spec)
    missing = sum(i is None or i == tok.unk_token_id for i in pool_ids)
    if missing:  # they would be split into ordinary tokens: the lever would not be the one named
        raise SystemExit(f"the run's tokenizer lacks {missing} of the lever's {len(pool_ids)} new tokens: prepare "
                         f"the run with canaries.set={spec['name']}")
    talk = cross_talk(base, tok, canaries, pool_ids, embedding_only=embedding_only)

    cands = rundir.read_candidates()
    members = [c for c in cands if c["role"] == "member"][: 1 if lever.get("no_notes") else None]
    rows = datasets.Dataset.from_dict({"text": [c["text"] for c in members], "unit_id": [c["unit_id"] for c in members]})
    held = [c for c in cands if c["role"] == "heldout"][:256]
    heldout = tokenize_dataset(datasets.Dataset.from_dict({"text": [c["text"] for c in held],
                                                           "unit_id": [c["unit_id"] for c in held]}),
                               tok, max_length=config.data.max_length)
    base_cfg = effective_config(rundir, config, model or config.model_names()[-1])
    dp = dataclasses.replace(base_cfg.train.dp, target_epsilon=None if "sigma" in lever else epsilon,
                             noise_multiplier=lever.get("sigma"))
    num_members = sum(c["role"] == "member" for c in cands)

    def train_with(planted, model_seed: int):
        """One DP-SGD model on the members plus the included ones of ``planted``."""
        ins = int(sum(c.included for c in planted))
        train = tokenize_dataset(insert_canaries(rows, planted, seed=derive_seeds(config.seed)["insertion"]), tok,
                                 max_length=config.data.max_length)
        # the same sampling rate as with every member: fewer units, a proportionally smaller batch
        batch = max(1, round(base_cfg.train.batch_size * (len(rows) + ins) / (num_members + ins)))
        if "q" in lever:  # protected units: the members' patients or examples, and the canaries
            units = len(set(rows["unit_id"])) if dp.unit == "user" else len(rows)
            batch = max(1, int(lever["q"] * (units + ins)))
        cfg = dataclasses.replace(base_cfg, model=dataclasses.replace(base_cfg.model, base_model=str(base_dir),
                                                                      trainable=lever.get("trainable", "all")),
                                  train=dataclasses.replace(base_cfg.train, lr=lever.get("lr", base_cfg.train.lr),
                                                            optimizer=lever.get("optimizer", base_cfg.train.optimizer),
                                                            dp=dp, batch_size=batch, eval_every=10**9,
                                                            steps=lever.get("steps", base_cfg.train.steps)))
        trained = TrainingRecord()
        return dpsgd(train, tok, seed=model_seed, config=cfg, record=trained, eval_dataset=heldout), trained

    tracer = Tracer(base_dir, [tok(c.text)["input_ids"] for c in canaries]) if trace else None
    t0 = time.perf_counter()
    handle = register_optimizer_step_pre_hook(tracer) if tracer else None
    try:
        model, trained = train_with(canaries, seed)
    finally:
        if handle is not None:
            handle.remove()
    train_s = time.perf_counter() - t0
    record, log = trained.dp, trained.log

    texts = [c.text for c in canaries]
    kw = {"batch_size": 64, "max_length": config.data.max_length, "device": "cpu", "progress": False}
    target, ref = compute_signals(model, tok, texts, **kw), compute_signals(base, tok, texts, **kw)
    count = target.mask.sum(1)
    n_secret = spec["secret"]["length"]
    secret = target.mask & (np.arange(target.mask.shape[1])[None, :] >= (count[:, None] - n_secret))

    def total(sig, mask):
        return np.where(mask, sig.logprob, 0.0).sum(1)

    if embedding_only:  # nothing else moved
        flat_update = (model.get_input_embeddings().weight - base.get_input_embeddings().weight).detach().flatten()
    else:
        flat_update = torch.cat([(p.detach() - p0.detach()).flatten() for p, p0 in zip(model.parameters(),
                                                                                      base.parameters())])
    projection = unit_gradients(base, tok, texts, project=flat_update, embedding_only=embedding_only)
    loss, secret_lp, base_secret = total(target, target.mask), total(target, secret), total(ref, secret)
    scores = {
        "loss": loss / count,
        "secret": secret_lp,
        "loss - base": (loss - total(ref, target.mask)) / count,
        "secret - base": secret_lp - base_secret,
        "white-box projection": (-projection).numpy(),
    }
    if lever.get("references"):
        # DP reference models: the same trainer, each canary in with probability 1/2 afresh;
        # a canary's score minus its mean score in the references that left it out
        rng = np.random.default_rng(seed + 7)
        ref_scores, ref_in = [], []
        for r in range(lever["references"]):
            flags = rng.random(num) < 0.5
            ref_model, _ = train_with([dataclasses.replace(c, included=bool(f)) for c, f in zip(canaries, flags)],
                                      seed + 1 + r)
            sig = compute_signals(ref_model, tok, texts, **kw)
            ref_scores.append(total(sig, secret) - base_secret)
            ref_in.append(flags)
        ref_scores, ref_in = np.array(ref_scores), np.array(ref_in)
        out_count = (~ref_in).sum(0)
        out_mean = np.where(out_count > 0, (ref_scores * ~ref_in).sum(0) / np.maximum(out_count, 1),
                            ref_scores.mean(0))
        scores["secret - DP references"] = scores["secret - base"] - out_mean
    contrast = pool_contrast(model, tok, texts, pool_ids, n_secret)
    scores["secret contrast"] = contrast
    scores["secret contrast - base"] = contrast - pool_contrast(base, tok, texts, pool_ids, n_secret)
    family = record.dpsgd_parameters
    traced = tracer.result(included, family) if tracer else None
    significance = 0.05 / (2 * len(scores))
    out = {"sigma": record.noise_multiplier, "sample_rate": record.sample_rate, "steps": record.steps,
           "num_canaries": num, "train_s": round(train_s, 1), "heldout_perplexity": log[-1].get("heldout_perplexity"),
           "cross_talk": talk, "trace": traced, "scores": {}}
    for name, s in scores.items():
        cs = CanaryScores.from_labels(scores=s, is_member=included, seed=0)
        out["scores"][name] = {
            "auc": float(cs.auc()),
            "one_run": cs.bound("one_run", delta=record.delta, significance=significance).epsilon,
            "family": claimed_curve_bound(cs, **family, delta=record.delta, significance=significance).epsilon,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a run directory with a trained base model")
    parser.add_argument("--levers", default=",".join(LEVERS))
    parser.add_argument("--num-canaries", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", help="the model of the run whose trainer settings the levers use (default: the last)")
    parser.add_argument("--trace", action="store_true", help="record each step's canary share and white-box read")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from dpaudit.rundir import RunDir

    rundir = RunDir(args.run)
    names = [n.strip() for n in args.levers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(LEVERS))
    if unknown:
        parser.error(f"unknown lever(s) {', '.join(unknown)}; known: {', '.join(LEVERS)}")
    results = {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix="dpaudit-lever-") as work:
            results[name] = measure(rundir, lever=LEVERS[name], num=args.num_canaries, epsilon=args.epsilon, model=args.model,
                                    seed=args.seed, work=Path(work), trace=args.trace)
        if not args.json:
            r = results[name]
            print(f"\n{name}: sigma {r['sigma']:.2f}, q {r['sample_rate']:.3f}, T {r['steps']}, train {r['train_s']:.0f} s,"
                  f" held-out ppl {r['heldout_perplexity']:.3f}, canary-gradient cosine "
                  f"{r['cross_talk']['mean_cos']:.2f} +- {r['cross_talk']['std_cos']:.2f}, share of its squared "
                  f"norm on its own token rows {r['cross_talk']['own_rows_share']:.3f}")
            for score, v in r["scores"].items():
                print(f"  {score:<22} AUC {v['auc']:.3f}   one-run {v['one_run']:.2f}   family {v['family']:.2f}")
            if r["trace"]:
                t = r["trace"]
                shares = ", ".join(f"{x:.3f}" for x in t["own_share_by_step"][::5])
                print(f"  trace: own-row share every fifth step {shares} (last {t['own_share_by_step'][-1]:.3f});"
                      f" white-box read of each step AUC {t['white_box_auc']:.3f}; perfect on plain SGD"
                      f" {t['perfect_auc']:.3f}, with these shares {t['perfect_auc_kept']:.3f}; the state after a"
                      f" first token, first step against last: cosine {t['state_cosine']:.2f}")
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
