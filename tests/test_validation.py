"""The audit catches a DP-SGD bug: a trainer that claims noise but adds none is "violated"."""

import json

import pytest

from dpaudit.cli import main


@pytest.mark.slow
def test_no_noise_trainer_is_caught(tmp_path, capsys):
    out = tmp_path / "faulty"
    code = main(["run", "--config", "demo", "--out", str(out), "--json",
                 "--set", "train.trainer=dpaudit.train.faulty:no_noise", "--set", "train.dp.noise_multiplier=5.0",
                 "--set", "data.num_patients=200", "--set", "canaries.num=1000", "--set", "fleet.num_models=0"])
    report = json.loads(capsys.readouterr().out)
    assert report["privacy"]["epsilon"] < 0.2  # what the faulty trainer claims
    assert report["empirical_epsilon"]["best"]["epsilon"] > 1.0
    assert report["verdict"] == "violated" and code == 1
