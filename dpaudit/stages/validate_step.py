"""``dpaudit validate --step``: white-box audit of one DP-SGD update step.

Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis 2023, "Tight Auditing of
Differentially Private Machine Learning" (arXiv 2302.07956): a white-box auditor who can
run one step many times from the same parameters measures that step's privacy tightly,
where a black-box audit of a final model sees only gross bugs. What it does:

1. builds a tiny GPT-2-style causal LM (:func:`dpaudit.models.build_model`) and a fixed
   batch D of random token rows (b = min(B - 1, 7) rows, at least 1), and a canary row of
   tokens D does not use;
2. computes the canary's own gradient g at the initial parameters, with the toolkit's
   per-example loss (:mod:`dpaudit.train.engine`); if ||g|| is below ``NORM_FACTOR`` x C the
   final layer norm's gain is raised until it is not, so that a step that fails to clip
   shows a sensitivity far above C;
3. runs the step R times on D and R times on D + canary, each time on a fresh copy of the
   same initial model with a fresh noise generator, and projects each update on the
   canary's descent direction -g / ||g|| and, as further candidates, on its restriction to
   each parameter tensor (a step that leaves some tensors unclipped shows there);
4. derives from the two samples a rigorous lower bound on the step's Gaussian-DP mu
   (:func:`dpaudit.audit.two_sample.two_sample_mu_bound`: statistic and threshold chosen
   on half of the runs, Clopper-Pearson on the other half; no Gaussian assumption), and,
   apart, the Gaussian estimate of mu with its interval on the full direction;
5. compares mu_lb with the claim: with the canary surely in the batch (no subsampling), a
   step that is the Gaussian mechanism with sensitivity C and noise N(0, S^2 C^2 I) is
   exactly (1/S)-GDP (Dong, Roth, Su 2019, arXiv 1905.02383). Epsilons are the mu-GDP
   conversions at delta.

Verdicts and exit codes as ``validate --trainer``: ``violated`` (1) when mu_lb > 1/S,
``inconclusive`` (3) when even a perfect separation of the runs could not exceed 1/S (the
ceiling; add repetitions) or the step never changed the parameters, ``consistent`` (0)
otherwise, which is not a proof of privacy.

From one step to the run (with the run's sampling rate q and number of steps T): with
confidence 1 - significance the step's effective noise multiplier (noise std over the
sensitivity the canary had) is at most 1/mu_lb, so the accountant's epsilon of Poisson-
sampled DP-SGD at that noise, q and T (:func:`dpaudit.accounting.epsilon`) is "the epsilon
this step's measured noise implies": a lower bound, at that confidence, on what an honest
accountant would have to certify for the run (assuming its sampling and composition are
as claimed). It is reported beside the claimed run epsilon (the accountant at S).
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
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

SIGNIFICANCE = 0.05
DEFAULT_REPETITIONS = 200
DEFAULT_DELTA = 1e-5
NORM_FACTOR = 10.0  # the canary's unclipped gradient norm is at least this many times C
VOCAB_SIZE = 256
ROW_LENGTH = 16
CANARY_LENGTH = 8
MAX_BATCH_ROWS = 7
MIN_RUN_NOISE = 0.5  # the run epsilon is computed at noise multipliers >= this (see _run_epsilons)
SCHEMA_VERSION = 1
JSON_KEYS = ("verdict", "epsilon_lower_bound", "claimed_epsilon", "mu_lower_bound", "claimed_mu", "repetitions",
             "reason", "delta", "significance", "mu_ceiling", "estimate", "run")

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


def _batches(rng: np.random.Generator, rows: int) -> tuple[dict, dict]:
    """D (``rows`` random rows of tokens 1..V/2-1) and D + canary (tokens V/2..V-1, shorter,
    right-padded, last row)."""
    half = VOCAB_SIZE // 2
    d = torch.as_tensor(rng.integers(1, half, size=(rows, ROW_LENGTH)), dtype=torch.long)
    canary = torch.zeros(1, ROW_LENGTH, dtype=torch.long)
    canary[0, :CANARY_LENGTH] = torch.as_tensor(rng.integers(half, VOCAB_SIZE, size=CANARY_LENGTH))
    mask = torch.ones(rows, ROW_LENGTH, dtype=torch.long)
    canary_mask = (torch.arange(ROW_LENGTH) < CANARY_LENGTH).long()[None]
    return ({"input_ids": d, "attention_mask": mask},
            {"input_ids": torch.cat([d, canary]), "attention_mask": torch.cat([mask, canary_mask])})


def _canary_gradient(model, batch_with: dict) -> dict[str, torch.Tensor]:
    """Gradient of the canary's own loss (mean NLL of its predicted tokens) at ``model``."""
    from dpaudit.train.engine import (
        collate,
        example_losses,
        forward_logits,
        trainable_parameters,
    )

    ids, mask = batch_with["input_ids"][-1], batch_with["attention_mask"][-1]
    batch = collate([ids[mask.bool()]], pad_id=0)
    params = trainable_parameters(model)
    model.zero_grad(set_to_none=True)
    example_losses(forward_logits(model, batch), batch.labels).sum().backward()
    grads = {name: p.grad.detach().clone().float() for name, p in params.items()}
    model.zero_grad(set_to_none=True)
    return grads


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(g.pow(2).sum() for g in grads.values())))


