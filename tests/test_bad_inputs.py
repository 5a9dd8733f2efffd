"""The catalogue of bad inputs (docs/errors.md): each one gets exit status 2, one line on
stderr that names what is wrong, no traceback, and nothing half-written.

Each case is ``(argv, needle)``: the command line (built from the fixture's files) and a
piece of the one error line. The plug-in cases train through ``dpaudit validate`` on a
smaller ``tiny`` (no base model), a few seconds each.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import textwrap
import types
from pathlib import Path

import pytest

import dpaudit.rundir
from dpaudit.cli import main

ONE_MODEL = ["--config", "tiny", "--set", "models=[{name: target}]"]
DP = ["--set", "train.trainer=dpaudit.train:dpsgd"]
# validate on a quick run: no base model, few patients and canaries
QUICK = ["--config", "tiny", "--set", "pretrain.enabled=false", "--set", "data.num_patients=12", "--canaries", "4"]
CLAIM = ["--epsilon", "1", "--delta", "1e-5"]

PLUGINS = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def boom(dataset, tokenizer, *, seed):
    raise RuntimeError("the plug-in broke")


def wrong_type(dataset, tokenizer, *, seed):
    return {"weights": [1, 2, 3]}


def nan_weights(dataset, tokenizer, *, seed):
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer), n_positions=64))
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.fill_(float("nan"))
    return model
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every bad file of the catalogue, built once: data files, model directories, plug-ins."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from dpaudit.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("bad-inputs")

    def write(name, content):
        path = root / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    f = types.SimpleNamespace(root=root)
    f.texts = write("texts.txt", "".join(f"note {i} about the patient\n" for i in range(20)))
    f.empty = write("empty.jsonl", "")
    f.not_json = write("not-json.jsonl", '{"text": "fine"}\n{"text": "broken\n')
    f.no_text = write("notes.jsonl", "".join(json.dumps({"body": f"note {i}"}) + "\n" for i in range(20)))
    f.one_text = write("one.jsonl", json.dumps({"text": "the only note", "unit_id": "p1"}) + "\n")
    f.latin1 = write("latin1.txt", "".join(f"Patientin {i} klagt über Übelkeit\n" for i in range(20)).encode("latin-1"))
    f.not_yaml = write("broken.yaml", "train: {batch_size: [8\n")
    f.list_yaml = write("list.yaml", "- seed: 0\n")
    f.population = write("population.txt", "".join(f"record {i} of the population\n" for i in range(40)))
    f.small_population = write("small-population.txt", "".join(f"record {i} of the few\n" for i in range(20)))
    f.short_population = write("short-population.txt", "".join(f"record {i} of the population\n" for i in range(40))
                               + "a\n")
    f.unit_jsonl = write("users.jsonl", "".join(json.dumps({"body": f"n {i}", "user": str(i % 3)}) + "\n"
                                                for i in range(20)))
    # user 0's records name two cohorts: a unit belongs to one group (issue 29)
    f.split_group = write("cohorts.jsonl", "".join(json.dumps({"text": f"n {i}", "unit_id": str(i % 3),
                                                               "cohort": "a" if i < 10 else "b"}) + "\n"
                                                   for i in range(20)))

    tokenizer = train_tokenizer([f"word{i} other{i * 7} note" for i in range(300)], vocab_size=300)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer), n_positions=64))
    f.model = root / "model"
    model.save_pretrained(f.model)
    tokenizer.save_pretrained(f.model)

    def variant(name, change):
        path = root / name
        shutil.copytree(f.model, path)
        change(path)
        return path

    weights = "model.safetensors"
    f.truncated = variant("truncated", lambda p: (p / weights).write_bytes((f.model / weights).read_bytes()[:300]))

    def corrupt(p):
        data = bytearray((f.model / weights).read_bytes())
        data[8:24] = b"\x00" * 16  # the JSON header
        (p / weights).write_bytes(bytes(data))

    f.corrupted = variant("corrupted", corrupt)

    def pickle_only(p):
        import torch

        (p / weights).unlink()
        torch.save(model.state_dict(), p / "pytorch_model.bin")

    f.pickle_only = variant("pickle-only", pickle_only)
    f.no_config = variant("no-config", lambda p: (p / "config.json").unlink())
    f.no_tokenizer = variant("no-tokenizer", lambda p: [(p / n).unlink() for n in ("tokenizer.json",
                                                                                    "tokenizer_config.json")])
    big = train_tokenizer([f"word{i} other{i * 7} more{i * 13}" for i in range(600)], vocab_size=600)
    f.big_tokenizer = root / "big-tokenizer"
    big.save_pretrained(f.big_tokenizer)
    f.tokenizer_too_big = variant("tokenizer-too-big", lambda p: big.save_pretrained(p))
    f.small_gpt2 = root / "small-gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=64)).save_pretrained(
        f.small_gpt2)
    f.plugins = write("bad_plugins.py", textwrap.dedent(PLUGINS))
    return f


def audit(f, model, *extra, members=None, nonmembers=None):
    return ["audit-model", str(model), "--members", str(members or f.texts), "--nonmembers",
            str(nonmembers or f.texts), *extra]


def train(*sets):
    return ["train", *ONE_MODEL, *(a for s in sets for a in ("--set", s))]


# name -> (argv builder, needle); docs/errors.md lists the same cases in the same order
CATALOGUE = {
    # configs
    "config file missing": (lambda f: ["train", "--config", str(f.root / "missing.yaml")], "config file not found"),
    "unknown preset": (lambda f: ["train", "--config", "enormous"], "unknown preset"),
    "config not YAML": (lambda f: ["train", "--config", str(f.not_yaml)], "not valid YAML"),
    "config not a mapping": (lambda f: ["train", "--config", str(f.list_yaml)], "mapping at the top level"),
    "unknown key": (lambda f: train("train.batchsize=3"), "unknown config key train.batchsize"),
    "unknown nested key": (lambda f: train("train.dp.bogus=1"), "unknown config key train.dp.bogus"),
    "--set without =": (lambda f: ["train", *ONE_MODEL, "--set", "train.lr"], "--set expects key=value"),
    "wrong type: number": (lambda f: train("train.batch_size=many"), "train.batch_size must be an integer"),
    "wrong type: bool": (lambda f: train("train.dp.reproducible=maybe"), "train.dp.reproducible must be true"),
    "negative seed": (lambda f: train("seed=-1"), "seed must be >= 0"),
    "batch size out of range": (lambda f: train("train.batch_size=-1"), "train.batch_size must be > 0"),
    "holdout fraction out of range": (lambda f: train("data.holdout_fraction=1.5"), "data.holdout_fraction"),
    "inclusion probability out of range": (lambda f: train("canaries.inclusion_prob=0"), "canaries.inclusion_prob"),
    "delta out of range": (lambda f: ["train", *ONE_MODEL, *DP, "--set", "train.dp.noise_multiplier=1",
                                      "--set", "train.dp.delta=1.0"], "delta"),
    "noise and target epsilon both": (lambda f: ["train", *ONE_MODEL, *DP, "--set", "train.dp.noise_multiplier=1",
                                                 "--set", "train.dp.target_epsilon=2"], "exactly one of"),
    "DP without noise or target": (lambda f: ["train", *ONE_MODEL, *DP], "exactly one of"),
    "pretraining without public data": (lambda f: train("data.public_fraction=0"), "pretrain.enabled needs public"),
    "duplicate model names": (lambda f: ["train", "--config", "tiny", "--set", "models=[{name: a}, {name: a}]"],
                              "duplicate names"),
    "model name with a slash": (lambda f: ["train", "--config", "tiny", "--set", "models=[{name: a/b}]"],
                                "plain name"),
    "unknown attack in the config": (lambda f: train("attack.attacks=[telepathy]"), "unknown attack"),
    "trainer module missing": (lambda f: train("train.trainer=no_such_module:train"), "no_such_module"),
    "user unit without a unit column": (
        lambda f: ["train", *ONE_MODEL, *DP, "--set", "train.dp.noise_multiplier=1", "--set", "train.dp.unit=user",
                   "--set", f"data.source={f.unit_jsonl}", "--set", "data.text_column=body",
                   "--set", "data.unit_column=null"], "unit"),
    # data files
    "data file missing": (lambda f: train(f"data.source={f.root / 'nothing.jsonl'}"), "data file not found"),
    "data file empty": (lambda f: train(f"data.source={f.empty}"), "empty"),
    "data file not JSON": (lambda f: train(f"data.source={f.not_json}"), "could not read"),
    "data file without the text column": (lambda f: train(f"data.source={f.no_text}"), "text column 'text' not found"),
    "data file with one text": (lambda f: train(f"data.source={f.one_text}"), "at least 2 protected units"),
    "data file not UTF-8": (lambda f: train(f"data.source={f.latin1}", "data.unit_column=null"), "utf-8"),
    "unit in two groups": (lambda f: train(f"data.source={f.split_group}", "data.group_column=cohort"),
                           "has records in group 'a' and in group 'b'"),
    "members file empty": (lambda f: audit(f, f.model, members=f.empty), "holds no texts"),
    "members file not JSON": (lambda f: audit(f, f.model, members=f.not_json), "is not valid JSON"),
    "members file without text": (lambda f: audit(f, f.model, members=f.no_text), "no string field 'text'"),
    "members file not UTF-8": (lambda f: audit(f, f.model, members=f.latin1), "not UTF-8"),
    "members file missing": (lambda f: audit(f, f.model, members=f.root / "none.jsonl"), "text file not found"),
    # model directories
    "model directory missing": (lambda f: audit(f, f.root / "no-such-model"), "model directory not found"),
    "model directory without config": (lambda f: audit(f, f.no_config), "not a model directory"),
    "truncated safetensors": (lambda f: audit(f, f.truncated), "truncated or corrupted"),
    "corrupted safetensors": (lambda f: audit(f, f.corrupted), "truncated or corrupted"),
    "pickle-only checkpoint": (lambda f: audit(f, f.pickle_only), "refuses to load"),
    "model without a tokenizer": (lambda f: audit(f, f.no_tokenizer), "tokenizer"),
    "tokenizer does not fit the model": (lambda f: audit(f, f.tokenizer_too_big), "does not fit the model"),
    "base model's tokenizer does not fit": (
        lambda f: train(f"model.base_model={f.small_gpt2}", f"tokenizer.path={f.big_tokenizer}"), "does not fit"),
    "reference model is no model": (lambda f: audit(f, f.model, "--reference-model", str(f.no_config)),
                                    "not a model directory"),
    # audit-model --train-references
    "population too small for N halves": (lambda f: audit(f, f.model, "--population", str(f.small_population),
                                                          "--train-references", "4"), "too small for 4 reference"),
    "population overlaps the members": (lambda f: audit(f, f.model, "--population", str(f.texts),
                                                        "--train-references", "4"), "must be disjoint"),
    "population text the tokenizer cannot encode": (lambda f: audit(f, f.model, "--population",
                                                                    str(f.short_population), "--train-references",
                                                                    "4"), "cannot encode"),
    "train references without a population": (lambda f: audit(f, f.model, "--train-references", "4"),
                                               "go together"),
    # command-line numbers
    "audit batch size zero": (lambda f: audit(f, f.model, "--batch-size", "0"), "--batch-size"),
    "audit max length negative": (lambda f: audit(f, f.model, "--max-length", "-5"), "--max-length"),
    "unknown attack on the command line": (lambda f: audit(f, f.model, "--attacks", "telepathy"), "unknown attack"),
    "accountant sample rate above 1": (lambda f: ["accountant", "--noise-multiplier", "1", "--sample-rate", "1.5",
                                                  "--steps", "10", "--delta", "1e-5"], "sampl"),
    "accountant zero steps": (lambda f: ["accountant", "--noise-multiplier", "1", "--sample-rate", "0.1",
                                         "--steps", "0", "--delta", "1e-5"], "steps"),
    "validate negative epsilon": (lambda f: ["validate", "--trainer", "dpaudit.train:dpsgd", "--epsilon", "-1",
                                             "--delta", "1e-5"], "--epsilon"),
    "validate delta above 1": (lambda f: ["validate", "--trainer", "dpaudit.train:dpsgd", "--epsilon", "1",
                                          "--delta", "2"], "--delta"),
    "validate one canary": (lambda f: ["validate", "--trainer", "dpaudit.train:dpsgd", *CLAIM, "--canaries", "1"],
                            "--canaries"),
    "attack on a missing run": (lambda f: ["attack", str(f.root / "no-run")], "run directory not found"),
    "report on a directory that is no run": (lambda f: ["report", str(f.root)], "not a dpaudit run directory"),
    # trainer plug-ins and training
    "plug-in that raises": (lambda f: ["validate", "--trainer", "bad_plugins:boom", *CLAIM, *QUICK],
                            "the plug-in broke"),
    "plug-in that returns the wrong type": (lambda f: ["validate", "--trainer", "bad_plugins:wrong_type", *CLAIM,
                                                       *QUICK], "returned dict, not a causal LM"),
    "plug-in that returns NaN weights": (lambda f: ["validate", "--trainer", "bad_plugins:nan_weights", *CLAIM,
                                                    *QUICK], "NaN or infinite weights"),
    "NaN loss during training": (lambda f: ["validate", "--trainer", "dpaudit.train:nonprivate", *CLAIM, *QUICK,
                                            "--set", "train.lr=1e30"], "NaN or infinite at step"),
}


@pytest.fixture(autouse=True)
def stderr_logging(monkeypatch):
    """main() sets up its stderr log handler afresh, on this test's captured stderr."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)


