"""The DP record of a training run: one frozen fact, built once by the trainer.

As ``dp_accounting``'s immutable events say what happened and its accountants say what it
costs, a :class:`DpRecord` holds what a training run claims: its DP event (or a non-private
one), the protected unit, delta, the accountant and the DP-SGD parameters it ran with. It
answers :meth:`~DpRecord.epsilon` (recomputed from the event, never the logged number),
:meth:`~DpRecord.group_epsilon` and :attr:`~DpRecord.dpsgd_parameters`.

Its one codec is :meth:`DpRecord.to_dict` / :meth:`DpRecord.from_dict`: the content of a
model's ``dp_event.json``::

    {"schema_version", "trainer", "noise", ["warning"], "event", "accountant", "delta",
     "epsilon", "unit", "num_units", "sample_rate", "steps", "noise_multiplier",
     "max_grad_norm", "expected_batch_size", "target_epsilon", "sampler"}

``event`` is :func:`~dpaudit.accounting.events.event_to_dict` of the event; ``epsilon`` is the
epsilon the trainer logged (null for a non-private run: infinity), kept for comparison only;
``noise`` is ``"secure"``, ``"reproducible"`` or null, and a reproducible record carries a
``warning``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_accounting

from dpaudit.accounting.epsilon import epsilon_from_event
from dpaudit.accounting.events import event_from_dict, event_to_dict, make_event
from dpaudit.accounting.mixtures import group_epsilon
from dpaudit.errors import InputError

SCHEMA_VERSION = 1
FILE = "dp_event.json"


@dataclass(frozen=True)
class DpRecord:
    """What a training run claims (see the module docstring). Build it with
    :meth:`nonprivate` or :meth:`dpsgd`, or read it with :meth:`from_dict`."""

    trainer: str | None
    event: dp_accounting.DpEvent
    unit: str = "example"
    num_units: int | None = None
    steps: int | None = None
    expected_batch_size: int | None = None
    sampler: str | None = None
    noise: str | None = None
    accountant: str | None = None
    delta: float | None = None
    sample_rate: float | None = None
    noise_multiplier: float | None = None
    max_grad_norm: float | None = None
    target_epsilon: float | None = None
    logged_epsilon: float | None = None
    warning: str | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def nonprivate(cls, *, trainer: str, num_units: int, steps: int, expected_batch_size: int,
                   sampler: str, noise: str | None = None, warning: str | None = None) -> DpRecord:
        """A run without DP: its event is ``NonPrivateDpEvent`` (epsilon infinity)."""
        return cls(trainer=trainer, event=dp_accounting.NonPrivateDpEvent(), num_units=num_units, steps=steps,
                   expected_batch_size=expected_batch_size, sampler=sampler, noise=noise, warning=warning)

    @classmethod
    def dpsgd(cls, *, trainer: str, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
              max_grad_norm: float, unit: str, num_units: int, expected_batch_size: int, accountant: str = "pld",
              target_epsilon: float | None = None, noise: str | None = None,
              warning: str | None = None) -> DpRecord:
        """``steps`` steps of Poisson-sampled DP-SGD (Abadi et al. 2016, arXiv 1607.00133):
        the event of :func:`~dpaudit.accounting.events.make_event`, its epsilon logged."""
        event = make_event(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
        return cls(trainer=trainer, event=event, unit=unit, num_units=num_units, steps=steps,
                   expected_batch_size=expected_batch_size, sampler="poisson", noise=noise, accountant=accountant,
                   delta=delta, sample_rate=sample_rate, noise_multiplier=noise_multiplier,
                   max_grad_norm=max_grad_norm, target_epsilon=target_epsilon,
                   logged_epsilon=epsilon_from_event(event, delta=delta, method=accountant), warning=warning)

    def replace(self, **changes: Any) -> DpRecord:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ answers
    @property
    def private(self) -> bool:
        return not isinstance(self.event, dp_accounting.NonPrivateDpEvent)

    def epsilon(self, delta: float | None = None, *, method: str | None = None) -> float:
        """The accountant's epsilon at ``delta`` (the record's own unless given), recomputed
        from the event with the record's accountant (or ``method``); ``inf`` without DP."""
        if not self.private:
            return math.inf
        delta = self.delta if delta is None else delta
        if delta is None:
            raise InputError("the DP event record has no delta; pass one")
        return epsilon_from_event(self.event, delta=delta, method=method or self.accountant or "pld")

    @property
    def dpsgd_parameters(self) -> dict[str, Any] | None:
        """``{noise_multiplier, sample_rate, steps}`` when the record is exactly Poisson-sampled
        DP-SGD (its event is :func:`make_event` of those three), else None: the family whose
        trade-off curve the claimed-curve test checks."""
        try:
            params = {"noise_multiplier": float(self.noise_multiplier), "sample_rate": float(self.sample_rate),
                      "steps": int(self.steps)}
            same = event_to_dict(make_event(**params)) == event_to_dict(self.event)
        except (TypeError, ValueError, InputError):
            return None
        return params if same else None

    def group_epsilon(self, group_size: int, delta: float | None = None) -> float:
        """The epsilon of a group of ``group_size`` units (:func:`group_epsilon`) at ``delta``
        (the record's own unless given); needs a plain DP-SGD event."""
        params = self.dpsgd_parameters
        if params is None:
            raise InputError("a group's epsilon needs a plain DP-SGD event")
        delta = self.delta if delta is None else delta
        return group_epsilon(**params, delta=delta, group_size=group_size)

    # ------------------------------------------------------------------ codec
    def to_dict(self) -> dict[str, Any]:
        """The content of ``dp_event.json`` (the module docstring)."""
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "trainer": self.trainer, "noise": self.noise}
        if self.warning is not None:
            out["warning"] = self.warning
        out.update(event=event_to_dict(self.event), accountant=self.accountant, delta=self.delta,
                   epsilon=self.logged_epsilon, unit=self.unit, num_units=self.num_units,
                   sample_rate=self.sample_rate, steps=self.steps, noise_multiplier=self.noise_multiplier,
                   max_grad_norm=self.max_grad_norm, expected_batch_size=self.expected_batch_size,
                   target_epsilon=self.target_epsilon, sampler=self.sampler)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> DpRecord:
        """Inverse of :meth:`to_dict`; an :class:`InputError` names what is malformed. Fields a
        third-party trainer left out are None (a record without ``event`` is refused)."""
        if not isinstance(data, dict) or "event" not in data:
            raise InputError("not a DP event record (no 'event' key)")

        def number(key: str, kind=float):
            value = data.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(f"DP event record: {key} must be a number, got {value!r}")
            return kind(value)

        def text(key: str, default=None):
            value = data.get(key, default)
            return value if isinstance(value, str) else default

        return cls(trainer=text("trainer"), event=event_from_dict(data["event"]), unit=text("unit", "example"),
                   num_units=number("num_units", int), steps=number("steps", int),
                   expected_batch_size=number("expected_batch_size", int), sampler=text("sampler"),
                   noise=text("noise"), accountant=text("accountant"), delta=number("delta"),
                   sample_rate=number("sample_rate"), noise_multiplier=number("noise_multiplier"),
                   max_grad_norm=number("max_grad_norm"), target_epsilon=number("target_epsilon"),
                   logged_epsilon=number("epsilon"), warning=text("warning"))


