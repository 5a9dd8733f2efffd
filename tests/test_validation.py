"""`dpaudit validate --trainer`: verdicts, exit codes and bad input."""

import json
from importlib import resources

import pytest
import yaml

from dpaudit.cli import main

PLUGINS = '''
import torch

from dpaudit.train import dpsgd


def raises(dataset, tokenizer, *, seed):
    raise RuntimeError("out of coffee")


def not_a_model(dataset, tokenizer, *, seed):
    return {"weights": [1, 2, 3]}


def wrapped(dataset, tokenizer, *, seed):
    """A user's trainer: the toolkit's DP-SGD at sigma 1, no access to the run directory."""
    from dpaudit.config import load_config

    return dpsgd(dataset, tokenizer, seed=seed, config=load_config("tiny", overrides=[
        "models=[{name: m}]", "train.trainer=dpaudit.train:dpsgd", "train.dp.noise_multiplier=1.0"]))
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "my_trainers.py").write_text(PLUGINS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def validate(capsys, *args):
    code = main(["validate", "--config", "tiny", "--json", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_readme_example_on_tiny_is_inconclusive(tmp_path, capsys):
    """16 canaries at delta 1e-3 cannot show any epsilon: the ceiling is 0, so a green
    'consistent' would mislead."""
    code, out, _ = validate(capsys, "--trainer", "dpaudit.train:dpsgd", "--epsilon", "3.2", "--delta", "1e-3",
                            "--set", "train.dp.noise_multiplier=1.0", "--out", str(tmp_path / "v"))
    result = json.loads(out)
    assert code == 3 and result["verdict"] == "inconclusive"
    assert result["ceiling"] <= 3.2 and "canaries" in result["reason"]
    assert set(result) == {"verdict", "reason", "epsilon_lower_bound", "method", "significance", "num_canaries",
                           "num_guesses", "num_correct", "claimed_epsilon", "delta", "ceiling", "rungs"}
    assert [r["rung"] for r in result["rungs"]] == ["input_space", "white_box"]
    assert all(r["cost_s"] > 0 for r in result["rungs"])  # the trainer's run; the white-box scoring and its ideal
    assert all(r["significance"] == 0.025 for r in result["rungs"] if r["refused"] is None)  # 0.05 over two rungs
    # validate runs the stages up to the attack: no extraction, no report, no twin; its rungs are the model's ladder
    model = tmp_path / "v" / "models" / "validate"
    assert json.loads((model / "ladder.json").read_text())["rungs"] == [
        {k: v for k, v in r.items() if k != "ceiling"} for r in result["rungs"]]
    # each rung's ceiling: its best test's, every guess right; the audit's is the largest of all its tests'
    for r in result["rungs"]:
        assert r["refused"] is not None or r["epsilon"] <= r["ceiling"] <= result["ceiling"]
    assert not (tmp_path / "v" / "ladder").exists()
    # the same run resumed, as text: the verdict, the bound, then the two rungs in a line
    assert main(["validate", "--config", "tiny", "--trainer", "dpaudit.train:dpsgd", "--epsilon", "3.2", "--delta",
                 "1e-3", "--set", "train.dp.noise_multiplier=1.0", "--out", str(tmp_path / "v")]) == 3
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("inconclusive: ") and lines[2].startswith("ladder: input-space ")
    # the ceiling is the audit's (its strongest test's), not that of the reported bound's canaries
    assert lines[1].endswith(f"the ceiling of this audit is {result['ceiling']:.3f} (every guess of its strongest "
                             "test right)")
    assert "white-box" in lines[2] and lines[3] == f"run: {tmp_path / 'v'}"
    assert (model / "results").is_dir() and not (model / "extraction.json").exists()
    assert not (tmp_path / "v" / "report.json").exists()


@pytest.mark.slow
def test_plug_in_without_a_run_directory(plugins, capsys):
    code, out, _ = validate(capsys, "--trainer", "my_trainers:wrapped", "--epsilon", "3.2", "--delta", "1e-3",
                            "--out", str(plugins / "v"))
    assert code == 3 and json.loads(out)["verdict"] == "inconclusive"


@pytest.mark.parametrize(("args", "needle"), [
    (["--trainer", "no_such_module:train", "--epsilon", "1", "--delta", "1e-5"], "no_such_module"),
    (["--trainer", "my_trainers:raises", "--epsilon", "1", "--delta", "1e-5"], "out of coffee"),
    (["--trainer", "my_trainers:not_a_model", "--epsilon", "1", "--delta", "1e-5"], "not a causal LM"),
    (["--trainer", "dpaudit.train:dpsgd", "--epsilon", "0", "--delta", "1e-5"], "--epsilon"),
    (["--trainer", "dpaudit.train:dpsgd", "--epsilon", "1", "--delta", "1"], "--delta"),
    (["--trainer", "dpaudit.train:dpsgd", "--epsilon", "1", "--delta", "1e-5", "--canaries", "1"], "--canaries"),
    (["--step", "my_trainers:wrapped", "--full-batch", "--noise-multiplier", "1", "--max-grad-norm", "1",
      "--expected-batch-size", "8"], "--full-batch"),
])
def test_bad_input_is_one_clear_line(plugins, capsys, args, needle):
    out = plugins / "v"
    code, stdout, err = validate(capsys, *args, "--set", "train.dp.noise_multiplier=1.0", "--out", str(out))
    lines = [x for x in err.splitlines() if x.startswith("dpaudit validate: error:")]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err and stdout == ""
    assert not out.exists()  # nothing half-written


@pytest.mark.slow
def test_no_noise_trainer_is_caught(tmp_path, capsys):
    code = main(["validate", "--trainer", "dpaudit.train.faulty:no_noise", "--epsilon", "1", "--delta", "1e-5",
                 "--canaries", "1000", "--set", "data.num_patients=200", "--set", "data.public.num_patients=80",
                 "--set", "train.dp.noise_multiplier=5.0",
                 "--out", str(tmp_path / "v"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "violated" and code == 1
    assert result["epsilon_lower_bound"] > 1.0


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [1, 4])
def test_own_engine_on_the_demo_preset_is_consistent(tmp_path, capsys, epsilon):
    """The toolkit's DP-SGD, at the demo's DP regime and 1,000 canaries, earns its epsilon: not
    violated, and conclusive (the DP-SGD family test's ceiling is above the claim; it learns)."""
    code = main(["validate", "--trainer", "dpaudit.train:dpsgd", "--epsilon", str(epsilon), "--delta", "1e-5",
                 "--set", f"train.dp.target_epsilon={epsilon}", "--set", "train.steps=20",
                 "--set", "train.batch_size=160", "--out", str(tmp_path / "v"), "--json"])  # the earlier demo's DP regime
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "consistent" and code == 0, result["reason"]
    assert result["ceiling"] > epsilon and result["epsilon_lower_bound"] <= epsilon


def test_accounting_that_is_not_of_the_training_run_is_caught():
    """Micro-steps accounted as steps: the event says 4T steps at q / 4, the sampler ran T at q."""
    from types import SimpleNamespace as Record

    from dpaudit.audit.assess import accounting_mismatch

    checks = {"batch_size": {"steps": 71, "expected_mean": 32.0}}
    right = {"steps": 71, "sample_rate": 32.0 / 561, "num_units": 561}
    assert accounting_mismatch(Record(**right), checks) is None
    assert "284 steps" in accounting_mismatch(Record(**{**right, "steps": 284, "sample_rate": 8.0 / 561}), checks)
    assert "sampling rate" in accounting_mismatch(Record(**{**right, "sample_rate": 8.0 / 561}), checks)
    assert accounting_mismatch(Record(**right), None) is None and accounting_mismatch(None, checks) is None


def _sampler_checks(*, num_units, sample_rate, steps):
    import numpy as np

    from dpaudit.train.checks import batch_size_check

    sizes = np.random.default_rng(0).binomial(num_units, sample_rate, size=steps)
    batch = batch_size_check(sizes, num_units=num_units, sample_rate=sample_rate)
    return {"batch_size": batch, "ok": batch["consistent"]}


def test_accounting_with_the_right_expected_batch_and_the_wrong_rate_is_caught():
    """q / 2 over 2N units (q computed from examples, the sampler sampled users): the same
    expected batch q N, another rate; the sampler's q is 1 - variance / mean of its Binomial."""
    from dpaudit.accounting import DpRecord
    from dpaudit.audit.assess import Claim, accounting_mismatch, assess

    n, q, steps = 1000, 0.1, 100
    checks = _sampler_checks(num_units=n, sample_rate=q, steps=steps)
    common = dict(trainer="x", noise_multiplier=1.0, steps=steps, delta=1e-5, max_grad_norm=1.0, unit="user",
                  expected_batch_size=100)
    honest = DpRecord.dpsgd(**common, sample_rate=q, num_units=n)
    wrong = DpRecord.dpsgd(**common, sample_rate=q / 2, num_units=2 * n)
    assert accounting_mismatch(honest, checks) is None
    why = accounting_mismatch(wrong, checks)
    assert why is not None and "0.05" in why and "0.1" in why
    verdict = assess(bounds=[], claim=Claim.of_record(wrong), learned=True, checks=checks, record=wrong)
    assert verdict.status == "violated" and why in verdict.reason
    assert assess(bounds=[], claim=Claim.of_record(honest), learned=True, checks=checks,
                  record=honest).status == "inconclusive"


def test_a_record_whose_event_is_not_the_dp_sgd_of_its_own_fields_is_caught():
    """Fields of T steps of Poisson DP-SGD, an event of T / 4 (an accountant stepped once per
    4 optimizer steps): the claim is the event's, smaller than the fields' own."""
    from dpaudit.accounting import DpRecord, make_event
    from dpaudit.audit.assess import Claim, accounting_mismatch, assess

    n, q, steps = 1000, 0.1, 100
    checks = _sampler_checks(num_units=n, sample_rate=q, steps=steps)
    honest = DpRecord.dpsgd(trainer="x", noise_multiplier=1.0, sample_rate=q, steps=steps, delta=1e-5,
                            max_grad_norm=1.0, unit="user", num_units=n, expected_batch_size=100)
    quarter = honest.replace(event=make_event(noise_multiplier=1.0, sample_rate=q, steps=steps // 4))
    assert quarter.dpsgd_parameters is None and accounting_mismatch(honest, checks) is None
    for given in (checks, None):  # the record against itself: no sampler checks needed
        why = accounting_mismatch(quarter, given)
        assert why is not None and "its event is not the DP-SGD of its own fields" in why
    verdict = assess(bounds=[], claim=Claim.of_record(quarter), learned=True, checks=checks, record=quarter)
    assert verdict.status == "violated" and "its event is not the DP-SGD of its own fields" in verdict.reason
    # a record that states no DP-SGD fields (a third-party event) is not held to them
    bare = DpRecord(trainer="x", event=quarter.event, delta=1e-5)
    assert accounting_mismatch(bare, checks) is None


def test_validate_isolates_its_canaries_unless_told_otherwise():
    """By default: prefix-free distinct new-token canaries, only the input embedding trains,
    by plain SGD at a small learning rate, and (with a base model) the one attack chosen in
    advance; --set wins over each."""
    from dpaudit.stages.ladder import rung_significance
    from dpaudit.stages.validate import validate_config

    cfg = validate_config(trainer="dpaudit.train:dpsgd", canaries=None, config="tiny", overrides=[])
    assert cfg.canaries.set == "new_token_bare" and cfg.model.trainable == "input_embeddings"
    assert cfg.attack.attacks == ["reference"] and cfg.model_names() == ["validate"]
    assert (cfg.train.optimizer, cfg.train.momentum, cfg.train.lr) == ("sgd", 0.0, 0.01)
    assert not cfg.audit.ladder.enabled and rung_significance(cfg) == 0.025  # its own two rungs, no twins
    cfg = validate_config(trainer="dpaudit.train:dpsgd", canaries=None, config="tiny",
                          overrides=["canaries.set=new_token", "model.trainable=all", "attack.attacks=[loss]",
                                     "train.optimizer=adamw", "train.lr=0.003"])
    assert (cfg.canaries.set, cfg.model.trainable, cfg.attack.attacks) == ("new_token", "all", ["loss"])
    assert (cfg.train.optimizer, cfg.train.lr) == ("adamw", 0.003)
    cfg = validate_config(trainer="dpaudit.train:dpsgd", canaries=None, config="tiny",
                          overrides=["pretrain.enabled=false"])
    assert cfg.attack.attacks == []  # no base model: every attack the inputs allow
    assert (cfg.train.optimizer, cfg.train.lr) == ("adamw", 0.003)  # and the preset's optimizer
    cfg = validate_config(trainer="dpaudit.train:dpsgd", canaries=None, config="tiny",
                          overrides=["model.base_model=some/local/model"])
    assert cfg.attack.attacks == ["reference"]  # the user's base model is the base: the design of one
    assert (cfg.train.optimizer, cfg.train.momentum, cfg.train.lr) == ("sgd", 0.0, 0.01)


@pytest.mark.slow
def test_white_box_rung_catches_a_claim_the_noise_does_not_earn(tmp_path, capsys):
    """sigma 1 over 10 full steps is epsilon 14.1 at delta 1e-3: a claim of 4 is false, and the
    white-box rung (gradient canaries in the trainer's own DP-SGD run) shows it."""
    code, out, _ = validate(capsys, "--trainer", "dpaudit.train:dpsgd", "--epsilon", "4", "--delta", "1e-3",
                            "--full-batch", "--set", "train.dp.noise_multiplier=1.0", "--out", str(tmp_path / "v"))
    result = json.loads(out)
    assert code == 1 and result["verdict"] == "violated" and "white_box" in result["reason"]
    assert 4 < result["epsilon_lower_bound"] <= 14.1


@pytest.mark.slow
def test_full_batch_trains_every_unit_in_every_step(tmp_path, capsys):
    """--full-batch: q = 1 over exactly the units trained on (members and included canaries),
    10 steps unless train.steps is set, and every step's Poisson batch is all of them."""
    from dpaudit.rundir import RunDir
    from dpaudit.stages.artifacts import read_dp_record

    code, out, _ = validate(capsys, "--trainer", "dpaudit.train:dpsgd", "--epsilon", "4", "--delta", "1e-3",
                            "--full-batch", "--set", "train.dp.noise_multiplier=3.0", "--out", str(tmp_path / "v"))
    assert code in (0, 3), out  # sigma 3 over 10 full steps: epsilon 3.77 at delta 1e-3, within the claim
    model = RunDir(tmp_path / "v").model("validate")
    event, log = read_dp_record(model), model.read_train_log()
    assert (event.sample_rate, event.steps) == (1.0, 10)
    assert {row["batch_size"] for row in log if "batch_size" in row} == {event.num_units}
    # train.steps set in the config file itself (not only by --set)
    raw = yaml.safe_load(resources.files("dpaudit.presets").joinpath("tiny.yaml").read_text())
    raw.setdefault("train", {})["steps"] = 3
    (tmp_path / "steps.yaml").write_text(yaml.safe_dump(raw))
    code, _, _ = validate(capsys, "--trainer", "dpaudit.train:dpsgd", "--epsilon", "4", "--delta", "1e-3",
                          "--full-batch", "--config", str(tmp_path / "steps.yaml"),
                          "--set", "train.dp.noise_multiplier=1.0", "--out", str(tmp_path / "w"))
    assert read_dp_record(RunDir(tmp_path / "w").model("validate")).steps == 3


def test_validate_counts_gradient_canaries_of_another_mechanism_as_a_violation(tmp_path, canaries_of_another_q):
    """validate's own verdict, as the report's: a plug-in whose gradient canaries ran q = 0.1
    under a DP record of q = 0.05 (and no sampler checks to compare it with) is violated, with
    the white-box rung's refusal as the reason."""
    import numpy as np

    from dpaudit.config import load_config
    from dpaudit.rundir import RunDir
    from dpaudit.stages.validate import MODEL, verdict_of

    run = RunDir(tmp_path / "v")
    run.root.mkdir(parents=True)
    run.write_config(load_config("tiny", overrides=["audit.ladder.trials=1"]))
    md = run.model(MODEL)
    record = canaries_of_another_q(md.root)
    rng = np.random.default_rng(0)
    labels = rng.random(200) < 0.5
    scores = rng.normal(0.0, 1.0, 200)  # input canaries that show nothing
    metrics = {"auc": 0.5, "auc_ci": [0.4, 0.6], "tpr_at_fpr": {}, "balanced_accuracy": 0.5,
               "num_in": int(labels.sum()), "num_out": int((~labels).sum())}
    md.write_results("loss", params={}, splits={"canaries": (scores, labels, metrics)})
    out = verdict_of(run, epsilon=record.epsilon(), delta=1e-5)
    white = out["rungs"][1]
    assert white["epsilon"] is None and "not the claimed mechanism" in white["refused"]
    assert out["verdict"] == "violated" and white["refused"] in out["reason"] and out["exit_code"] == 1
