"""DP events (``dp_accounting``'s immutable objects that say what happened) and their JSON form,
with the checks of their parameters that every accounting function shares."""

from __future__ import annotations

import math
import re
from typing import Any

import attr
import dp_accounting

from dpaudit.errors import InputError

METHODS = ("pld", "rdp")


def check_method(method: str) -> str:
    if method not in METHODS:
        raise InputError(f"unknown accountant {method!r}: expected one of {', '.join(METHODS)}")
    return method


def check_sample_rate(sample_rate: float) -> float:
    if not isinstance(sample_rate, (int, float)) or isinstance(sample_rate, bool) or not 0 < sample_rate <= 1:
        raise InputError(f"sampling rate q must be in (0, 1], got {sample_rate!r}")
    return float(sample_rate)


def check_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"number of steps must be a positive integer, got {steps!r}")
    return steps


def check_delta_range(delta: float) -> float:
    if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not 0 < delta < 1:
        raise InputError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_noise(noise_multiplier: float) -> float:
    if (
        not isinstance(noise_multiplier, (int, float))
        or isinstance(noise_multiplier, bool)
        or not math.isfinite(noise_multiplier)
        or noise_multiplier <= 0
    ):
        raise InputError(f"noise multiplier sigma must be > 0 with DP on, got {noise_multiplier!r}")
    return float(noise_multiplier)



# --------------------------------------------------------------------------- events


def make_event(*, noise_multiplier: float, sample_rate: float, steps: int) -> dp_accounting.DpEvent:
    """``T`` steps of the Poisson-subsampled Gaussian mechanism (Abadi et al. 2016)."""
    sigma = check_noise(noise_multiplier)
    q = check_sample_rate(sample_rate)
    steps = check_steps(steps)
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SelfComposedDpEvent(step, steps)


def _snake(name: str) -> str:
    name = name.removesuffix("DpEvent")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _event_classes() -> dict[str, type]:
    classes: dict[str, type] = {}
    todo = [dp_accounting.DpEvent]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if attr.has(sub):
                classes[_snake(sub.__name__)] = sub
    return classes


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """A ``DpEvent`` as a plain JSON-able dict: ``{"type": <snake_case class name without
    DpEvent>, <its fields>...}`` with nested events as nested dicts, for example
    ``{"type": "self_composed", "count": T, "event": {"type": "poisson_sampled",
    "sampling_probability": q, "event": {"type": "gaussian", "noise_multiplier": s}}}``."""
    if not isinstance(event, dp_accounting.DpEvent) or not attr.has(type(event)):
        raise TypeError(f"not a dp_accounting event: {event!r}")

    def convert(value: Any) -> Any:
        if isinstance(value, dp_accounting.DpEvent):
            return event_to_dict(value)
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        return value

    out: dict[str, Any] = {"type": _snake(type(event).__name__)}
    for field in attr.fields(type(event)):
        out[field.name] = convert(getattr(event, field.name))
    return out


def event_from_dict(data: dict[str, Any]) -> dp_accounting.DpEvent:
    """Inverse of :func:`event_to_dict`. Unknown types or fields are :class:`InputError` s."""
    classes = _event_classes()
    if not isinstance(data, dict) or "type" not in data:
        raise InputError(f"a DP event must be a mapping with a 'type' key, got {data!r}")
    cls = classes.get(data["type"])
    if cls is None:
        raise InputError(f"unknown DP event type {data['type']!r}")
    names = {f.name for f in attr.fields(cls)}
    extra = set(data) - names - {"type"}
    if extra:
        raise InputError(f"DP event {data['type']!r} has unknown fields: {', '.join(sorted(extra))}")

    def convert(value: Any) -> Any:
        if isinstance(value, dict) and "type" in value:
            return event_from_dict(value)
        if isinstance(value, list):
            return [convert(v) for v in value]
        return value

    try:
        return cls(**{k: convert(v) for k, v in data.items() if k != "type"})
    except TypeError as err:
        raise InputError(f"DP event {data['type']!r} is malformed: {err}") from None