def _build(seed: int, rows: int, max_grad_norm: float):
    """The model, D, D + canary and the canary gradient, its norm at least NORM_FACTOR x C."""
    from dpaudit.models import build_model

    model_seed, data_seed = derive_seed(seed, 0), derive_seed(seed, 1)
    model = build_model(size="tiny", vocab_size=VOCAB_SIZE, bos_token_id=0, eos_token_id=0, seed=model_seed)
    model.train()
    batch, batch_with = _batches(np.random.default_rng(data_seed), rows)
    target = NORM_FACTOR * max_grad_norm
    grads = _canary_gradient(model, batch_with)
    gain = 1.0
    for _ in range(20):  # the gradient grows about linearly with the output layer norm's gain
        norm = _norm(grads)
        if norm >= target:
            break
        factor = min(1e3, 1.2 * target / max(norm, 1e-12))
        with torch.no_grad():
            model.transformer.ln_f.weight.mul_(factor)
        gain *= factor
        grads = _canary_gradient(model, batch_with)
    norm = _norm(grads)
    if not norm >= target:
        raise InputError(f"could not give the canary a gradient norm of {target:g} (NORM_FACTOR x C): "
                         f"reached {norm:.3g}; use a smaller --max-grad-norm")
    return model, batch, batch_with, grads, norm, gain


def _directions(grads: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[str]]:
    """Unit directions (rows) over the flattened parameters: -g/||g||, then -g_k/||g_k|| per tensor."""
    names = list(grads)
    flat = torch.cat([grads[n].reshape(-1) for n in names])
    rows, labels = [-flat / flat.norm()], ["all parameters"]
    offset = 0
    for n in names:
        size = grads[n].numel()
        part = flat[offset:offset + size]
        if float(part.norm()) > 0:
            row = torch.zeros_like(flat)
            row[offset:offset + size] = -part / part.norm()
            rows.append(row)
            labels.append(n)
        offset += size
    return torch.stack(rows), labels


def _flat(model, names: list[str]) -> torch.Tensor:
    params = dict(model.named_parameters())
    missing = [n for n in names if n not in params]
    if missing:
        raise InputError(f"the step changed the model's parameters (missing after the step: {', '.join(missing[:3])})")
    return torch.cat([params[n].detach().reshape(-1).float() for n in names])


# --------------------------------------------------------------------------- the audit


