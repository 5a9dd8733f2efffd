"""The faulty-trainer zoo (docs/zoo.md, benchmarks/bench_zoo.py): `dpaudit validate` flags the
trainers that leak far above their claim, and never the correct or over-noised ones.

Every run uses the benchmark's configuration (the tiny preset, 1,000 new-token canaries,
``bench_zoo.SETS``), so a test here checks a row of docs/zoo.md. Runs are shared through a
module-scoped cache: the toolkit's engine at epsilon 1 serves two tests.
"""

import importlib.util
import math
from pathlib import Path

import pytest

from dpaudit.audit import learned
from dpaudit.train.faulty import CONSERVATIVE, FAULTY_TRAINERS

pytestmark = pytest.mark.slow  # the long suite: python -m pytest -m slow (.ci/run runs it)

ROOT = Path(__file__).resolve().parents[1]


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_zoo", ROOT / "benchmarks" / "bench_zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _load_bench()
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """``zoo(trainer, claim, *extra_overrides)``: the validate result of that run, trained once per module."""
    import torch

    from dpaudit.stages.validate import validate

    cache: dict = {}
    root = tmp_path_factory.mktemp("zoo")
    saved = torch.get_num_threads()
    torch.set_num_threads(BENCH.THREADS)  # as the benchmark ran: the same numbers as docs/zoo.md

    def get(trainer: str, claim: float, *extra: str) -> dict:
        key = (trainer, claim, extra)
        if key not in cache:
            out = root / f"run{len(cache)}"
            cache[key] = validate(trainer=trainer, epsilon=claim, delta=BENCH.DELTA, canaries=BENCH.CANARIES,
                                  config=BENCH.CONFIG, out=out,
                                  overrides=[*BENCH.SETS, *extra, f"train.dp.target_epsilon={claim:g}"])
        return cache[key]

    yield get
    torch.set_num_threads(saved)


def assert_not_violated_for_the_right_reason(result: dict, claim: float) -> None:
    """Not violated; consistent, or inconclusive only where the ceiling or the learned check says so."""
    assert result["verdict"] != "violated", result["reason"]
    assert result["exit_code"] != 1
    bound = result["epsilon_lower_bound"]
    assert bound is None or bound <= claim
    assert (result["checks"] or {}).get("ok") is True, result["checks"]
    did_learn = learned(initial_loss=result["initial_loss"], final_loss=result["final_loss"])
    if result["verdict"] == "inconclusive":
        if result["ceiling"] <= claim:
            assert "perfect attack" in result["reason"]
        else:
            assert did_learn is False and "learned nothing" in result["reason"], result["reason"]
    else:
        assert result["verdict"] == "consistent" and result["exit_code"] == 0
        assert result["ceiling"] > claim and did_learn is True


# ------------------------------------------------------- leaking trainers are caught

# trainers that leak far above the claim of 1 in the zoo's configuration, and the detector
# that catches them there (docs/zoo.md)
CAUGHT_BY_BOUND = ["no_noise", "mean_noise_on_sum", "nonfinite_passthrough"]
CAUGHT_BY_CHECKS = ["shuffle_as_poisson"]
FAST = {"no_noise", "mean_noise_on_sum", "shuffle_as_poisson"}  # the rest: slow


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=slow) for n in CAUGHT_BY_BOUND])
def test_leaking_trainer_is_violated_by_the_bound(zoo, name):
    result = zoo(f"dpaudit.train.faulty:{name}", 1.0)
    assert result["verdict"] == "violated" and result["exit_code"] == 1, result["reason"]
    assert result["epsilon_lower_bound"] > 1.0
    assert result["ceiling"] > 1.0


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=slow) for n in CAUGHT_BY_CHECKS])
def test_leaking_sampler_is_violated_by_the_checks(zoo, name):
    result = zoo(f"dpaudit.train.faulty:{name}", 1.0)
    assert result["verdict"] == "violated" and result["exit_code"] == 1
    assert result["checks"]["ok"] is False and result["checks"]["batch_size"]["consistent"] is False
    assert result["checks"]["batch_size"]["variance"] == 0.0  # fixed-size batches
    assert "checks failed (batch_size)" in result["reason"]


@slow
def test_accounting_of_micro_steps_is_violated_by_the_cross_check(zoo):
    result = zoo("dpaudit.train.faulty:microstep_accounting", 1.0)
    assert result["verdict"] == "violated" and result["exit_code"] == 1
    assert "accounting is not of the training it ran" in result["reason"]


def test_the_zoo_lists_every_faulty_trainer():
    """A new faulty trainer gets a row (its bug and source class) in the benchmark and doc."""
    assert set(FAULTY_TRAINERS) <= set(BENCH.BUGS)
    doc = (ROOT / "docs" / "zoo.md").read_text(encoding="utf-8")
    for name in FAULTY_TRAINERS:
        assert f"`{name}`" in doc, name
    assert set(CAUGHT_BY_BOUND + CAUGHT_BY_CHECKS).isdisjoint(CONSERVATIVE)


# ------------------------------------------------------- correct and conservative trainers


@pytest.mark.parametrize("claim", [1.0, 4.0])
def test_own_engine_is_never_violated(zoo, claim):
    result = zoo("dpaudit.train:dpsgd", claim)
    assert_not_violated_for_the_right_reason(result, claim)
    assert result["verdict"] == "consistent"  # in this configuration: conclusive and the model learned


@slow
@pytest.mark.parametrize("claim", [1.0, 4.0])
def test_opacus_adapter_is_never_violated(zoo, claim):
    pytest.importorskip("opacus")
    result = zoo("dpaudit.train.opacus:dpsgd", claim)
    assert_not_violated_for_the_right_reason(result, claim)
    assert result["verdict"] == "consistent"


@pytest.mark.parametrize("claim", [1.0, pytest.param(4.0, marks=slow)])
def test_conservative_trainer_is_not_violated(zoo, claim):
    assert CONSERVATIVE == {"noisy_microsteps"}
    result = zoo("dpaudit.train.faulty:noisy_microsteps", claim)
    assert_not_violated_for_the_right_reason(result, claim)


def test_verdict_and_bound_agree(zoo):
    """The reported bound and the verdict of one shared run tell the same story."""
    result = zoo("dpaudit.train.faulty:no_noise", 1.0)
    assert math.isfinite(result["epsilon_lower_bound"])
    assert result["epsilon_lower_bound"] <= result["ceiling"]
    assert result["num_correct"] <= result["num_guesses"] <= BENCH.CANARIES