def check_clean_error(code, err, command, needle, root):
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith((f"dpaudit {command}: error:", "dpaudit: error:"))]
    assert len(errors) == 1, err
    assert needle.lower() in errors[0].lower(), err
    assert not list(root.rglob("*.tmp")) and not list(root.rglob(".*.partial-*")), "half-written artifacts"


@pytest.mark.parametrize("case", list(CATALOGUE))
def test_bad_input(case, files, tmp_path, monkeypatch, capsys):
    build, needle = CATALOGUE[case]
    argv = build(files)
    monkeypatch.chdir(tmp_path)  # audit-model's default --out, validate's runs/ land here
    monkeypatch.syspath_prepend(str(files.root))  # the plug-ins
    out = tmp_path / "out"
    if argv[0] in ("train", "validate", "audit-model"):
        argv = [*argv, "--out", str(out)]
    code = main(argv)
    _, err = capsys.readouterr()
    check_clean_error(code, err, argv[0], needle, tmp_path)
    assert not out.exists()  # a fresh output that failed leaves nothing behind


def test_catalogue_is_documented_and_large():
    doc = (Path(__file__).parents[1] / "docs" / "errors.md").read_text(encoding="utf-8")
    assert len(CATALOGUE) >= 30
    missing = [case for case in CATALOGUE if f"| {case} |" not in doc]
    assert not missing, f"docs/errors.md lacks {missing}"