def validate_step(*, step: str | Callable[..., None], noise_multiplier: float, max_grad_norm: float,
                  expected_batch_size: int, repetitions: int = DEFAULT_REPETITIONS, delta: float = DEFAULT_DELTA,
                  sample_rate: float | None = None, steps: int | None = None, accountant: str | None = None,
                  significance: float = SIGNIFICANCE, seed: int = 0, out: str | Path | None = None,
                  model: str | None = None) -> dict[str, Any]:
    """White-box audit of one DP-SGD step against the claim (S, C, B) (see the module docstring).

    Returns a dict with :data:`JSON_KEYS` and the details (reason, exit_code, ceiling, the
    Gaussian estimate, the canary's norm, and under ``run`` the epsilon the measured noise
    implies over q and T when they are given or found in ``out``'s DP event; ``accountant``
    defaults to that event's, else "pld"). With ``out``
    the result is written to ``out/step_audit.json`` and the projections to
    ``out/step_audit.npz``; in a run directory ``dpaudit report`` shows it.
    """
    from dpaudit.audit.bounds import gdp_epsilon
    from dpaudit.audit.two_sample import gaussian_mu_estimate, two_sample_mu_bound

    sigma, c, b, r = _check_claim(noise_multiplier, max_grad_norm, expected_batch_size, repetitions, delta)
    run = _run_parameters(sample_rate=sample_rate, steps=steps, out=out, model=model)
    fn = _load_step(step) if isinstance(step, str) else step
    if not callable(fn):
        raise InputError(f"step must be MODULE:FUNCTION or a callable, got {step!r}")
    name = step if isinstance(step, str) else f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"

    rows = max(1, min(b - 1, MAX_BATCH_ROWS))
    model0, batch, batch_with, grads, canary_norm, gain = _build(seed, rows, c)
    directions, labels = _directions(grads)
    claim = dict(noise_multiplier=sigma, max_grad_norm=c, expected_batch_size=b)
    projections, moved = _projections(fn, name, model0, batch, batch_with, directions, list(grads), repetitions=r,
                                      seed=seed, claim=claim)
    bound = two_sample_mu_bound(in_samples=projections["in"], out_samples=projections["out"],
                                significance=significance, seed=seed)
    estimate, est_low, est_high = gaussian_mu_estimate(in_samples=projections["in"][:, 0],
                                                       out_samples=projections["out"][:, 0],
                                                       confidence=1.0 - significance)
    claimed_mu = 1.0 / sigma
    claimed_eps = gdp_epsilon(mu=claimed_mu, delta=delta)
    eps_lb = gdp_epsilon(mu=bound.mu, delta=delta)
    verdict, reason = _decide(bound, claimed_mu=claimed_mu, moved=moved, repetitions=r, significance=significance,
                              statistic=f"the projection on {labels[bound.column]}",
                              violation=(f"the step is not the Gaussian mechanism with noise multiplier {sigma:g} and "
                                         f"clipping norm {c:g} (epsilon >= {eps_lb:.3f} against {claimed_eps:.3f} at "
                                         f"delta {delta:g})"))
    result = {
        "verdict": verdict,
        "reason": reason,
        "exit_code": int(Status(verdict).exit_code),
        "step": name,
        "epsilon_lower_bound": eps_lb,
        "claimed_epsilon": claimed_eps,
        "mu_lower_bound": bound.mu,
        "claimed_mu": claimed_mu,
        "repetitions": r,
        "delta": delta,
        "significance": significance,
        "confidence": 1.0 - significance,
        "mu_ceiling": bound.ceiling,
        "epsilon_ceiling": gdp_epsilon(mu=bound.ceiling, delta=delta),
        "statistic": labels[bound.column],
        "test": bound.to_dict(),
        "estimate": {  # assumes Gaussian projections with one variance: never a verdict
            "mu": estimate, "mu_interval": [est_low, est_high],
            "noise_multiplier": 1.0 / estimate if estimate > 0 else math.inf,
            "epsilon": gdp_epsilon(mu=max(estimate, 0.0), delta=delta) if math.isfinite(estimate) else math.inf,
            "assumes": "Gaussian projections with one variance (true for a correct Gaussian step)",
        },
        "claim": claim,
        "setting": {"model": "tiny GPT-2 (dpaudit.models.build_model)", "vocab_size": VOCAB_SIZE,
                    "batch_rows": rows, "row_length": ROW_LENGTH, "canary_length": CANARY_LENGTH,
                    "canary_gradient_norm": canary_norm, "norm_factor": NORM_FACTOR, "ln_f_gain": gain,
                    "num_statistics": len(labels), "seed": seed},
        "run": None,
    }
    if run is not None:
        result["run"] = _run_epsilons(run, mu_lb=bound.mu, estimate=(estimate, est_low, est_high), sigma=sigma,
                                      delta=delta, accountant=accountant or run.pop("accountant", None) or "pld",
                                      significance=significance)
    result = jsonable(result)
    if out is not None:
        rundir = RunDir(out)
        rundir.root.mkdir(parents=True, exist_ok=True)
        write_npz_atomic(rundir.step_samples_path, in_projections=projections["in"],
                         out_projections=projections["out"], statistics=np.array(labels))
        write_json_atomic(rundir.step_audit_path, {"schema_version": SCHEMA_VERSION, **result})
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


def _projections(fn, name: str, model0, batch, batch_with, directions, names: list[str], *, repetitions: int,
                 seed: int, claim: dict) -> tuple[dict[str, np.ndarray], bool]:
    """``({"in": [R, K], "out": [R, K]}, moved)``: the step run R times on D + canary and R
    times on D, interleaved, each on a fresh copy of the model with a fresh noise generator, its
    update projected on the K directions; whether any run changed the parameters."""
    from dpaudit.progress import Progress
    from dpaudit.train.step import call_step

    r = repetitions
    theta0 = _flat(model0, names)
    noise_seeds = [int(seed_sequence([seed, 1], i).generate_state(1, np.uint64)[0] >> 1) for i in range(2 * r)]
    projections = {"in": np.empty((r, len(directions))), "out": np.empty((r, len(directions)))}
    moved, bar = False, Progress(total=2 * r, desc="step audit", unit="run")
    try:
        for i in range(r):
            for j, which in enumerate(("out", "in")):  # interleaved: a drift affects both samples alike
                m = copy.deepcopy(model0)
                generator = torch.Generator().manual_seed(noise_seeds[2 * i + j])
                try:
                    call_step(fn, m, batch_with if which == "in" else batch, generator=generator, **claim)
                except InputError:
                    raise
                except Exception as err:  # noqa: BLE001 -- the user's code: one clear line, not a traceback
                    raise InputError(f"the step {name} failed: {type(err).__name__}: {err}") from None
                update = _flat(m, names) - theta0
                if not bool(torch.isfinite(update).all()):
                    raise InputError(f"the step {name} produced a non-finite update")
                moved = moved or bool(update.abs().max() > 0)
                projections[which][i] = (directions @ update).numpy()
                bar.update(1)
    finally:
        bar.close()
    return projections, moved


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

