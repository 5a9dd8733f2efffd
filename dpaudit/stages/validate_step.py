"""``dpaudit validate --step``: white-box audit of one DP-SGD update step.

Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis 2023, "Tight Auditing of
Differentially Private Machine Learning" (arXiv 2302.07956): a white-box auditor who can
run one step many times from the same parameters measures that step's privacy tightly,
where a black-box audit of a final model sees only gross bugs. What it does:

1. takes a tiny GPT-2-style causal LM (:func:`dpaudit.models.build_model`), or with ``arch`` a
   tiny model of another family (:func:`dpaudit.models.build_tiny`: Llama, OPT and GPT-NeoX have
   ``nn.Linear`` where GPT-2 has ``Conv1D``), or with ``model_dir`` the user's own (in float32);
   a fixed batch D of random rows (b = min(B - 1, 7), at least 1) of tokens from the lower half
   of its vocabulary, and a canary row of tokens from the upper half, which D does not use;
2. crafts the canaries (:mod:`dpaudit.train.step_canaries`): the canary row at perturbations
   of the model that make one kind of parameter dominate the row's gradient g (and one spread
   over all), g's part in that kind at least ``NORM_FACTOR`` x C: a step that leaves a kind out
   of clipping, or computes its per-example norm wrongly, exceeds C on that kind's canary;
3. for each canary, runs the step R times on D and R times on D + canary, each on a fresh copy
   of that canary's model with fresh noise, and projects each update on -g / ||g|| and on its
   restriction to each kind and to each parameter tensor;
4. derives a rigorous lower bound on the step's Gaussian-DP mu
   (:func:`dpaudit.audit.two_sample.mu_bound_over_pairs`: canary, statistic and threshold
   chosen on half of the runs, Clopper-Pearson on the other half; no Gaussian assumption), and
   apart the Gaussian estimate of mu on each canary's full direction;
5. compares mu_lb with the claim: with the canary surely in the batch (no subsampling), a
   step that is the Gaussian mechanism with sensitivity C and noise N(0, S^2 C^2 I) is
   exactly (1/S)-GDP (Dong, Roth, Su 2019, arXiv 1905.02383) at any parameters. Epsilons are
   the mu-GDP conversions at delta.

Verdicts and exit codes as ``validate --trainer``: ``violated`` (1) when mu_lb > 1/S (the
verdict names the canary and the statistic that showed it), ``inconclusive`` (3) when even a
perfect separation of the runs could not exceed 1/S (the ceiling; add repetitions) or the step
never changed the parameters, ``consistent`` (0) otherwise, which is not a proof of privacy.

From one step to the run (with the run's sampling rate q and number of steps T): with
confidence 1 - significance the step's effective noise multiplier (noise std over the
sensitivity the canary had) is at most 1/mu_lb, so the accountant's epsilon of Poisson-
sampled DP-SGD at that noise, q and T (:func:`dpaudit.accounting.epsilon`) is "the epsilon
this step's measured noise implies": a lower bound, at that confidence, on what an honest
accountant would have to certify for the run (assuming its sampling and composition are
as claimed). It is reported beside the claimed run epsilon (the accountant at S).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpaudit.audit.verdict import Status
from dpaudit.errors import InputError
from dpaudit.jsonable import jsonable
from dpaudit.rundir import RunDir, write_json_atomic, write_npz_atomic
from dpaudit.seeds import derive_seed, seed_sequence
from dpaudit.stages.artifacts import read_dp_record
from dpaudit.train.step_canaries import NORM_FACTOR, RECIPES, iter_canaries

SIGNIFICANCE = 0.05
DEFAULT_REPETITIONS = 200
DEFAULT_DELTA = 1e-5
VOCAB_SIZE = 256  # of the tiny models built here
ROW_LENGTH = 16
CANARY_LENGTH = 8
MAX_BATCH_ROWS = 7
ONE_THREAD_PARAMETERS = 10_000_000
MIN_RUN_NOISE = 0.5  # the run epsilon is computed at noise multipliers >= this (see _run_epsilons)
SCHEMA_VERSION = 1
JSON_KEYS = ("verdict", "epsilon_lower_bound", "claimed_epsilon", "mu_lower_bound", "claimed_mu", "repetitions",
             "reason", "delta", "significance", "mu_ceiling", "estimate", "run", "canary", "statistic")

__all__ = ["JSON_KEYS", "validate_step"]


# --------------------------------------------------------------------------- checks


def _positive(name: str, value, *, integer: bool = False) -> float | int:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) and \
        math.isfinite(float(value)) and value > 0
    if integer:
        ok = ok and float(value).is_integer()
    if not ok:
        raise InputError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r}")
    return int(value) if integer else float(value)


def _load_step(spec: str) -> Callable[..., None]:
    """Import ``MODULE:FUNCTION``; it must take the keyword ``generator``."""
    from dpaudit.plugins import load_callable

    fn = load_callable(spec, what="step")
    params = inspect.signature(fn).parameters
    if "generator" not in params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise InputError(f"the step {spec} must take the keyword argument generator: "
                         "step(model, batch, *, generator) -> None")
    return fn


# --------------------------------------------------------------------------- the setting


def _model(seed: int, *, model_dir, arch: str | None, tied: bool | None, trust_remote_code: bool):
    """The model the canaries are crafted for, in training mode and float32, and its description."""
    from dpaudit import models

    if model_dir is not None and (arch is not None or tied is not None):
        raise InputError("--model-dir takes the model as saved: --arch and --untied go without it")
    if model_dir is not None:
        model = models.load_model(model_dir, trust_remote_code=trust_remote_code).float()
        described = f"{model_dir} ({getattr(model.config, 'model_type', type(model).__name__)})"
    else:
        if trust_remote_code:
            raise InputError("--trust-remote-code goes with --model-dir")
        model = models.build_tiny(arch or "gpt2", vocab_size=VOCAB_SIZE, bos_token_id=0, eos_token_id=0, seed=seed,
                                  tied=tied)
        tying = "tied" if model.get_output_embeddings().weight is model.get_input_embeddings().weight else "untied"
        described = ("tiny GPT-2 (dpaudit.models.build_model)" if arch is None and tied is None
                     else f"tiny {arch or 'gpt2'}, {tying} (dpaudit.models.build_tiny)")
    model.train()
    return model, described


def _batches(rng: np.random.Generator, rows: int, vocab_size: int) -> tuple[dict, dict]:
    """D (``rows`` random rows of tokens 1..V/2-1) and D + canary (tokens V/2..V-1, shorter,
    right-padded, last row)."""
    half = vocab_size // 2
    if half < 2:
        raise InputError(f"the model's vocabulary ({vocab_size} tokens) is too small for the step audit")
    d = torch.as_tensor(rng.integers(1, half, size=(rows, ROW_LENGTH)), dtype=torch.long)
    canary = torch.zeros(1, ROW_LENGTH, dtype=torch.long)
    canary[0, :CANARY_LENGTH] = torch.as_tensor(rng.integers(half, vocab_size, size=CANARY_LENGTH))
    mask = torch.ones(rows, ROW_LENGTH, dtype=torch.long)
    canary_mask = (torch.arange(ROW_LENGTH) < CANARY_LENGTH).long()[None]
    return ({"input_ids": d, "attention_mask": mask},
            {"input_ids": torch.cat([d, canary]), "attention_mask": torch.cat([mask, canary_mask])})


@contextlib.contextmanager
def _threads_for(model):
    """One torch thread (restored after) while a small model runs: its many small operations
    run fastest so, and a thread pool stalls on each whenever another process holds a core."""
    saved = torch.get_num_threads()
    if sum(p.numel() for p in model.parameters()) < ONE_THREAD_PARAMETERS:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


# --------------------------------------------------------------------------- the audit


def validate_step(*, step: str | Callable[..., None], noise_multiplier: float, max_grad_norm: float,
                  expected_batch_size: int, repetitions: int = DEFAULT_REPETITIONS, delta: float = DEFAULT_DELTA,
                  sample_rate: float | None = None, steps: int | None = None, accountant: str | None = None,
                  significance: float = SIGNIFICANCE, seed: int = 0, out: str | Path | None = None,
                  model: str | None = None, model_dir: str | Path | None = None, arch: str | None = None,
                  tied: bool | None = None, trust_remote_code: bool = False,
                  canaries: Sequence[str] | None = None) -> dict[str, Any]:
    """White-box audit of one DP-SGD step against the claim (S, C, B) (see the module docstring).

    The model: the tiny GPT-2 by default, ``arch`` (with ``tied``) a tiny model of that family,
    ``model_dir`` a local causal-LM directory. ``canaries`` names some of
    :data:`dpaudit.train.step_canaries.RECIPES` (default all the model allows). ``model`` is the
    run directory's model whose q and T the run epsilon composes. Returns a dict with
    :data:`JSON_KEYS` and the details (exit_code, the test, each canary's design and estimate
    under ``canaries``, and under ``run`` the epsilon the measured noise implies over q and T,
    given or from ``out``'s DP event, whose accountant is the default, else "pld"). With ``out``
    it writes ``out/step_audit.json`` and the projections ``out/step_audit.npz``.
    """
    from dpaudit.audit.two_sample import mu_bound_over_pairs

    sigma, c, b, r = _check_claim(noise_multiplier, max_grad_norm, expected_batch_size, repetitions, delta)
    run = _run_parameters(sample_rate=sample_rate, steps=steps, out=out, model=model)
    fn = _load_step(step) if isinstance(step, str) else step
    if not callable(fn):
        raise InputError(f"step must be MODULE:FUNCTION or a callable, got {step!r}")
    name = step if isinstance(step, str) else f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"

    model0, described = _model(derive_seed(seed, 0), model_dir=model_dir, arch=arch, tied=tied,
                               trust_remote_code=trust_remote_code)
    rows = max(1, min(b - 1, MAX_BATCH_ROWS))
    vocab = model0.get_input_embeddings().weight.shape[0]
    batch, batch_with = _batches(np.random.default_rng(derive_seed(seed, 1)), rows, vocab)
    claim = dict(noise_multiplier=sigma, max_grad_norm=c, expected_batch_size=b)
    unknown = sorted(set(canaries or ()) - {recipe.name for recipe in RECIPES})
    if unknown:
        raise InputError(f"unknown canaries {unknown}: expected some of {[recipe.name for recipe in RECIPES]}")
    with _threads_for(model0):
        done, moved, skipped = _run_canaries(fn, name, model0, batch, batch_with, c, canaries, repetitions=r,
                                             seed=seed, claim=claim)
    bound = mu_bound_over_pairs(pairs=[(d.samples["in"], d.samples["out"]) for d in done],
                                significance=significance, seed=seed)
    setting = {"model": described, "vocab_size": vocab, "batch_rows": rows, "row_length": ROW_LENGTH,
               "canary_length": CANARY_LENGTH, "canary_gradient_norm": min(d.summary["kind_gradient_norm"] for d in done),
               "norm_factor": NORM_FACTOR, "num_statistics": sum(len(d.labels) for d in done),
               "skipped_canaries": skipped, "seed": seed}
    result = _result(name, bound, done, sigma=sigma, c=c, b=b, r=r, delta=delta, significance=significance,
                     moved=moved, setting=setting)
    if run is not None:
        est = result["estimate"]
        result["run"] = _run_epsilons(run, mu_lb=bound.mu, estimate=(est["mu"], *est["mu_interval"]), sigma=sigma,
                                      delta=delta, accountant=accountant or run.pop("accountant", None) or "pld",
                                      significance=significance)
    result = jsonable(result)
    if out is not None:
        _write(out, result, done)
    return result


def _check_claim(noise_multiplier, max_grad_norm, expected_batch_size, repetitions, delta) -> tuple:
    """(S, C, B, R) checked, each positive (B and R integers, R >= 8), and delta in (0, 1)."""
    sigma = _positive("--noise-multiplier", noise_multiplier)
    c = _positive("--max-grad-norm", max_grad_norm)
    b = _positive("--expected-batch-size", expected_batch_size, integer=True)
    r = _positive("--repetitions", repetitions, integer=True)
    if r < 8:
        raise InputError(f"--repetitions must be at least 8 (half of the runs choose the test), got {r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise InputError(f"--delta must be in (0, 1), got {delta}")
    return sigma, c, b, r


def _result(name: str, bound, done: list[_Done], *, sigma, c, b, r, delta, significance, moved, setting) -> dict:
    """The step audit's result (before the run epsilon): verdict, bound, estimates, canaries."""
    from dpaudit.audit.bounds import gdp_epsilon
    from dpaudit.audit.two_sample import gaussian_mu_estimate

    chosen = done[bound.pair].summary
    label = done[bound.pair].labels[bound.column]
    estimates = [gaussian_mu_estimate(in_samples=d.samples["in"][:, 0], out_samples=d.samples["out"][:, 0],
                                      confidence=1.0 - significance) for d in done]
    claimed_mu = 1.0 / sigma
    claimed_eps, eps_lb = gdp_epsilon(mu=claimed_mu, delta=delta), gdp_epsilon(mu=bound.mu, delta=delta)
    verdict, reason = _decide(bound, claimed_mu=claimed_mu, moved=moved, repetitions=r, significance=significance,
                              statistic=f"canary {chosen['name']!r} ({chosen['description']}), the projection on "
                                        f"{label}",
                              violation=(f"the step is not the Gaussian mechanism with noise multiplier {sigma:g} and "
                                         f"clipping norm {c:g} (epsilon >= {eps_lb:.3f} against {claimed_eps:.3f} at "
                                         f"delta {delta:g})"))
    estimate, est_low, est_high = estimates[0]
    return {
        "verdict": verdict, "reason": reason, "exit_code": int(Status(verdict).exit_code), "step": name,
        "epsilon_lower_bound": eps_lb, "claimed_epsilon": claimed_eps, "mu_lower_bound": bound.mu,
        "claimed_mu": claimed_mu, "repetitions": r, "delta": delta, "significance": significance,
        "confidence": 1.0 - significance, "mu_ceiling": bound.ceiling,
        "epsilon_ceiling": gdp_epsilon(mu=bound.ceiling, delta=delta),
        "canary": chosen["name"], "statistic": label, "test": bound.to_dict(),
        "estimate": {  # assumes Gaussian projections with one variance: never a verdict
            "canary": done[0].summary["name"], "mu": estimate, "mu_interval": [est_low, est_high],
            "noise_multiplier": 1.0 / estimate if estimate > 0 else math.inf,
            "epsilon": gdp_epsilon(mu=max(estimate, 0.0), delta=delta) if math.isfinite(estimate) else math.inf,
            "assumes": "Gaussian projections with one variance (true for a correct Gaussian step)",
        },
        "canaries": [{**d.summary, "estimate": {"mu": e[0], "mu_interval": [e[1], e[2]]}} for d, e in zip(done, estimates)],
        "claim": dict(noise_multiplier=sigma, max_grad_norm=c, expected_batch_size=b),
        "setting": setting,
        "run": None,
    }


def _write(out, result: dict, done: list[_Done]) -> None:
    rundir = RunDir(out)
    rundir.root.mkdir(parents=True, exist_ok=True)
    arrays = {"canaries": np.array([d.summary["name"] for d in done])}
    for d in done:
        arrays.update({f"in_{d.summary['name']}": d.samples["in"], f"out_{d.summary['name']}": d.samples["out"],
                       f"statistics_{d.summary['name']}": np.array(d.labels)})
    write_npz_atomic(rundir.step_samples_path, **arrays)
    write_json_atomic(rundir.step_audit_path, {"schema_version": SCHEMA_VERSION, **result})


@dataclass
class _Done:
    """What is kept of a canary once its runs are done: its summary, the labels of its statistics
    and its projections (``{"in": [R, K], "out": [R, K]}``); its model and gradient are let go."""

    summary: dict
    labels: list[str]
    samples: dict[str, np.ndarray]


def _run_canaries(fn, name: str, model0, batch, batch_with, max_grad_norm: float, names, *, repetitions: int,
                  seed: int, claim: dict) -> tuple[list[_Done], bool, dict[str, str]]:
    """Each canary in turn (:func:`dpaudit.train.step_canaries.iter_canaries`: made, run by
    :func:`_projections`, let go), whether any run moved the model, and the skipped canaries."""
    from dpaudit.progress import Progress

    row = batch_with["input_ids"][-1][batch_with["attention_mask"][-1].bool()]
    done, moved, skipped = [], False, {}
    bar = Progress(total=2 * repetitions * len(names or RECIPES), desc="step audit", unit="run")
    try:
        for index, (canary_name, canary) in enumerate(iter_canaries(model0, row, max_grad_norm=max_grad_norm,
                                                                    names=names)):
            if isinstance(canary, str):
                skipped[canary_name] = canary
                continue
            seeds = [int(seed_sequence([seed, 1], index, i).generate_state(1, np.uint64)[0] >> 1)
                     for i in range(2 * repetitions)]  # independent noise for each run
            samples, its_moved = _projections(fn, name, canary, batch, batch_with, repetitions=repetitions,
                                              seeds=seeds, claim=claim, bar=bar)
            done.append(_Done(canary.summary(), list(canary.statistics.labels), samples))
            moved = moved or its_moved
    finally:
        bar.close()
    if not done:
        raise InputError(f"no canary could be made for this model ({'; '.join(f'{k}: {v}' for k, v in skipped.items())}"
                         f"); a canary needs a gradient of {NORM_FACTOR:g} x C: a smaller --max-grad-norm may help")
    return done, moved, skipped


def _projections(fn, name: str, canary, batch, batch_with, *, repetitions: int, seeds: list[int], claim: dict,
                 bar) -> tuple[dict[str, np.ndarray], bool]:
    """``({"in": [R, K], "out": [R, K]}, moved)``: the step run R times on D + canary and R
    times on D, interleaved, each on a fresh copy of the canary's model with a fresh noise
    generator, its update projected on the canary's K statistics; whether any run changed the
    parameters."""
    from dpaudit.train.step import call_step

    r, stats = repetitions, canary.statistics
    theta0 = _params(canary.model, stats.names)
    projections = {"in": np.empty((r, len(stats))), "out": np.empty((r, len(stats)))}
    moved = False
    for i in range(r):
        for j, which in enumerate(("out", "in")):  # interleaved: a drift affects both samples alike
            m = copy.deepcopy(canary.model)
            generator = torch.Generator().manual_seed(seeds[2 * i + j])
            try:
                call_step(fn, m, batch_with if which == "in" else batch, generator=generator, **claim)
            except InputError:
                raise
            except Exception as err:  # noqa: BLE001 -- the user's code: one clear line, not a traceback
                raise InputError(f"the step {name} failed: {type(err).__name__}: {err}") from None
            after = _params(m, stats.names)
            update = {n: after[n] - theta0[n] for n in stats.names}
            if not all(bool(torch.isfinite(u).all()) for u in update.values()):
                raise InputError(f"the step {name} produced a non-finite update")
            moved = moved or any(bool(u.abs().max() > 0) for u in update.values())
            projections[which][i] = stats.project(update)
            bar.update(1)
    return projections, moved


def _params(model, names: list[str]) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    missing = [n for n in names if n not in params]
    if missing:
        raise InputError(f"the step changed the model's parameters (missing after the step: {', '.join(missing[:3])})")
    return {n: params[n].detach().float().clone() for n in names}


def _decide(bound, *, claimed_mu: float, moved: bool, repetitions: int, significance: float, statistic: str,
            violation: str) -> tuple[str, str]:
    """(verdict, reason) of the step audit: the mu bound against the claimed 1/S."""
    if bound.mu > claimed_mu:
        return "violated", (f"mu >= {bound.mu:.3f} ({1 - significance:.0%} confidence, {statistic}) exceeds the "
                            f"claimed 1/S = {claimed_mu:.3f}: {violation}")
    if not moved:
        return "inconclusive", "the step never changed the model's parameters, so its privacy cannot be measured"
    if bound.ceiling <= claimed_mu:
        return "inconclusive", (f"even a perfect separation of {repetitions} runs a side gives at most mu >= "
                                f"{bound.ceiling:.3f} <= the claimed 1/S = {claimed_mu:.3f}: add --repetitions")
    return "consistent", (f"mu >= {bound.mu:.3f} ({statistic}) does not exceed the claimed 1/S = {claimed_mu:.3f}, "
                          f"beside a ceiling of {bound.ceiling:.3f} for {repetitions} runs a side: consistent with "
                          "the claim, which is not a proof of privacy")


# --------------------------------------------------------------------------- from one step to the run


def _run_parameters(*, sample_rate, steps, out, model) -> dict | None:
    """(q, T) from the arguments, else from the DP event of ``model`` (or of the only DP-SGD
    model) of the run directory ``out``; None when neither gives them."""
    if (sample_rate is None) != (steps is None):
        raise InputError("--sample-rate and --steps go together (the run's Poisson rate q and number of steps T)")
    if sample_rate is not None:
        q = float(sample_rate)
        if not 0 < q <= 1:
            raise InputError(f"--sample-rate must be in (0, 1], got {sample_rate}")
        return {"sample_rate": q, "steps": _positive("--steps", steps, integer=True), "source": "arguments"}
    if out is None or not RunDir(out).exists():
        if model is not None:
            raise InputError(f"--model {model} needs --out to be a run directory")
        return None
    rundir = RunDir(out)
    found = {}
    for n in rundir.model_names():
        record = read_dp_record(rundir.model(n))
        params = record.dpsgd_parameters if record is not None else None
        if params is not None:
            found[n] = {**params, "accountant": record.accountant}
    if model is not None:
        if model not in found:
            raise InputError(f"model {model!r} of {out} has no DP-SGD event (dp_event.json)")
        chosen = model
    elif len(found) == 1:
        chosen = next(iter(found))
    else:
        return None
    return {"sample_rate": found[chosen]["sample_rate"], "steps": found[chosen]["steps"], "model": chosen,
            "source": f"models/{chosen}/dp_event.json", "accountant": found[chosen]["accountant"]}


def _epsilon_at(noise: float, run: dict, delta: float, accountant: str) -> float | None:
    """The accountant's epsilon at noise multiplier ``noise`` (0 at infinite noise; None when
    the accountant cannot evaluate it)."""
    from dpaudit import accounting

    if noise == math.inf:
        return 0.0
    try:
        return accounting.epsilon(noise_multiplier=noise, sample_rate=run["sample_rate"], steps=run["steps"],
                                  delta=delta, method=accountant)
    except (ValueError, OverflowError, ArithmeticError, InputError):
        return None


def _run_epsilons(run: dict, *, mu_lb: float, estimate: tuple[float, float, float], sigma: float, delta: float,
                  accountant: str, significance: float) -> dict:
    """The run's claimed epsilon and the epsilon the step's measured noise implies.

    Below ``MIN_RUN_NOISE`` the accountant is slow (minutes) and its epsilon is huge: a noise
    bound below it is raised to it, which keeps the epsilon a lower bound (a larger noise
    multiplier has a smaller epsilon), marked ``at_least``; an estimate below it is None."""
    noise_ub = 1.0 / mu_lb if mu_lb > 0 else math.inf
    mu_hat, low, high = estimate

    def noise_of(mu: float) -> float:
        return 1.0 / mu if mu > 0 else math.inf

    def estimated(mu: float) -> float | None:
        noise = noise_of(mu)
        return _epsilon_at(noise, run, delta, accountant) if noise >= MIN_RUN_NOISE else None

    return {
        **run,
        "delta": delta,
        "accountant": accountant,
        "claimed_epsilon": _epsilon_at(sigma, run, delta, accountant),
        "noise_multiplier_upper_bound": noise_ub,
        "epsilon_lower_bound": _epsilon_at(max(noise_ub, MIN_RUN_NOISE), run, delta, accountant),
        "at_least": noise_ub < MIN_RUN_NOISE,
        "confidence": 1.0 - significance,
        "estimate": {"noise_multiplier": noise_of(mu_hat), "epsilon": estimated(mu_hat),
                     "epsilon_interval": [estimated(low), estimated(high)]},
    }

