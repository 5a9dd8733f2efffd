"""The attack registry: attacks register by name with a class decorator.

    @register("loss")
    class LossAttack(Attack):
        ...

    get_attack("min_k", k=0.1).score(inputs)

Registry names are the keys of every JSON output. A name can be registered once; a
second registration under the same name raises ``ValueError``.
"""

from __future__ import annotations

import inspect
import re

from dpaudit.attacks.base import REQUIREMENTS, Attack, AttackInputs
from dpaudit.errors import InputError

__all__ = ["attack_class", "available_attacks", "get_attack", "register", "runnable_attacks"]

_REGISTRY: dict[str, type[Attack]] = {}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def register(name: str):
    """Class decorator: register an :class:`Attack` subclass under ``name``.

    Refuses a name already taken (``ValueError``), a class that is not an ``Attack``, an
    unknown requirement, and an ``__init__`` with parameters that are not keyword-only
    (``TypeError``). Sets ``cls.name = name``.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"attack name {name!r} must be lower_snake_case")

    def decorator(cls):
        if name in _REGISTRY:
            other = _REGISTRY[name]
            raise ValueError(
                f"attack name {name!r} is already registered by {other.__module__}.{other.__qualname__}"
            )
        if not (isinstance(cls, type) and issubclass(cls, Attack)):
            raise TypeError(f"@register({name!r}) needs an Attack subclass, got {cls!r}")
        unknown = set(cls.requires) - REQUIREMENTS
        if unknown:
            raise ValueError(f"attack {name!r} requires unknown inputs {sorted(unknown)}; known: {sorted(REQUIREMENTS)}")
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        positional = [
            p.name
            for p in params
            if p.kind not in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD)
        ]
        if positional:
            raise TypeError(f"attack {name!r}: __init__ parameters must be keyword-only, not {positional}")
        cls.name = name
        cls.requires = frozenset(cls.requires)
        _REGISTRY[name] = cls
        return cls

    return decorator


def available_attacks() -> list[str]:
    """Registered attack names, sorted."""
    return sorted(_REGISTRY)


def attack_class(name: str) -> type[Attack]:
    """The class registered under ``name`` (InputError listing the known names if none)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown attack {name!r}; known attacks: {', '.join(available_attacks())}") from None


def get_attack(name: str, **params) -> Attack:
    """Build the attack registered under ``name`` with keyword ``params``.

    Unknown names and bad parameters raise :class:`InputError`.
    """
    cls = attack_class(name)
    allowed = cls._param_names()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InputError(
            f"attack {name!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters: {', '.join(allowed) or '(none)'}"
        )
    attack = cls(**params)
    attack.validate_params()
    return attack


def runnable_attacks(inputs: AttackInputs) -> list[str]:
    """Names of the registered attacks (default parameters) that can score ``inputs``."""
    return [n for n in available_attacks() if _REGISTRY[n]().can_run(inputs)]