def read_record(path: str | Path) -> DpRecord:
    """The :class:`DpRecord` of a ``dp_event.json`` file, or of a model directory's, for a
    reader holding a path (the stages read it through :mod:`dpaudit.stages.artifacts`)."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE
    try:
        return DpRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InputError(f"no DP event record at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, InputError) as err:
        raise InputError(f"{path}: {err}") from None


def epsilon_from_record(record: DpRecord | dict[str, Any] | str | Path, *, method: str | None = None,
                        delta: float | None = None) -> float:
    """Recompute epsilon from a DP record (a :class:`DpRecord`, its dict, a model directory or
    ``dp_event.json``), with the record's accountant and delta unless others are given;
    ``inf`` when the run was not private."""
    if isinstance(record, dict):
        record = DpRecord.from_dict(record)
    elif not isinstance(record, DpRecord):
        record = read_record(record)
    return record.epsilon(delta, method=method)


def dpsgd_parameters(record: DpRecord | dict[str, Any] | None) -> dict[str, Any] | None:
    """:attr:`DpRecord.dpsgd_parameters` of a record (or its dict); None for None."""
    if record is None:
        return None
    if isinstance(record, dict):
        try:
            record = DpRecord.from_dict(record)
        except InputError:
            return None
    return record.dpsgd_parameters
