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


def test_the_gpu_preset_is_the_demo_sweep_at_gpt2_size():
    demo, gpu = load_config("demo"), load_config("gpu")
    assert gpu.model.size == "gpt2" and gpu.train.device == "cuda" and gpu.train.precision == "auto"
    assert gpu.pretrain.enabled and gpu.audit.ladder.enabled
    assert gpu.model_names() == demo.model_names()
    for name in gpu.model_names():
        g, d = gpu.for_model(name).train, demo.for_model(name).train
        assert (g.trainer, g.dp.target_epsilon, g.dp.unit, g.dp.delta) == (d.trainer, d.dp.target_epsilon, d.dp.unit,
                                                                          d.dp.delta)


@pytest.mark.slow
def test_the_gpu_preset_runs_two_steps_at_tiny_size_on_cpu(tmp_path):
    """The gpu preset end to end with its shape shrunk: every stage, the ladder included."""
    from dpaudit.stages import run

    raw = load_config("gpu").to_dict()
    raw["data"].update(num_patients=30, max_length=48)
    raw["data"]["public"]["num_patients"] = 20
    raw["canaries"].update(num=16, secrets={"num": 1, "enumerate_limit": 0, "sample_size": 200})
    raw["tokenizer"]["vocab_size"] = 300
    raw["model"]["size"] = "tiny"
    raw["pretrain"]["steps"] = 2
    raw["train"].update(device="cpu", steps=2, max_eval_examples=16)
    for m in raw["models"]:
        m.setdefault("train", {}).update(steps=2, batch_size=8)
    raw["fleet"]["num_models"] = 2
    raw["audit"]["ladder"].update(input_space_canaries=64, gradient_canaries=10_000)
    result = run(load_config(raw), out=tmp_path / "gpu")
    assert result.ok, result.failed
    models = {m["name"]: m for m in result.report["models"]}
    assert set(models) == {"nonprivate", "dp-eps1", "dp-eps4", "dp-eps12", "dp-eps4-patient"}
    for name in ("dp-eps1", "dp-eps4", "dp-eps12", "dp-eps4-patient"):
        assert [r["rung"] for r in models[name]["rungs"]] == ["released", "input_space", "white_box"]
