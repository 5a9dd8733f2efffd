"""The bound registry: names, soundness, refusals, dispatch, discovery; summary labels."""

import json
import sys
import textwrap

import numpy as np
import pytest

import dpaudit.audit as audit_pkg
from dpaudit.audit import (
    BoundResult,
    CanaryScores,
    available_bounds,
    epsilon_one_run,
    get_bound,
    one_run_ceiling,
    register_bound,
)
from dpaudit.audit import catalog
from dpaudit.audit import registry as reg
from dpaudit.audit.canary_scores import METHODS
from dpaudit.errors import InputError

DELTA = 1e-5


@pytest.fixture
def scratch_registry(monkeypatch):
    """A copy of the registry for the test; the real one is restored afterwards."""
    available_bounds()  # make sure the built-in bounds are loaded into the copy
    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))
    return reg._REGISTRY


def separated(m=100):
    return CanaryScores(in_scores=np.arange((m + 1) // 2) + 10.0, out_scores=-np.arange(m // 2) - 1.0)


# ---------------------------------------------------------------------- the five
def test_the_five_bounds_are_registered_with_family_soundness_and_paper():
    assert available_bounds() == ["clopper_pearson", "gdp", "one_run", "one_run_fdp", "order_statistics"]
    want = {
        "clopper_pearson": ("threshold", True, "Jagielski et al. 2020", "2006.07709"),
        "one_run": ("one_run", True, "Steinke et al. 2023", "2305.08846"),
        "one_run_fdp": ("one_run", False, "Mahloujifar et al. 2025", "2410.22235"),
        "gdp": ("threshold", False, "Nasr et al. 2023", "2302.07956"),
        "order_statistics": ("one_run", False, "Xiang et al. 2025", "2509.08704"),
    }
    for name, (family, sound, paper, arxiv) in want.items():
        spec = get_bound(name)
        assert (spec.name, spec.family, spec.sound, spec.paper, spec.arxiv) == (name, family, sound, paper, arxiv)
        assert (spec.assumes is None) == sound
        assert json.loads(json.dumps(spec.to_dict()))["sound"] is sound


def test_methods_is_derived_from_the_registry():
    assert list(METHODS) == available_bounds()
    assert METHODS["one_run"] == ("Steinke et al. 2023", "one_run")
    assert dict(METHODS)["gdp"] == ("Nasr et al. 2023", "threshold")
    with pytest.raises(KeyError):
        METHODS["nope"]


def test_registered_function_is_the_public_one_and_is_returned_unchanged():
    assert get_bound("one_run").fn is epsilon_one_run
    eps, extras = get_bound("one_run").evaluate(
        num_canaries=1000, num_guesses=100, num_correct=100, delta=DELTA, significance=0.05
    )
    assert eps == pytest.approx(3.47, abs=0.01) and extras == {}
    eps, extras = get_bound("one_run_fdp").evaluate(
        num_canaries=1000, num_guesses=100, num_correct=100, delta=DELTA, significance=0.05
    )
    assert eps > 3.47 and extras["mu"] > 0


# --------------------------------------------------------------------- refusals
def test_duplicate_names_are_refused_and_the_first_registration_kept(scratch_registry):
    def other(*, num_canaries, num_guesses, num_correct, delta, significance):
        return 99.0

    with pytest.raises(ValueError, match="already registered.*epsilon_one_run"):
        register_bound("one_run", family="one_run", sound=True, paper="X et al. 2030", arxiv=None)(other)
    assert get_bound("one_run").fn is epsilon_one_run
    register_bound("dup_test", family="one_run", sound=True, paper="X et al. 2030", arxiv=None)(other)
    with pytest.raises(ValueError, match="already registered"):
        register_bound("dup_test", family="one_run", sound=False, paper="Y 2031", arxiv=None)(other)


@pytest.mark.parametrize(
    "name, kwargs, err",
    [
        ("Bad-Name", {}, ValueError),
        ("ok_name", {"family": "many_runs"}, ValueError),
        ("ok_name", {"sound": 1}, ValueError),
        ("ok_name", {"paper": " "}, ValueError),
        ("ok_name", {"arxiv": ""}, ValueError),
    ],
)
def test_bad_registrations_are_refused(scratch_registry, name, kwargs, err):
    base = dict(family="one_run", sound=True, paper="X et al. 2030", arxiv=None)
    with pytest.raises(err):
        register_bound(name, **{**base, **kwargs})(lambda **kw: 0.0)
    assert name not in available_bounds()


def test_a_function_without_the_family_arguments_is_refused(scratch_registry):
    def threshold_style(*, tp, fp, tn, fn, delta, significance):
        return 0.0

    with pytest.raises(TypeError, match="num_canaries"):
        register_bound("wrong_family", family="one_run", sound=True, paper="X 2030", arxiv=None)(threshold_style)

    def needs_more(*, tp, fp, tn, fn, delta, significance, prior):
        return 0.0

    with pytest.raises(TypeError, match="prior"):
        register_bound("needs_more", family="threshold", sound=True, paper="X 2030", arxiv=None)(needs_more)
    assert "wrong_family" not in available_bounds() and "needs_more" not in available_bounds()


def test_unknown_names_are_input_errors_listing_the_known_ones():
    with pytest.raises(InputError, match="clopper_pearson, gdp, one_run, one_run_fdp"):
        get_bound("nope")
    with pytest.raises(InputError, match="unknown method"):
        separated().bound("nope", delta=DELTA)


# ------------------------------------------------------------- adding a bound
def test_a_new_bound_dispatches_through_canary_scores_audit_and_ceiling(scratch_registry):
    calls = []

    @register_bound("half_one_run", family="one_run", sound=False, paper="Test 2030", arxiv=None, assumes="nothing")
    def half(*, num_canaries, num_guesses, num_correct, delta, significance):
        calls.append((num_canaries, num_guesses, num_correct, significance))
        eps = epsilon_one_run(num_canaries=num_canaries, num_guesses=num_guesses, num_correct=num_correct,
                              delta=delta, significance=significance)
        return eps / 2, {"half": True}

    cs = separated(100)
    res = cs.bound("half_one_run", delta=DELTA)
    assert res.method == "half_one_run" and res.sound is False and res.details["half"] is True
    assert res.epsilon == pytest.approx(cs.epsilon_one_run(delta=DELTA).epsilon / 2)
    assert len(calls) == 7  # one per distinct default candidate
    assert "half_one_run" in [b.method for b in cs.audit(delta=DELTA).bounds]
    assert "epsilon estimate" in res.summary() and "under nothing" in res.summary()
    assert one_run_ceiling(method="half_one_run", num_canaries=100, delta=DELTA, significance=0.05) == pytest.approx(
        res.epsilon
    )


def test_bound_modules_are_discovered_by_name(scratch_registry, monkeypatch, tmp_path):
    (tmp_path / "bound_discovered_test.py").write_text(
        textwrap.dedent(
            """
            from dpaudit.audit.registry import register_bound

            @register_bound("discovered_test", family="threshold", sound=True, paper="Test 2030", arxiv=None)
            def bound(*, tp, fp, tn, fn, delta, significance):
                return 0.5
            """
        )
    )
    monkeypatch.setattr(audit_pkg, "__path__", [*audit_pkg.__path__, str(tmp_path)])  # for the import itself
    monkeypatch.setattr(catalog, "_BOUND_DIRS", [*catalog._BOUND_DIRS, str(tmp_path)])
    monkeypatch.setattr(catalog, "_discovered", False)
    try:
        assert "discovered_test" in available_bounds()
        assert separated().bound("discovered_test", delta=DELTA).epsilon == 0.5
    finally:
        sys.modules.pop("dpaudit.audit.bound_discovered_test", None)


# ----------------------------------------------------------------------- labels
def test_sound_bounds_print_a_lower_bound_and_estimates_say_they_are_not_one():
    cs = separated(100)
    for name in available_bounds():
        res = cs.bound(name, delta=DELTA)
        assert res.sound is get_bound(name).sound
        text = res.summary()
        assert res.paper in text
        if res.sound:
            assert f"epsilon >= {res.epsilon:.3f} at delta=1e-05, 95% confidence" in text
        else:
            assert "epsilon >=" not in text
            assert f"epsilon estimate {res.epsilon:.3f}" in text
            assert f"under {get_bound(name).assumes} (not a sound lower bound)" in text
            assert "mu >= " in text
        blob = json.loads(json.dumps(res.to_dict(), allow_nan=False))
        assert blob["sound"] is res.sound and blob["arxiv"] == get_bound(name).arxiv


def test_report_summary_marks_the_estimates():
    text = separated(100).audit(delta=DELTA).summary()
    assert text.count("not a sound lower bound") == 3
    assert text.count("epsilon >= ") == 2


def test_bound_result_takes_soundness_from_the_registry_unless_given():
    args = ("one_run_fdp", 1.0, DELTA, 0.05, 100, 10, 10, {"name": "bonferroni"}, {})
    assert BoundResult(*args).sound is False
    assert BoundResult("one_run", *args[1:]).sound is True
    assert BoundResult("unregistered", *args[1:]).sound is False
    assert BoundResult("unregistered", *args[1:], sound=True).sound is True
    with pytest.raises(InputError):
        BoundResult(*args, sound="yes")
