import pytest

from dpaudit.config import PRESETS, load_config
from dpaudit.errors import InputError


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_load(preset):
    config = load_config(preset)
    assert config.train.batch_size > 0


def test_overrides_and_round_trip(tmp_path):
    config = load_config("tiny", overrides=["train.batch_size=32", "train.dp.noise_multiplier=1.1",
                                            "model.lora.target_modules=[c_attn]",
                                            "attack.params.lira_online.variance=per_example"])
    assert config.train.batch_size == 32
    assert config.attack.params == {"lira_online": {"variance": "per_example"}}
    assert config.train.dp.noise_multiplier == 1.1
    assert config.model.lora.target_modules == ["c_attn"]
    path = tmp_path / "resolved.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path) == config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.bogus=1"], "unknown config key train.bogus"),
        (["train.batch_size=-4"], "train.batch_size must be > 0"),
        (["train.batch_size=abc"], "train.batch_size must be an integer"),
        (["train.batch_size=2.5"], "train.batch_size must be an integer"),
        (["train.dp.unit=team"], "train.dp.unit must be one of"),
        (["train.dp.noise_multiplier=0"], "train.dp.noise_multiplier must be > 0"),
        (["train.dp.delta=1.5"], "train.dp.delta must be in (0, 1)"),
        (["model=3"], "config key model must be a mapping"),
        (["model.trainable=heads"], "model.trainable must be one of"),
        (["model.trainable=input_embeddings", "model.lora.enabled=true"], "set one of them"),
        (["train.lr"], "--set expects key=value"),
        (["train.batch_size.x=1"], "train.batch_size is not a section"),
        (["attack.attacks=[loss,lirra]"], "attack.attacks names unknown attack(s) lirra"),
        (["attack.params.lirra.variance=fixed"], "attack.params.lirra: unknown attack 'lirra'"),
        (["attack.params.lira_online.variance=odd"], "attack.params.lira_online: lira_online: variance must be"),
        (["attack.params.min_k.kk=0.2"], "attack.params.min_k: attack 'min_k' has no parameter 'kk'"),
        (["attack.params.min_k=0.2"], "attack.params.min_k must be a mapping"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    """Each is refused before anything is written: by the config itself, or (the attack
    settings, which the config knows by name only) by the stages' check of it."""
    from dpaudit.stages import check_config

    with pytest.raises(InputError, match=None) as err:
        check_config(load_config("tiny", overrides=overrides))
    assert message in str(err.value)


def test_missing_file_and_unknown_preset(tmp_path):
    with pytest.raises(InputError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="unknown preset"):
        load_config("huge")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_config(bad)
