"""The bound registry: epsilon bounds register by name with a function decorator.

    @register_bound("one_run", family="one_run", sound=True,
                    paper="Steinke et al. 2023", arxiv="2305.08846")
    def epsilon_one_run(*, num_canaries, num_guesses, num_correct, delta, significance):
        ...

    get_bound("one_run").sound          # True (dpaudit.audit.get_bound)
    CanaryScores(...).bound("one_run", delta=1e-5)

Registry names are the ``method`` keys of every JSON output. A name can be registered
once; a second registration under the same name raises ``ValueError``.

A bound is a pure function of counts, keyword-only, of one of two families:

* ``"one_run"`` -- ``fn(*, num_canaries, num_guesses, num_correct, delta, significance)``:
  m canaries in one run, each in with probability 1/2, r guesses of which v correct.
* ``"threshold"`` -- ``fn(*, tp, fp, tn, fn, delta, significance)``: a confusion matrix at
  one threshold, each outcome from an independent run.

It returns the epsilon (a float), or ``(epsilon, extras)`` where ``extras`` is a dict of
further numbers (say ``{"mu": ...}``) that land in :attr:`BoundResult.details`. How the
counts are chosen (strategies, corrections) is the caller's business: the same machinery
serves every bound of a family.

``sound=True`` means the bound holds for *any* (epsilon, delta)-DP mechanism (with
probability at least 1 - significance). ``sound=False`` marks an estimate that relies on
an assumption about the mechanism (``assumes``, e.g. "a Gaussian trade-off curve"); such
bounds are reported as estimates and never decide a verdict.

This module imports nothing of :mod:`dpaudit.audit`: the modules that define bounds
import it. Looking bounds up (:func:`~dpaudit.audit.catalog.get_bound`,
:func:`~dpaudit.audit.catalog.available_bounds`) is :mod:`dpaudit.audit.catalog`'s job,
which loads them all first. Adding a bound: write ``dpaudit/audit/bound_<name>.py`` with
one decorated function (and a test); nothing else changes.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["BoundSpec", "FAMILIES", "register_bound", "registered"]

#: family -> the keyword arguments its functions take.
FAMILIES: dict[str, tuple[str, ...]] = {
    "one_run": ("num_canaries", "num_guesses", "num_correct", "delta", "significance"),
    "threshold": ("tp", "fp", "tn", "fn", "delta", "significance"),
}

_REGISTRY: dict[str, BoundSpec] = {}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class BoundSpec:
    """A registered bound: its name, family, soundness, citation and function."""

    name: str
    family: str
    sound: bool
    paper: str
    arxiv: str | None
    fn: Callable[..., Any] = field(repr=False, compare=False)
    assumes: str | None = None

    def evaluate(self, **counts) -> tuple[float, dict]:
        """``(epsilon, extras)`` for the family's keyword arguments (see the module docstring)."""
        out = self.fn(**counts)
        if isinstance(out, tuple):
            eps, extras = out
            return float(eps), dict(extras)
        return float(out), {}

    def describe(self) -> str:
        """"Steinke et al. 2023, arXiv:2305.08846" (the citation, one line)."""
        return self.paper + (f", arXiv:{self.arxiv}" if self.arxiv else "")

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "sound": self.sound,
            "paper": self.paper,
            "arxiv": self.arxiv,
            "assumes": self.assumes,
        }


def register_bound(
    name: str,
    *,
    family: str,
    sound: bool,
    paper: str,
    arxiv: str | None,
    assumes: str | None = None,
):
    """Function decorator: register an epsilon bound under ``name`` (returns ``fn`` unchanged).

    ``family`` is ``"one_run"`` or ``"threshold"`` (the keyword arguments the function
    takes, see the module docstring); ``sound`` says whether it holds for every
    (epsilon, delta)-DP mechanism; ``paper`` ("Author et al. YEAR") and ``arxiv`` (the
    identifier, or None) cite it; ``assumes`` names what a non-sound bound assumes.

    Refuses a name already taken or not lower_snake_case, an unknown family, a non-bool
    ``sound``, an empty ``paper`` (``ValueError``), and a function that does not take the
    family's keyword arguments (``TypeError``).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"bound name {name!r} must be lower_snake_case")
    if family not in FAMILIES:
        raise ValueError(f"bound {name!r}: family must be one of {sorted(FAMILIES)}, got {family!r}")
    if not isinstance(sound, bool):
        raise ValueError(f"bound {name!r}: sound must be True or False, got {sound!r}")
    if not isinstance(paper, str) or not paper.strip():
        raise ValueError(f"bound {name!r}: paper must name the paper, e.g. 'Steinke et al. 2023'")
    if arxiv is not None and (not isinstance(arxiv, str) or not arxiv.strip()):
        raise ValueError(f"bound {name!r}: arxiv must be an identifier such as '2305.08846', or None")
    if assumes is not None and (not isinstance(assumes, str) or not assumes.strip()):
        raise ValueError(f"bound {name!r}: assumes must be a phrase such as 'a Gaussian trade-off curve', or None")

    def decorator(fn):
        if name in _REGISTRY:
            other = _REGISTRY[name].fn
            raise ValueError(
                f"bound name {name!r} is already registered by "
                f"{getattr(other, '__module__', '?')}.{getattr(other, '__qualname__', repr(other))}"
            )
        if not callable(fn):
            raise TypeError(f"@register_bound({name!r}) needs a function, got {fn!r}")
        _check_signature(name, family, fn)
        _REGISTRY[name] = BoundSpec(name, family, sound, paper, arxiv, fn, assumes)
        return fn

    return decorator


def _check_signature(name: str, family: str, fn) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [k for k in FAMILIES[family] if k not in params or params[k].kind is inspect.Parameter.POSITIONAL_ONLY]
    if missing:
        raise TypeError(f"bound {name!r} ({family}) must take the keyword arguments {', '.join(missing)}")
    extra = [
        p.name
        for p in params.values()
        if p.name not in FAMILIES[family] and p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_POSITIONAL
    ]
    if extra:
        raise TypeError(f"bound {name!r}: parameters {extra} need defaults (only the family's are passed)")


def registered() -> Mapping[str, BoundSpec]:
    """The bounds registered so far, name -> :class:`BoundSpec` (a read-only live view; it
    loads nothing: :func:`dpaudit.audit.catalog.available_bounds` loads every bound first)."""
    return MappingProxyType(_REGISTRY)
