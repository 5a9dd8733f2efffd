"""Build ``report.json``, ``figures/`` and a self-contained ``report.html`` from a run directory.

Inputs (any stage may be missing; the report says what it had):

- ``results/<attack>.json`` and ``results/<attack>.npz``: attack metrics and raw scores,
- ``dp_event.json``: what was protected; the accountant's epsilon is *recomputed* from the
  recorded DpEvent (``dpaudit.accounting``), shown beside the logged value, and a mismatch
  is flagged,
- ``canaries.json``, ``extraction.json``, ``train_log.jsonl``, ``manifest.json``,
  ``config.resolved.yaml``.

Privacy of the report itself: member texts (a canary's ``text`` and ``prefix``, and any free
text in ``extraction.json``) appear only with ``include_texts=True``; canaries are otherwise
shown by id and synthetic secret. Every value placed in the HTML goes through jinja2 with
autoescape on. The HTML has no scripts and no external resources: figures are inline
base64 PNGs and the CSS is inline.

Artifacts are written under temporary names and renamed; ``report.json`` is written last,
so its presence means the whole report is in place.
"""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.rundir import read_json, write_text_atomic

SCHEMA_VERSION = 1
REPORT_FPRS = (0.1, 0.01, 0.001)
# DESIGN.md section 4: TPR at FPR a needs about 10 / a non-members to mean anything.
MIN_NONMEMBERS_TIMES_FPR = 10.0
MISMATCH_RTOL = 1e-6
FIGURE_STEMS = ("roc_members", "roc_canaries", "epsilon", "training")
# Online LiRA fits per-text "in" and "out" means; with fewer reference models than this on
# either side, the report warns. Measured on the demo data: with one in and one out model
# its TPR at 1% FPR was 0.002 against 0.073 for the loss attack; with 2-3 in and 13-14 out
# it was 0.085 against 0.027.
MIN_ONLINE_MODELS = 2
# String fields of canary / extraction records that are never member text.
SAFE_STRING_KEYS = frozenset({"id", "canary_id", "kind", "secret", "method", "strategy", "status", "split"})
TEXT_KEYS = ("text", "prefix")
CORRECTION_NOTE = (
    "Each lower bound was already corrected for threshold (or guess-count) selection by the "
    "audit stage that computed it (split canaries or Bonferroni over the thresholds tried), and "
    "its significance was divided by the number of attacks, so the largest bound over attacks "
    "holds at the stated confidence. Only assumption-free bounds (one-run, Clopper-Pearson) "
    "enter 'best' and the verdict; the f-DP and GDP bounds assume a Gaussian trade-off curve "
    "and are shown for information."
)
# bounds that hold for any mechanism; the others assume a Gaussian trade-off curve
ASSUMPTION_FREE = frozenset({"one_run", "clopper_pearson"})

__all__ = ["build_report", "write_json_atomic", "SCHEMA_VERSION"]


# --------------------------------------------------------------------------- persistence


def _jsonable(obj: Any) -> Any:
    """Plain JSON types; numpy scalars unwrapped; NaN and infinities become null."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON through a temporary file and ``os.replace``.

    Non-finite floats become null (the toolkit's convention: an epsilon of null is infinity).
    """
    from dpaudit.rundir import write_json_atomic as _write

    _write(path, _jsonable(obj))


# --------------------------------------------------------------------------- small helpers


