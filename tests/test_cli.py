"""The command line: exit codes, one-line errors, no half-written run directories."""

import json
import subprocess
import sys

import pytest

from dpaudit.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_usage_error(code, err, out_dir, needle):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip() and "warn" not in line.lower()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert needle in lines[0]
    assert not out_dir.exists()
    assert not list(out_dir.parent.glob(f".{out_dir.name}.partial-*"))


def test_version_via_module():
    out = subprocess.run([sys.executable, "-m", "dpaudit", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("dpaudit ")


def test_no_command_is_usage_error(capsys):
    code, _, err = run_cli(capsys)
    assert code == 2 and "usage" in err


@pytest.fixture
def jsonl(tmp_path):
    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    return write


@pytest.fixture
def small_gpt2(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path / "small-gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=64)).save_pretrained(path)
    return path


# the tiny preset with one model, so that train.* overrides reach it unchanged
ONE_MODEL = ["--config", "tiny", "--set", "models=[{name: target}]"]


def bad_inputs(tmp_path, jsonl, small_gpt2):
    from dpaudit.data.tokenizer import train_tokenizer

    empty = jsonl("empty.jsonl", [])
    notes = jsonl("notes.jsonl", [{"body": f"note number {i}", "user": str(i % 3)} for i in range(20)])
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "weights.txt").write_text("hello")
    big_tokenizer = tmp_path / "big-tokenizer"
    train_tokenizer([f"word{i} other{i * 7}" for i in range(400)], vocab_size=300).save_pretrained(big_tokenizer)
    return {
        "missing config": (["--config", str(tmp_path / "missing.yaml")], "config file not found"),
        "unknown preset": (["--config", "enormous"], "unknown preset"),
        "unknown key": ([*ONE_MODEL, "--set", "train.batchsize=3"], "unknown config key train.batchsize"),
        "negative batch": ([*ONE_MODEL, "--set", "train.batch_size=-1"], "train.batch_size"),
        "non-numeric batch": ([*ONE_MODEL, "--set", "train.batch_size=many"], "train.batch_size"),
        "empty data set": ([*ONE_MODEL, "--set", f"data.source={empty}"], "empty"),
        "missing text column": ([*ONE_MODEL, "--set", f"data.source={notes}"], "text"),
        "not a model": ([*ONE_MODEL, "--set", f"model.base_model={not_a_model}"], "not a model"),
        "tokenizer does not fit": (
            [*ONE_MODEL, "--set", f"model.base_model={small_gpt2}", "--set", f"tokenizer.path={big_tokenizer}"],
            "does not fit",
        ),
        "sigma zero": ([*ONE_MODEL, "--set", "train.trainer=dpaudit.train:dpsgd",
                        "--set", "train.dp.noise_multiplier=0"], "noise_multiplier"),
        "both sigma and target": ([*ONE_MODEL, "--set", "train.trainer=dpaudit.train:dpsgd",
                                   "--set", "train.dp.noise_multiplier=1.0", "--set", "train.dp.target_epsilon=2.0"],
                                  "noise_multiplier"),
        "neither sigma nor target": ([*ONE_MODEL, "--set", "train.trainer=dpaudit.train:dpsgd"],
                                     "noise_multiplier"),
        "delta out of range": ([*ONE_MODEL, "--set", "train.trainer=dpaudit.train:dpsgd",
                                "--set", "train.dp.noise_multiplier=1.0", "--set", "train.dp.delta=1.0"], "delta"),
        "user unit without column": ([*ONE_MODEL, "--set", "train.trainer=dpaudit.train:dpsgd",
                                      "--set", "train.dp.noise_multiplier=1.0", "--set", "train.dp.unit=user",
                                      "--set", f"data.source={notes}", "--set", "data.text_column=body",
                                      "--set", "data.unit_column=null"], "unit"),
        "bad trainer": ([*ONE_MODEL, "--set", "train.trainer=no_such_module:train"], "no_such_module"),
    }


CASES = [
    "missing config", "unknown preset", "unknown key", "negative batch", "non-numeric batch", "empty data set",
    "missing text column", "not a model", "tokenizer does not fit", "sigma zero", "both sigma and target",
    "neither sigma nor target", "delta out of range", "user unit without column", "bad trainer",
]


@pytest.mark.parametrize("case", CASES)
def test_train_bad_input(case, tmp_path, jsonl, small_gpt2, capsys):
    argv, needle = bad_inputs(tmp_path, jsonl, small_gpt2)[case]
    out_dir = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", *argv, "--out", str(out_dir))
    assert_clean_usage_error(code, err, out_dir, needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--noise-multiplier", "0", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"], "noise"),
        (["--noise-multiplier", "1", "--sample-rate", "1.5", "--steps", "100", "--delta", "1e-5"], "sampl"),
        (["--noise-multiplier", "1", "--sample-rate", "0", "--steps", "100", "--delta", "1e-5"], "sampl"),
        (["--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "0"], "delta"),
        (["--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1"], "delta"),
        (["--target-epsilon", "1e-9", "--sample-rate", "1.0", "--steps", "100000", "--delta", "1e-5"], "epsilon"),
    ],
)
def test_accountant_bad_input(args, needle, capsys, tmp_path):
    code, _, err = run_cli(capsys, "accountant", *args)
    assert code == 2
    assert "Traceback" not in err and needle in err.lower()


def test_accountant_json(capsys):
    code, out, _ = run_cli(capsys, "accountant", "--noise-multiplier", "1.1", "--sample-rate", str(256 / 60000),
                           "--steps", str(60 * 60000 // 256), "--delta", "1e-5", "--json")
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"epsilon", "delta", "method"}
    assert result["method"] == "pld" and 2.3 < result["epsilon"] < 2.45

    code, out, _ = run_cli(capsys, "accountant", "--target-epsilon", "2.0", "--sample-rate", "0.01",
                           "--steps", "1000", "--delta", "1e-5", "--json")
    result = json.loads(out)
    assert code == 0 and result["epsilon"] <= 2.0 + 1e-9 and result["epsilon"] > 1.9
