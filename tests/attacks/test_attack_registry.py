"""The attack registry: registration rules, duplicates, lookup errors."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.attacks import Attack, AttackInputs, available_attacks, get_attack, register, registry
from dpaudit.errors import InputError
from dpaudit.signals import TokenSignals


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in a test do not leak into the real registry."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_duplicate_name_is_refused_and_registry_unchanged():
    before = available_attacks()
    original = registry.attack_class("loss")
    with pytest.raises(ValueError, match="already registered"):

        @register("loss")
        class Impostor(Attack):
            def __init__(self) -> None:
                pass

    assert available_attacks() == before and registry.attack_class("loss") is original


def test_register_and_use_a_new_attack(scratch_registry):
    @register("constant_test")
    class Constant(Attack):
        requires = frozenset({"texts"})

        def __init__(self, *, value: float = 1.0) -> None:
            self.value = value

        def _score(self, inputs):
            return np.full(inputs.n, self.value)

    assert "constant_test" in available_attacks() and Constant.name == "constant_test"
    a = get_attack("constant_test", value=3.0)
    assert a.get_params() == {"value": 3.0}
    sig = TokenSignals(logprob=np.zeros((2, 1)), mask=np.ones((2, 1), bool))
    assert not a.can_run(AttackInputs(target=sig))
    assert a.score(AttackInputs(target=sig, texts=["x", "y"])).tolist() == [3.0, 3.0]
    with pytest.raises(ValueError):
        register("constant_test")(Constant)


def test_registration_rules(scratch_registry):
    with pytest.raises(TypeError, match="keyword-only"):

        @register("positional_test")
        class Positional(Attack):
            def __init__(self, k=0.2) -> None:
                self.k = k

    with pytest.raises(ValueError, match="unknown"):

        @register("needs_test")
        class Needs(Attack):
            requires = frozenset({"gpu"})

    with pytest.raises(TypeError):
        register("not_attack_test")(object)
    for bad in ("Loss", "min-k", "", "1x"):
        with pytest.raises(ValueError):
            register(bad)
    with pytest.raises(ValueError, match="reserved"):  # results/index.json marks the attack stage complete
        register("index")
    assert "positional_test" not in available_attacks()


def test_unknown_attack_lists_known_ones():
    with pytest.raises(InputError) as err:
        get_attack("no_such_attack")
    assert "loss" in str(err.value) and "rmia" in str(err.value)
