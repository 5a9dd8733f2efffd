"""A snapshot of a run directory's artifacts: what the report is built from.

The report stage (:mod:`dpaudit.stages.report`) reads every artifact once, through its codec,
into these frozen objects; the report is then a pure function of them
(:func:`dpaudit.report.data.assemble`). An artifact that exists but cannot be read is an
:class:`Unreadable` holding why, so that the report can say so and go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Unreadable:
    """An artifact that exists and could not be read; ``message`` says why."""

    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ModelSnapshot:
    """One model's artifacts (``models/NAME/``). ``record`` is its
    :class:`~dpaudit.accounting.DpRecord` (None: its trainer wrote none); ``results`` maps an
    attack to ``{"params", "splits", "arrays"}``; ``step_weights`` the share of each step in
    its final model under the toolkit's own loop (:func:`dpaudit.train.plan.step_weights`;
    None for a plug-in trainer, whose update rule is unknown);
    ``ladder`` its threat-model ladder, a list of :class:`~dpaudit.audit.ladder.Rung` (None:
    the ladder was not run for it); ``record_nll`` and ``unit_clipping`` feed its groups
    (:mod:`dpaudit.report.groups`)."""

    name: str
    exists: bool = True
    error: dict | Unreadable | None = None
    record: Any = None
    log: list | Unreadable = field(default_factory=list)
    checks: dict | Unreadable | None = None
    results: dict | Unreadable = field(default_factory=dict)
    extraction: dict | Unreadable | None = None
    multi_run: dict | Unreadable | None = None
    step_weights: tuple[float, ...] | None = None
    ladder: list | Unreadable | None = None
    # per candidate record (the attacks' order): (negative log-likelihood summed over its
    # scored tokens, the number of those tokens) under the model; None: not scored yet
    record_nll: tuple | Unreadable | None = None
    # who was clipped in its DP run (:class:`~dpaudit.audit.groups.UnitClipping`); None: unknown
    unit_clipping: Any = None


@dataclass(frozen=True)
class RunSnapshot:
    """A run's (or an ``audit-model`` output's) artifacts. ``kind`` is ``"run"`` or
    ``"audit-model"``; ``names`` the models reported, ``extra`` the model directories the config
    does not name; ``fleet_keep`` the reference fleet's inclusion matrix."""

    name: str
    kind: str
    names: tuple[str, ...]
    models: tuple[ModelSnapshot, ...]
    extra: tuple[str, ...] = ()
    config: dict | None = None
    trainable: str = "all"
    canaries: dict | Unreadable | None = None
    fleet_keep: Any = None
    manifest: dict | Unreadable | None = None
    audit_inputs: dict | None = None
    step_audit: dict | Unreadable | None = None
    # the candidate records in the attacks' order, each {"unit_id", "role", "group"} (no text);
    # None: a corpus without groups
    records: tuple | None = None
    # the base model's (the fine-tunes' start) per-record NLL and tokens, when the attack stage
    # scored it (signals/base.npz); None otherwise
    base_nll: tuple | Unreadable | None = None