# --------------------------------------------------------------------------- a full disk


def fill_disk_after(monkeypatch, writes: int) -> None:
    """Make the atomic writers of dpaudit.rundir fail with ENOSPC after ``writes`` files, as
    a disk that fills up would: the write itself raises."""
    done: list[int] = []
    real_fdopen = os.fdopen

    class FullFile:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fdopen(fd, mode="r", *args, **kwargs):
        f = real_fdopen(fd, mode, *args, **kwargs)
        if len(done) >= writes:
            return FullFile(f)
        done.append(fd)
        return f

    fake_os = types.ModuleType("os")
    fake_os.__dict__.update(os.__dict__)
    fake_os.fdopen = fdopen
    monkeypatch.setattr(dpaudit.rundir, "os", fake_os)


def snapshot(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("writes", [0, 3])
def test_full_disk_during_audit_model_leaves_nothing_half_written(writes, files, tmp_path, monkeypatch, capsys):
    out = tmp_path / "audit"
    fill_disk_after(monkeypatch, writes)
    code = main(audit(files, files.model, "--attacks", "loss,zlib", "--out", str(out)))
    _, err = capsys.readouterr()
    check_clean_error(code, err, "audit-model", "no space left on device", tmp_path)
    assert not (out / "audit_inputs.json").exists() and not (out / "report.json").exists()
    assert not (out / "models" / "model").exists()  # the results appear whole or not at all


def test_full_disk_during_a_rerun_loses_nothing_already_written(files, tmp_path, monkeypatch, capsys):
    out = tmp_path / "audit"
    assert main(audit(files, files.model, "--attacks", "loss,zlib", "--out", str(out))) in (0, 3)
    before = snapshot(out)
    capsys.readouterr()
    fill_disk_after(monkeypatch, 1)  # the report is rebuilt: its first file goes in, then the disk is full
    code = main(["report", str(out)])
    _, err = capsys.readouterr()
    check_clean_error(code, err, "report", "no space left on device", tmp_path)
    after = snapshot(out)
    assert set(after) == set(before)  # no file lost, none added
    assert after[Path("report.json")] == before[Path("report.json")]
    changed = [p for p in before if after[p] != before[p]]
    assert len(changed) <= 1  # at most the one file written whole before the disk filled


def test_a_killed_stage_leaves_nothing_the_rerun_keeps(tmp_path):
    """SIGKILL leaves a staging directory behind; the next stage of the same name deletes it."""
    out = tmp_path / "models" / "m"
    stale = out.parent / ".m.partial-killed"
    (stale / "model").mkdir(parents=True)
    other = out.parent / ".n.partial-running"  # another directory's stage is not touched
    other.mkdir()
    with dpaudit.rundir.staged_directory(out) as stage:
        (stage / "done.txt").write_text("complete")
    assert (out / "done.txt").read_text() == "complete" and not stale.exists() and other.exists()
