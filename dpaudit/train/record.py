"""What a trainer reports beside the model it returns.

A trainer plug-in that accepts the keyword ``record`` is given a :class:`TrainingRecord` and
fills it as it trains; the train stage then writes it into the model's directory
(``train_log.jsonl``, ``dp_event.json``, ``train_checks.json``, ``gradient_canaries.npz``,
``unit_clipping.npz``).
The toolkit's own trainers fill every field; a third-party trainer may fill what it knows
(its :class:`~dpaudit.accounting.DpRecord` above all) and leave the rest empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpaudit.accounting import DpRecord
from dpaudit.audit.gradient_canaries import GradientCanaryRecord
from dpaudit.audit.groups import UnitClipping


@dataclass
class TrainingRecord:
    """The training log (one dict per evaluation or step, step 0 before any update), the DP
    record, the sampler and update checks (:mod:`dpaudit.train.checks`), the white-box
    gradient canaries of a run that had them (:mod:`dpaudit.train.gradient_canaries`), and
    ``checkpoint``, which the trainer calls as ``checkpoint(step, model, tokenizer)`` every
    ``train.checkpoint_every`` steps when the caller gave one."""

    log: list[dict[str, Any]] = field(default_factory=list)
    dp: DpRecord | None = None
    checks: dict[str, Any] | None = None
    checkpoint: Callable[[int, Any, Any], None] | None = None
    gradient_canaries: GradientCanaryRecord | None = None
    # per protected unit: sampled, clipped, pre-clipping norms (DP engines; None: unknown)
    unit_clipping: UnitClipping | None = None
