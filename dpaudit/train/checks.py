"""Sampler and training checks, written to ``train_checks.json`` in the run directory.

- Realised batch sizes against the Binomial(N, q) law that Poisson sampling (and the
  accountant) assumes: the sample mean and the sample variance, each as a z-score with a
  two-sided normal p-value. A fixed-size shuffled sampler passes the mean test but fails
  the variance test (its variance is 0), which is how a run that was accounted as Poisson
  but sampled otherwise is caught. Asymptotics: for T i.i.d. draws with variance s^2 and
  fourth central moment m4, the sample mean has variance s^2 / T and the sample variance
  has variance about (m4 - s^4 (T - 3) / (T - 1)) / T. For Binomial(N, q),
  s^2 = Nq(1-q) and m4 = Nq(1-q) (1 + 3 (N - 2) q (1 - q)).
- Every trainable parameter moved between the start and the end of training.
- No NaN or Inf reached an update (or a per-unit gradient norm, or a loss).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import torch

SCHEMA_VERSION = 1
P_VALUE_THRESHOLD = 1e-3  # per test; the checks are a smoke alarm, not a proof


def _two_sided_p(z: float) -> float:
    if not math.isfinite(z):
        return 0.0
    return math.erfc(abs(z) / math.sqrt(2.0))


def batch_size_check(sizes: Iterable[int], *, num_units: int, sample_rate: float | None) -> dict:
    """Compare realised batch sizes with Binomial(num_units, sample_rate). With
    ``sample_rate=None`` (no sampling claim, e.g. non-private training) only the summary
    statistics are returned."""
    sizes = np.asarray(list(sizes), dtype=np.float64)
    steps = len(sizes)
    out: dict = {
        "steps": steps,
        "mean": float(sizes.mean()) if steps else None,
        "variance": float(sizes.var(ddof=1)) if steps > 1 else None,
        "min": int(sizes.min()) if steps else None,
        "max": int(sizes.max()) if steps else None,
        "empty_batches": int((sizes == 0).sum()),
    }
    if sample_rate is None or steps < 2:
        out["reference"] = None
        out["consistent"] = None
        return out
    n, q = num_units, sample_rate
    mean = n * q
    var = n * q * (1 - q)
    m4 = var * (1 + 3 * (n - 2) * q * (1 - q))
    out["reference"] = f"Binomial(N={n}, q={q:.6g})"
    out["expected_mean"] = mean
    out["expected_variance"] = var
    if var == 0:  # q == 1: every batch must be all units
        exact = bool(np.all(sizes == n))
        out.update(mean_z=0.0 if exact else math.inf, variance_z=0.0 if exact else math.inf)
    else:
        out["mean_z"] = (out["mean"] - mean) / math.sqrt(var / steps)
        var_of_var = (m4 - var**2 * (steps - 3) / (steps - 1)) / steps
        out["variance_z"] = (out["variance"] - var) / math.sqrt(max(var_of_var, 1e-300))
    out["mean_p_value"] = _two_sided_p(out["mean_z"])
    out["variance_p_value"] = _two_sided_p(out["variance_z"])
    out["p_value_threshold"] = P_VALUE_THRESHOLD
    out["consistent"] = bool(out["mean_p_value"] >= P_VALUE_THRESHOLD and out["variance_p_value"] >= P_VALUE_THRESHOLD)
    for key in ("mean_z", "variance_z"):
        if not math.isfinite(out[key]):
            out[key] = None  # JSON has no infinity
    return out


def snapshot(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CPU copy of the trainable parameters, to tell later which ones moved."""
    return {name: p.detach().to("cpu", copy=True) for name, p in params.items()}


def parameters_moved(before: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> dict:
    not_moved = [name for name, p in params.items() if torch.equal(before[name], p.detach().cpu())]
    return {"num_trainable": len(params), "not_moved": not_moved, "all_moved": not not_moved}


def summarize(*, batch_sizes: dict, moved: dict, nonfinite: dict, sampler: str) -> dict:
    """The content of ``train_checks.json``; ``ok`` is false when any check failed."""
    ok = bool(moved["all_moved"]) and not any(nonfinite.values()) and batch_sizes.get("consistent") is not False
    return {
        "schema_version": SCHEMA_VERSION,
        "sampler": sampler,
        "batch_size": batch_sizes,
        "parameters": moved,
        "non_finite": nonfinite,
        "ok": ok,
    }
