"""Trainer plug-ins: ``MODULE:FUNCTION`` callables with the contract

    train(dataset: datasets.Dataset, tokenizer, *, seed: int) -> transformers.PreTrainedModel

The dataset has the columns ``text``, ``input_ids``, ``attention_mask`` and ``unit_id``, and
the callable trains on exactly those rows. A trainer may also take any of the keyword-only

- ``config``: the run's :class:`dpaudit.config.Config` (the model, ``train`` and ``data`` sections);
- ``record``: a :class:`dpaudit.train.TrainingRecord` to fill (the training log, the run's
  :class:`dpaudit.accounting.DpRecord`, the sampler checks), which the train stage writes
  into the model's directory: a trainer that fills ``record.dp`` gets the audits that need
  its DP-SGD parameters (the claimed-curve test, the sampler checks);
- ``eval_dataset``: the held-out records, for its own evaluation;
- ``run_dir``: the model's directory while it trains, for files of its own (a
  ``dp_event.json`` written there counts when ``record.dp`` is left empty);

each passed only to a callable whose signature names it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError

OPTIONAL_KWARGS = ("config", "record", "run_dir", "eval_dataset")


def load_callable(spec: str, *, what: str = "trainer") -> Callable[..., Any]:
    """Import ``MODULE:FUNCTION`` (from the toolkit or the user's PYTHONPATH); ``what`` names
    the plug-in in the error messages."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"a {what} is named MODULE:FUNCTION, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InputError(f"cannot import {what} module {module_name!r}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError(f"{module_name} has no callable {attr!r}")
    return fn


def load_trainer(spec: str) -> Callable[..., Any]:
    """Import a trainer ``MODULE:FUNCTION`` (:func:`load_callable`)."""
    return load_callable(spec, what="trainer")


def reruns(spec: str) -> bool:
    """Whether the toolkit can run trainer ``spec`` again, in this process or another (for a
    twin, a fleet, a model trained apart). A user's own loop (:class:`dpaudit.Audit`,
    ``reruns = False``) cannot. A trainer that does not import counts as one that reruns."""
    try:
        return bool(getattr(load_trainer(spec), "reruns", True))
    except Exception:  # noqa: BLE001 - the run that calls it reports the error
        return True


def call_trainer(
    fn: Callable[..., Any],
    dataset,
    tokenizer,
    *,
    seed: int,
    config=None,
    record=None,
    run_dir: str | Path | None = None,
    eval_dataset=None,
):
    """Call a trainer with the contract's arguments plus the optional ones it accepts."""
    extra = {"config": config, "record": record, "run_dir": run_dir, "eval_dataset": eval_dataset}
    return fn(dataset, tokenizer, seed=seed, **accepted_kwargs(fn, extra))


def accepted_kwargs(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``offered`` that ``fn``'s signature names (all of them if it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in offered.items() if takes_any or k in params}
