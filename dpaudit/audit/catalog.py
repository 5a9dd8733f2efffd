"""Every registered bound, loaded: look-ups by name.

:mod:`dpaudit.audit.registry` only records what registers; this module makes sure
everything has: it imports :mod:`dpaudit.audit.bounds` (the built-in bounds) and, the
first time a bound is looked up, every ``bound_*`` module beside it. The import graph
stays one-way: bound modules import the registry, this module imports both, and the
registry imports nothing of :mod:`dpaudit.audit`.

    get_bound("one_run").paper       # "Steinke et al. 2023"
    available_bounds()               # ["clopper_pearson", "gdp", "one_run", ...]
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import dpaudit.audit.bounds  # noqa: F401  (registers the built-in bounds)
from dpaudit.audit.registry import BoundSpec, registered
from dpaudit.errors import InputError

__all__ = ["METHODS", "available_bounds", "get_bound"]

#: Where ``bound_*`` modules are looked for: this package's own folder.
_BOUND_DIRS: list[str] = [str(Path(__file__).parent)]
_discovered = False


def _discover() -> None:
    """Import every ``dpaudit.audit.bound_*`` module once (each registers its bounds)."""
    global _discovered
    if _discovered:
        return
    for info in pkgutil.iter_modules(_BOUND_DIRS):
        if info.name.startswith("bound_"):
            importlib.import_module(f"dpaudit.audit.{info.name}")
    _discovered = True


def available_bounds() -> list[str]:
    """Registered bound names, sorted."""
    _discover()
    return sorted(registered())


def get_bound(name: str) -> BoundSpec:
    """The :class:`BoundSpec` registered under ``name`` (InputError listing the known names if none)."""
    _discover()
    try:
        return registered()[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown bound {name!r}; known bounds: {', '.join(available_bounds())}") from None


class _Methods(Mapping):
    """Read-only view of the bound registry: method name -> (paper, family), sorted by name."""

    def __getitem__(self, name: str) -> tuple[str, str]:
        if name not in available_bounds():
            raise KeyError(name)
        spec = get_bound(name)
        return spec.paper, spec.family

    def __iter__(self) -> Iterator[str]:
        return iter(available_bounds())

    def __len__(self) -> int:
        return len(available_bounds())

    def __repr__(self) -> str:
        return f"METHODS({dict(self)!r})"


#: method name -> (paper, family), derived from the registry (live).
METHODS: Mapping[str, tuple[str, str]] = _Methods()
