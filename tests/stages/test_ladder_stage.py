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
