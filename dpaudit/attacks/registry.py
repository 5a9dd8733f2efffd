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

__all__ = ["attack_class", "available_attacks", "check_settings", "get_attack", "register", "runnable_attacks"]

_REGISTRY: dict[str, type[Attack]] = {}
RESERVED = frozenset({"index"})  # results/index.json marks the attack stage complete
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def register(name: str):
    """Class decorator: register an :class:`Attack` subclass under ``name``.

    Refuses a name already taken (``ValueError``), a class that is not an ``Attack``, an
    unknown requirement, and an ``__init__`` with parameters that are not keyword-only
    (``TypeError``). Sets ``cls.name = name``.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"attack name {name!r} must be lower_snake_case")
    if name in RESERVED:
        raise ValueError(f"attack name {name!r} is reserved: results/{name}.json is a file of the attack stage's own")

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


def check_settings(*, attacks, params, audit_attack: str) -> None:
    """The attack settings of a run config (``attack.attacks``, ``attack.params`` and
    ``audit.attack``) checked against the registry: known names, parameters every attack
    accepts, and a multi-run attack that scores one model alone. The config itself knows
    attack names only; the stages call this before anything is written."""
    unknown = sorted(set(attacks) - set(available_attacks()))
    if unknown:
        raise InputError(f"config key attack.attacks names unknown attack(s) {', '.join(unknown)}")
    for name, kwargs in params.items():
        try:
            get_attack(name, **kwargs)
        except InputError as err:
            raise InputError(f"config key attack.params.{name}: {err}") from None
    if audit_attack not in available_attacks():
        raise InputError(f"config key audit.attack must be an attack, got {audit_attack!r} "
                         f"(known: {', '.join(available_attacks())})")
    needs = sorted(get_attack(audit_attack).requires - {"texts"})
    if needs:
        raise InputError(f"config key audit.attack must score a model alone; {audit_attack} needs {', '.join(needs)}")