def _num(x: Any) -> float | None:
    """A finite float, or None for anything else (null, NaN, a string, a bool)."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _int(x: Any) -> int | None:
    v = _num(x)
    return int(v) if v is not None else None


def _fpr_key(a: float) -> str:
    return format(a, "g")


def _rel_diff(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


# --------------------------------------------------------------------------- attack results


def _split_summary(split: Mapping[str, Any], name: str, split_name: str, warnings: list[str]) -> dict[str, Any]:
    num_in, num_out = _int(split.get("num_in")), _int(split.get("num_out"))
    raw_tpr = split.get("tpr_at_fpr") or {}
    tpr: dict[str, float | None] = {}
    parsed: dict[float, Any] = {}
    for k, v in raw_tpr.items():
        try:
            parsed[float(k)] = v
        except (TypeError, ValueError):
            warnings.append(f"{name}/{split_name}: ignored TPR at an unreadable FPR key {k!r}")
    suppressed = []
    for a in sorted(set(REPORT_FPRS) | set(parsed), reverse=True):
        v = _num(parsed.get(a))
        if v is not None and (num_out is None or num_out * a < MIN_NONMEMBERS_TIMES_FPR - 1e-9):
            # Too few non-members to estimate this FPR: never print a number (or a 0) for it.
            suppressed.append(_fpr_key(a))
            v = None
        tpr[_fpr_key(a)] = v
    ci = split.get("auc_ci")
    auc_ci = [_num(ci[0]), _num(ci[1])] if isinstance(ci, (list, tuple)) and len(ci) == 2 else None
    out = {
        "split": split_name,
        "auc": _num(split.get("auc")),
        "auc_ci": auc_ci if auc_ci and None not in auc_ci else None,
        "tpr_at_fpr": tpr,
        "balanced_accuracy": _num(split.get("balanced_accuracy")),
        "num_in": num_in,
        "num_out": num_out,
    }
    if suppressed:
        out["tpr_suppressed"] = suppressed
        warnings.append(
            f"{name}/{split_name}: TPR at FPR {', '.join(suppressed)} withheld: "
            f"{num_out} non-members is fewer than 10 / FPR"
        )
    return out


def _load_results(run_dir: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """Each attack: name, params, splits (raw dicts), and ROC arrays per split when saved."""
    results_dir = run_dir / "results"
    attacks: dict[str, dict[str, Any]] = {}
    for path in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        data = read_json(path)
        if not isinstance(data, dict) or "splits" not in data:
            warnings.append(f"skipped {path.name}: not an attack result (no 'splits')")
            continue
        if data.get("schema_version") != 1:
            raise InputError(f"{path}: unsupported schema_version {data.get('schema_version')!r} (expected 1)")
        name = str(data.get("attack") or path.stem)
        if name in attacks:
            raise InputError(f"{path}: attack {name!r} appears in two results files")
        splits = data.get("splits") or {}
        if not isinstance(splits, dict):
            raise InputError(f"{path}: 'splits' must be an object")
        arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        npz = path.with_suffix(".npz")
        if npz.is_file():
            try:
                with np.load(npz, allow_pickle=False) as z:
                    for split_name in splits:
                        s, y = f"{split_name}_scores", f"{split_name}_labels"
                        if s in z.files and y in z.files:
                            scores, labels = np.asarray(z[s], dtype=float), np.asarray(z[y]).astype(bool)
                            if scores.shape != labels.shape:
                                warnings.append(f"{npz.name}: {s} and {y} differ in shape; no ROC curve")
                            elif labels.all() or not labels.any():
                                warnings.append(f"{npz.name}: {split_name} has one class only; no ROC curve")
                            else:
                                arrays[split_name] = (scores, labels)
            except (OSError, ValueError) as e:
                warnings.append(f"cannot read {npz.name}: {e}")
        attacks[name] = {"name": name, "params": data.get("params") or {}, "splits": splits, "arrays": arrays}
    return [attacks[k] for k in sorted(attacks)]


def _strategy_name(strategy: Any) -> str | None:
    """``{"name": "bonferroni", ...}`` (as the audit package records it) or a plain name."""
    if isinstance(strategy, Mapping):
        return None if strategy.get("name") is None else str(strategy["name"])
    return None if strategy is None else str(strategy)


def _collect_bounds(results: list[dict[str, Any]], warnings: list[str]) -> list[dict[str, Any]]:
    bounds = []
    for r in results:
        for split_name, split in r["splits"].items():
            for method, b in sorted((split.get("epsilon_lower_bounds") or {}).items()):
                if not isinstance(b, Mapping):
                    continue
                eps = _num(b.get("epsilon"))
                if eps is None:
                    warnings.append(f"{r['name']}/{split_name}/{method}: epsilon bound is not a finite number; skipped")
                    continue
                extra = {k: v for k, v in b.items() if k not in ("epsilon", "delta", "significance", "strategy")}
                bounds.append(
                    {
                        "attack": r["name"],
                        "split": split_name,
                        "method": str(method),
                        "epsilon": eps,
                        "delta": _num(b.get("delta")),
                        "significance": _num(b.get("significance")),
                        "strategy": _strategy_name(b.get("strategy")),
                        "details": _jsonable(extra),
                        "accountant_epsilon": None,  # filled in by _verdict for DP runs
                        "exceeds_accountant": None,
                    }
                )
    return bounds


# --------------------------------------------------------------------------- privacy


def _walk_event(ev: Any) -> dict[str, Any]:
    """Steps, sampling scheme and rate, noise multiplier read from a serialised DpEvent tree
    (only for the simple chain self_composed -> *_sampled -> gaussian; else empty)."""
    info: dict[str, Any] = {}
    count = 1
    while isinstance(ev, Mapping):
        kind = ev.get("type")
        if kind == "self_composed":
            count *= _int(ev.get("count")) or 0
            info["steps"] = count
        elif kind in ("poisson_sampled", "sampled_with_replacement", "sampled_without_replacement"):
            info["sampling_type"] = kind
            info["sample_rate"] = _num(ev.get("sampling_probability"))
            if kind != "poisson_sampled":
                info["source_dataset_size"] = ev.get("source_dataset_size")
                info["sample_size"] = ev.get("sample_size")
        elif kind == "gaussian":
            info["noise_multiplier"] = _num(ev.get("noise_multiplier"))
        else:
            info["other"] = kind
            break
        ev = ev.get("event")
    return info


class _Accountant:
    """Recomputes epsilon from the recorded event at any delta, memoised; never raises."""

    def __init__(self, event_dict: Any, method: str | None):
        self.event_dict = event_dict
        self.method = method
        self.error: str | None = None
        self._event = None
        self._cache: dict[float, float | None] = {}
        if event_dict is None:
            self.error = "no DpEvent recorded in dp_event.json"
            return
        try:
            from dpaudit.accounting import epsilon_from_event, event_from_dict
        except ImportError as e:
            self.error = f"dpaudit.accounting unavailable: {e}"
            return
        self._epsilon_from_event = epsilon_from_event
        try:
            self._event = event_from_dict(event_dict)
        except Exception as e:  # noqa: BLE001 - a bad event must not stop the report
            self.error = f"cannot rebuild the DpEvent: {type(e).__name__}: {e}"

    @property
    def available(self) -> bool:
        return self._event is not None

    def epsilon(self, delta: float | None) -> float | None:
        if self._event is None:
            return None
        if isinstance(self.event_dict, Mapping) and self.event_dict.get("type") == "non_private":
            return math.inf  # accountants refuse a non-private event; its epsilon is infinite
        if delta is None:
            return None
        if delta not in self._cache:
            kwargs = {"delta": delta}
            if self.method:
                kwargs["method"] = self.method
            try:
                self._cache[delta] = float(self._epsilon_from_event(self._event, **kwargs))
            except Exception as e:  # noqa: BLE001
                self.error = f"accountant failed at delta={delta:g}: {type(e).__name__}: {e}"
                self._cache[delta] = None
        return self._cache[delta]


def _privacy(run_dir: Path, warnings: list[str]) -> tuple[dict[str, Any] | None, _Accountant | None]:
    path = run_dir / "dp_event.json"
    if not path.is_file():
        return None, None
    d = read_json(path)
    if not isinstance(d, dict):
        raise InputError(f"{path}: expected a JSON object")
    delta = _num(d.get("delta"))
    method = d.get("accountant")
    noise = _num(d.get("noise_multiplier"))
    q = _num(d.get("sample_rate"))
    steps = _int(d.get("steps"))
    # null means infinity for the logged epsilon (non-private runs)
    logged = d.get("epsilon")
    if logged is None or (isinstance(logged, float) and logged == math.inf):
        logged = math.inf
    else:
        logged = _num(logged)

    acct = _Accountant(d.get("event"), method)
    recomputed = acct.epsilon(delta) if acct.available else None
    if acct.available and recomputed is None and delta is None:
        acct.error = "no delta recorded in dp_event.json"
    status = "recomputed" if recomputed is not None else f"not recomputed: {acct.error}"

    if recomputed is not None:
        epsilon, source = recomputed, "recomputed"
    else:
        epsilon, source = logged, "logged"
        warnings.append(f"accountant epsilon not recomputed ({acct.error}); the logged value is shown unverified")
    mismatch = None
    if recomputed is not None and logged is not None:
        if math.isinf(recomputed) or math.isinf(logged):
            mismatch = recomputed != logged
        else:
            mismatch = _rel_diff(recomputed, logged) > MISMATCH_RTOL
        if mismatch:
            warnings.append(
                f"logged epsilon {_fmt_eps(logged)} differs from the epsilon recomputed from the recorded "
                f"event {_fmt_eps(recomputed)}; the recomputed value is used"
            )

    ev = _walk_event(d.get("event"))
    for key, top in (("steps", steps), ("sample_rate", q), ("noise_multiplier", noise)):
        if key in ev and ev[key] is not None and top is not None and _rel_diff(float(ev[key]), float(top)) > 1e-9:
            warnings.append(f"dp_event.json: {key} is {top:g} but the recorded event says {ev[key]:g}")
    sampling_type = ev.get("sampling_type")
    rate = ev.get("sample_rate", q)
    if sampling_type == "poisson_sampled":
        sampling = f"Poisson with rate q = {rate:.6g}"
    elif sampling_type:
        sampling = f"{sampling_type.replace('_', ' ')} (rate {rate:.6g})" if rate is not None else sampling_type
    elif d.get("event") is None and q is not None:
        sampling = f"rate q = {q:.6g} (scheme not recorded: no event)"
    else:
        sampling = "not recorded"

    private = epsilon is not None and math.isfinite(epsilon)
    if not private and noise is not None and noise > 0 and recomputed is None:
        private = None  # noise was added, but no epsilon is known: unknown
    epochs = q * steps if q is not None and steps is not None else None
    info = {
        "private": private,
        "unit": d.get("unit"),
        "num_units": _int(d.get("num_units")),
        "sampling": sampling,
        "sampling_type": sampling_type,
        "sample_rate": q,
        "steps": steps,
        "epochs": epochs,
        "noise_multiplier": noise,
        "max_grad_norm": _num(d.get("max_grad_norm")),
        "expected_batch_size": _num(d.get("expected_batch_size")),
        "delta": delta,
        "accountant": method,
        "epsilon": epsilon,
        "epsilon_source": source,
        "epsilon_recomputed": recomputed,
        "epsilon_logged": logged,
        "epsilon_mismatch": mismatch,
        "recompute_status": status,
        "event": d.get("event"),
    }
    return info, acct


def _fmt_eps(x: float | None) -> str:
    if x is None:
        return "unknown"
    return "infinity" if math.isinf(x) else f"{x:.6g}"


def _verdict(
    privacy: dict[str, Any] | None, acct: _Accountant | None, bounds: list[dict[str, Any]], warnings: list[str]
) -> tuple[str | None, str]:
    """Compare each bound with the accountant's epsilon at the bound's own delta."""
    if privacy is None:
        return None, "no dp_event.json: a non-private run (accountant epsilon is infinite)"
    if privacy["private"] is False:
        return None, "non-private run: the accountant's epsilon is infinite, nothing to violate"
    run_eps, run_delta = privacy["epsilon"], privacy["delta"]
    if run_eps is None or not math.isfinite(run_eps):
        return None, "the accountant's epsilon could not be determined"
    for b in bounds:
        b_delta = b["delta"] if b["delta"] is not None else run_delta
        eps = None
        if acct is not None and acct.available and b_delta is not None:
            eps = run_eps if b_delta == run_delta and privacy["epsilon_source"] == "recomputed" else acct.epsilon(b_delta)
        if eps is None:
            eps = run_eps
            if b_delta is not None and run_delta is not None and b_delta < run_delta:
                warnings.append(
                    f"{b['attack']}/{b['method']}: bound at delta={b_delta:g} compared with the accountant at "
                    f"delta={run_delta:g} (could not recompute at the bound's delta)"
                )
        b["accountant_epsilon"] = eps
        b["exceeds_accountant"] = b["epsilon"] > eps
    sound = [b for b in bounds if b["method"] in ASSUMPTION_FREE]
    if not sound:
        return None, "no assumption-free empirical epsilon lower bounds were computed, so there is nothing to compare"
    bad = [b for b in sound if b["exceeds_accountant"]]
    if bad:
        worst = max(bad, key=lambda b: b["epsilon"] - b["accountant_epsilon"])
        return "violated", (
            f"{len(bad)} of {len(sound)} assumption-free empirical lower bounds exceed the accountant's epsilon "
            f"(worst: {worst['attack']}/{worst['method']} gives {worst['epsilon']:.3f} > {worst['accountant_epsilon']:.3f})"
        )
    return "consistent", f"all {len(sound)} assumption-free empirical lower bounds are at or below the accountant's epsilon"


def _empirical(bounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"best": None, "bounds": bounds, "note": CORRECTION_NOTE, "joint_confidence": None}
    sound = [b for b in bounds if b["method"] in ASSUMPTION_FREE]
    if not sound:
        return out
    best = max(sound, key=lambda b: b["epsilon"])
    out["best"] = {k: best[k] for k in ("attack", "method", "epsilon", "delta", "significance", "strategy", "split")}
    sigs = [b["significance"] for b in sound]
    if all(s is not None and 0 < s <= 0.5 for s in sigs):
        # All bounds hold together with this probability (union bound over the significances).
        out["joint_confidence"] = max(0.0, 1.0 - sum(sigs))
    return out


# --------------------------------------------------------------------------- canaries, extraction, training


def _records_from(data: Any) -> tuple[list[tuple[str | None, dict[str, Any]]], dict[str, Any]]:
    """Rows (id, record) and top-level scalars from an extraction file of unknown shape."""
    summary: dict[str, Any] = {}
    if isinstance(data, list):
        return [(None, r) for r in data if isinstance(r, Mapping)], summary
    if not isinstance(data, Mapping):
        return [], summary
    body = {k: v for k, v in data.items() if k != "schema_version"}
    if body and all(isinstance(v, Mapping) for v in body.values()):
        return [(str(k), dict(v)) for k, v in body.items()], summary
    rows: list[tuple[str | None, dict[str, Any]]] = []
    for k, v in body.items():
        if isinstance(v, list) and v and all(isinstance(r, Mapping) for r in v):
            rows += [(None, dict(r)) for r in v]
        elif isinstance(v, Mapping) and v and all(isinstance(r, Mapping) for r in v.values()):
            rows += [(str(i), dict(r)) for i, r in v.items()]
        elif not isinstance(v, (list, Mapping)):
            summary[k] = v
    return rows, summary


def _fleet(run_dir: Path, attack_names: set[str], warnings: list[str]) -> dict[str, Any] | None:
    """The reference models of a run, and how many of them had each text in (out of) their
    training set; a warning when online LiRA had too few of either to fit its in/out means."""
    from dpaudit.fleet import KEEP_FILE, load_fleet

    if not (run_dir / "fleet" / KEEP_FILE).is_file():
        return None
    try:
        keep, _ = load_fleet(run_dir / "fleet")
    except InputError as e:
        warnings.append(str(e))
        return None
    n_in = keep.sum(axis=0)
    summary = {
        "num_models": int(keep.shape[0]),
        "in_per_text_min": int(n_in.min()),
        "out_per_text_min": int((keep.shape[0] - n_in).min()),
    }
    fewest = min(summary["in_per_text_min"], summary["out_per_text_min"])
    if "lira_online" in attack_names and fewest < MIN_ONLINE_MODELS:
        warnings.append(
            f"lira_online: some texts have only {fewest} reference model on one side (in or out of "
            f"its training set); the online attack's per-text means are then single noisy values and "
            f"its TPR at low FPR is poor: train more reference models (fleet.num_models); rmia and "
            f"lira_offline need fewer"
        )
    return summary


def _extraction(run_dir: Path, include_texts: bool, warnings: list[str]) -> dict[str, Any] | None:
    path = run_dir / "extraction.json"
    if not path.is_file():
        return None
    rows_in, summary = _records_from(read_json(path))
    columns: list[str] = []
    hidden: set[str] = set()
    rows = []
    for rid, rec in rows_in:
        rid = rid if rid is not None else str(rec.get("id", rec.get("canary_id", "")))
        row = {"id": rid}
        for k, v in rec.items():
            if k in ("id", "canary_id"):
                continue
            if isinstance(v, (Mapping, list)):
                hidden.add(k)
                continue
            if isinstance(v, str) and not include_texts and k not in SAFE_STRING_KEYS:
                hidden.add(k)
                continue
            row[k] = v
            if k not in columns:
                columns.append(k)
        rows.append(row)
    summary = {
        k: v for k, v in summary.items() if not (isinstance(v, str) and not include_texts and k not in SAFE_STRING_KEYS)
    }
    return {
        "columns": columns,
        "rows": _jsonable(rows),
        "summary": _jsonable(summary),
        "hidden_columns": sorted(hidden - set(columns)),
    }


def _canaries(run_dir: Path, include_texts: bool, extraction: dict[str, Any] | None) -> dict[str, Any] | None:
    path = run_dir / "canaries.json"
    if not path.is_file():
        return None
    data = read_json(path)
    items = data.get("canaries", []) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise InputError(f"{path}: expected a list of canaries")
    by_id = {r["id"]: r for r in (extraction or {}).get("rows", [])}
    rows = []
    for c in items:
        if not isinstance(c, Mapping):
            continue
        cid = str(c.get("id"))
        row: dict[str, Any] = {
            "id": cid,
            "kind": c.get("kind"),
            "secret": c.get("secret"),
            "included": c.get("included"),
            "repetitions": _int(c.get("repetitions")),
        }
        ext = by_id.get(cid, {})
        for k in ("exposure", "extracted"):
            if k in ext:
                row[k] = ext[k]
        if include_texts:
            for k in TEXT_KEYS:
                row[k] = c.get(k)
        rows.append(row)
    included = [r for r in rows if r["included"] is True]
    return {
        "count": len(rows),
        "num_included": len(included),
        "texts_included": include_texts,
        "has_exposure": any("exposure" in r for r in rows),
        "has_extracted": any("extracted" in r for r in rows),
        "rows": _jsonable(rows),
    }


def _training(run_dir: Path, warnings: list[str]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    path = run_dir / "train_log.jsonl"
    if not path.is_file():
        return None, []
    records, bad = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(r, dict):
            records.append(r)
    if bad:
        warnings.append(f"train_log.jsonl: skipped {bad} unreadable line(s)")

    def last(key: str) -> float | None:
        for r in reversed(records):
            v = _num(r.get(key))
            if v is not None:
                return v
        return None

    ppl = [v for v in (_num(r.get("heldout_perplexity")) for r in records) if v is not None]
    summary = {
        "records": len(records),
        "last_step": _int(last("step")),
        "final_train_loss": last("train_loss"),
        "final_heldout_loss": last("heldout_loss"),
        "final_heldout_perplexity": last("heldout_perplexity"),
        "best_heldout_perplexity": min(ppl) if ppl else None,
    }
    return summary, records


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(d, Mapping):
        out = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(d, list) and not all(isinstance(v, (str, int, float, bool)) or v is None for v in d):
        return [(prefix, json.dumps(_jsonable(d)))]
    return [(prefix, d)]


# --------------------------------------------------------------------------- figures and HTML


def _figures(
    run_dir: Path,
    results: list[dict[str, Any]],
    bounds: list[dict[str, Any]],
    privacy: dict[str, Any] | None,
    train_records: list[dict[str, Any]],
    warnings: list[str],
) -> dict[str, dict[str, str]]:
    from dpaudit.report import figures as F

    fig_dir = run_dir / "figures"
    colors = F.attack_colors(r["name"] for r in results)
    made: dict[str, dict[str, str]] = {}

    def save(fig: Any, stem: str) -> None:
        paths = F.save_figure(fig, fig_dir, stem)
        made[stem] = {fmt: os.path.relpath(p, run_dir).replace(os.sep, "/") for fmt, p in paths.items()}

    for split_name, stem, title in (
        ("members", "roc_members", "Membership inference: members vs. held-out records"),
        ("canaries", "roc_canaries", "Canaries: included vs. excluded"),
    ):
        curves = {}
        for r in results:
            if split_name in r["arrays"]:
                s, y = r["arrays"][split_name]
                split = r["splits"].get(split_name, {})
                curves[r["name"]] = (s, y, _int(split.get("num_out")), _num(split.get("auc")))
        if curves:
            save(F.plot_roc(curves, colors=colors, title=title), stem)
    if bounds:
        eps = privacy["epsilon"] if privacy else None
        save(
            F.plot_epsilon(bounds, colors=colors, accountant_epsilon=eps, delta=privacy["delta"] if privacy else None),
            "epsilon",
        )
    if train_records:
        save(F.plot_training(train_records), "training")
    # Remove figures of an earlier build that this build did not redraw (their inputs are gone).
    for stem in FIGURE_STEMS:
        if stem not in made:
            for fmt in ("png", "pdf"):
                p = fig_dir / f"{stem}.{fmt}"
                if p.is_file():
                    p.unlink()
    return made


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if math.isnan(value):
            return "—"
        return format(float(value), spec)
    return str(value)


def _render_html(context: dict[str, Any]) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).with_name("templates"))),
        autoescape=True,  # every value from the run directory is escaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = _fmt
    return env.get_template("report.html").render(**context)


# --------------------------------------------------------------------------- entry point


def build_report(run_dir: str | Path, *, include_texts: bool = False, title: str | None = None) -> dict:
    """Build the report of a run (or audit-model output) directory; return the report dict.

    Writes ``figures/*.png|pdf``, ``report.html`` and, last, ``report.json`` into ``run_dir``.
    ``include_texts=True`` also prints member texts (canary texts and prefixes, free-text
    fields of ``extraction.json``); by default canaries are shown by id and secret only.
    Raises :class:`dpaudit.errors.InputError` on a missing directory, unreadable or
    unsupported inputs, or a directory with neither results nor a DP event.
    """
    import dpaudit

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"run directory not found: {run_dir}")
    warnings: list[str] = []

    results = _load_results(run_dir, warnings)
    privacy, acct = _privacy(run_dir, warnings)
    if not results and privacy is None:
        raise InputError(f"nothing to report in {run_dir}: no results/*.json and no dp_event.json")
    if not results:
        warnings.append("no attack results (results/*.json): run the attacks first")

    attacks, canary_attacks = {}, {}
    for r in results:
        splits = r["splits"]
        main = "members" if "members" in splits else (next(iter(splits)) if len(splits) == 1 else None)
        if main is None and splits:
            main = sorted(splits)[0]
        if main is not None:
            attacks[r["name"]] = {**_split_summary(splits[main], r["name"], main, warnings), "params": r["params"]}
        if "canaries" in splits:
            canary_attacks[r["name"]] = {
                **_split_summary(splits["canaries"], r["name"], "canaries", warnings),
                "epsilon_lower_bounds": splits["canaries"].get("epsilon_lower_bounds") or {},
            }

    bounds = _collect_bounds(results, warnings)
    verdict, verdict_reason = _verdict(privacy, acct, bounds, warnings)
    empirical = _empirical(bounds)
    extraction = _extraction(run_dir, include_texts, warnings)
    canaries = _canaries(run_dir, include_texts, extraction)
    training, train_records = _training(run_dir, warnings)
    fleet = _fleet(run_dir, {r["name"] for r in results}, warnings)

    manifest = read_json(run_dir / "manifest.json") if (run_dir / "manifest.json").is_file() else None
    config = None
    if (run_dir / "config.resolved.yaml").is_file():
        import yaml

        try:
            config = yaml.safe_load((run_dir / "config.resolved.yaml").read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            warnings.append(f"config.resolved.yaml unreadable: {e}")

    figures = _figures(run_dir, results, bounds, privacy, train_records, warnings)
    title = title or f"dpaudit report: {run_dir.resolve().name}"
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")

    report = _jsonable(
        {
            "schema_version": SCHEMA_VERSION,
            "dpaudit_version": dpaudit.__version__,
            "created": created,
            "title": title,
            "include_texts": include_texts,
            "privacy": privacy,
            "attacks": attacks,
            "canary_attacks": canary_attacks,
            "empirical_epsilon": empirical,
            "verdict": verdict,
            "verdict_reason": verdict_reason,
            "canaries": canaries,
            "extraction": extraction,
            "training": training,
            "fleet": fleet,
            "manifest": manifest,
            "config": config,
            "figures": figures,
            "html": "report.html",
            "warnings": list(dict.fromkeys(warnings)),
        }
    )

    images = {}
    for stem, paths in figures.items():
        images[stem] = base64.b64encode((run_dir / paths["png"]).read_bytes()).decode("ascii")
    html = _render_html(
        {
            "r": report,
            "privacy_raw": privacy,  # keeps infinities for display
            "images": images,
            "fprs": [_fpr_key(a) for a in REPORT_FPRS],
            "manifest_rows": _flatten(manifest) if manifest else [],
            "config_text": _yaml_text(config),
        }
    )
    write_text_atomic(run_dir / "report.html", html)
    write_json_atomic(run_dir / "report.json", report)
    return report


def _yaml_text(config: Any) -> str | None:
    if config is None:
        return None
    import yaml

    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
