"""The ladder stage's twin canary set: the isolated set with a pool of just its canaries' tokens."""

import re

import pytest

from dpaudit.canaries import load_canary_spec, make_canaries, new_tokens
from dpaudit.config import load_config
from dpaudit.rundir import RunDir
from dpaudit.stages.isolated import ISOLATED_CANARIES
from dpaudit.stages.ladder import _twin_canary_set


@pytest.mark.parametrize("m", [3, 8192])
def test_twin_canary_set_holds_just_its_canaries_tokens(tmp_path, m):
    config = load_config("tiny", overrides=[f"audit.ladder.input_space_canaries={m}"])
    path = _twin_canary_set(RunDir(tmp_path / "run"), config)
    spec, isolated = load_canary_spec(path), load_canary_spec(ISOLATED_CANARIES)
    assert spec["secret"] == {**isolated["secret"], "pool_size": 2 * m}  # the shipped set's pool is untouched
    assert {k: v for k, v in spec.items() if k != "secret"} == {k: v for k, v in isolated.items() if k != "secret"}
    canaries = make_canaries(spec=spec, num_canaries=m, seed=0)
    used = [t for c in canaries for t in re.findall(r"<\|canary_\d+\|>", c.text)]
    assert len(used) == len(set(used)) == 2 * m and set(used) == set(new_tokens(spec))  # each token once
    assert _twin_canary_set(RunDir(tmp_path / "run"), config) == path  # a resume finds the same set


def _gradient_canary_twin(root, *, record_q, ran_q=0.1, steps=100, m=2000, leak=False):
    """A run directory whose model ``m`` ran gradient canaries at ``ran_q`` (a non-member
    included when ``leak``: the inclusion check fails) under a DP record claiming ``record_q``."""
    import numpy as np

    from dpaudit.accounting import DpRecord
    from dpaudit.audit.gradient_canaries import GradientCanaryRecord
    from dpaudit.stages.artifacts import write_training
    from dpaudit.train.record import TrainingRecord

    rng = np.random.default_rng(1)
    included = rng.random(m) < 0.5
    inclusions = rng.binomial(steps, ran_q, size=m) * included
    if leak:
        inclusions[np.flatnonzero(~included)[0]] = 1
    scores = inclusions + rng.normal(0, np.sqrt(steps), size=m)
    canaries = GradientCanaryRecord(included=included, scores=scores, inclusions=inclusions, steps=steps,
                                    sample_rate=ran_q, max_grad_norm=1.0)
    record = DpRecord.dpsgd(trainer="plugin", noise_multiplier=1.0, sample_rate=record_q, steps=steps, delta=1e-5,
                            max_grad_norm=1.0, unit="user", num_units=round(100 / record_q), expected_batch_size=100)
    rundir = RunDir(root)
    md = rundir.model("m")
    md.root.mkdir(parents=True)
    write_training(md.root, TrainingRecord(log=[], dp=record, checks=None, gradient_canaries=canaries))
    return rundir


def test_white_box_canaries_of_another_mechanism_are_refused_as_evidence(tmp_path):
    """Gradient canaries that ran q = 0.1 under a record claiming 0.05: refused in the words the
    verdict counts as a violation (NOT_THE_CLAIMED_MECHANISM), before the inclusion check, which
    would refuse them for a reason that is no violation."""
    from dpaudit.audit.assess import NOT_THE_CLAIMED_MECHANISM
    from dpaudit.stages.ladder import white_box_rung

    config = load_config("tiny", overrides=["audit.ladder.trials=1"])
    for leak in (False, True):
        rung = white_box_rung(_gradient_canary_twin(tmp_path / f"other{leak}", record_q=0.05, leak=leak), config, "m")
        assert rung.bound is None and rung.refused.endswith(NOT_THE_CLAIMED_MECHANISM), rung.refused
        assert "q = 0.1" in rung.refused and "q = 0.05" in rung.refused
    leaked = white_box_rung(_gradient_canary_twin(tmp_path / "leak", record_q=0.1, leak=True), config, "m")
    assert leaked.bound is None and "do not follow the claimed sampler" in leaked.refused
    assert not leaked.refused.endswith(NOT_THE_CLAIMED_MECHANISM)
