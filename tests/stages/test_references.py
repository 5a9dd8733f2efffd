"""``audit-model --train-references N``: reference models trained on random halves of a
population (dpaudit.stages.references, dpaudit.fleet.population_design): the design, the
checks, the cost line, training on the fleet, resuming, the report, and the measured power
on a memorized and a clean model built from the built-in corpus (benchmarks/bench_references.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpaudit.errors import InputError
from dpaudit.fleet import (
    MIN_POPULATION_HALF,
    ProbeTiming,
    check_disjoint,
    cost_text,
    heldout_losses,
    population_design,
)

ROOT = Path(__file__).resolve().parents[2]


def bench():
    spec = importlib.util.spec_from_file_location("bench_references", ROOT / "benchmarks" / "bench_references.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the design (no training)


def test_population_halves_are_balanced_and_online_targets_have_both_sides():
    pop = [f"p{i // 2}" for i in range(80)]  # 40 persons, two texts each
    keep = population_design(population_units=pop, target_units=[f"t{i}" for i in range(10)], num_models=4, seed=0)
    assert keep.shape == (4, 90) and keep.dtype == bool
    assert (keep.sum(axis=0) == 2).all()  # every unit, population or audited, in exactly half of the models
    assert (keep[:, 0:80:2] == keep[:, 1:80:2]).all()  # a person's texts go in together
    offline = population_design(population_units=pop, num_models=3, seed=0)
    assert offline.shape == (3, 80)
    again = population_design(population_units=pop, target_units=[f"t{i}" for i in range(10)], num_models=4, seed=0)
    assert np.array_equal(keep, again)  # seeded


def test_population_design_refusals():
    with pytest.raises(InputError, match="too small for 4 reference models"):
        population_design(population_units=[str(i) for i in range(2 * MIN_POPULATION_HALF - 1)], num_models=4, seed=0)
    with pytest.raises(InputError, match="at least 2 in the online design"):
        population_design(population_units=[str(i) for i in range(64)], target_units=["a"], num_models=1, seed=0)
    # a unit id shared by the population and the audited texts names two units
    keep = population_design(population_units=[str(i) for i in range(64)], target_units=["0"], num_models=2, seed=1)
    assert keep.shape == (2, 65)


def test_overlap_with_the_audited_texts_is_refused():
    check_disjoint(["a note", "another"], audited=[("members.jsonl", ["third"])], origin="pop.jsonl")
    with pytest.raises(InputError, match=r"1 text\(s\) of the population pop.jsonl are also in nonmembers.jsonl "
                                         r"\(the first: population text 2\)"):
        check_disjoint(["a note", " another \n"], audited=[("members.jsonl", ["x"]), ("nonmembers.jsonl", ["another"])],
                       origin="pop.jsonl")


def test_unencodable_texts():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dpaudit.data.tokenizer import train_tokenizer, unencodable

    byte_level = train_tokenizer([f"word{i} note" for i in range(50)], vocab_size=300)
    ids = byte_level(["word1 note", "a", "Übelkeit ✓"])["input_ids"]
    assert [i for i, _ in unencodable(ids, tokenizer=byte_level)] == [1]  # byte-level encodes anything but too short a text
    word = Tokenizer(models.WordLevel({"[UNK]": 0, "</s>": 1, "the": 2, "note": 3}, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="[UNK]", eos_token="</s>")
    bad = unencodable(tok(["the note", "the 名前 note"])["input_ids"], tokenizer=tok)
    assert [i for i, _ in bad] == [1] and "unknown to the tokenizer" in bad[0][1]


def test_heldout_losses_compare_on_the_texts_a_reference_left_out():
    from dpaudit.signals import TokenSignals

    def signals(nll):
        return TokenSignals(logprob=np.full((3, 4), -nll, dtype=np.float32), mask=np.ones((3, 4), bool))

    keep = np.array([[True, False, False], [False, False, False]])
    rows = heldout_losses(target=signals(1.0), references=[signals(2.0), signals(1.5)], keep=keep)
    assert [(r["texts"], r["loss"], r["target_loss"]) for r in rows] == [(2, 2.0, 1.0), (3, 1.5, 1.0)]


def test_cost_line_and_probe_timing():
    log = [{"step": 1, "elapsed_s": 3.0}, {"step": 2, "elapsed_s": 4.0}, {"step": 3, "elapsed_s": 5.0},
           {"step": 4, "elapsed_s": 8.0}]  # first and last steps carry an evaluation of 2 s
    t = ProbeTiming.from_log(log, wall_s=10.0)
    assert t.step_s == pytest.approx(1.0) and t.eval_s == pytest.approx(2.0) and t.overhead_s == pytest.approx(4.0)
    assert t.model_seconds(steps=100, eval_every=50) == pytest.approx(4 + 100 + 3 * 2)
    text = cost_text(seconds=[120.0] * 8, workers=2, executor="local", smaller=4)
    assert text == ("training 8 reference model(s): about 2.0 min each, 8.0 min in all (2 local workers); "
                    "--train-references 4 would take about 4.0 min")
    assert "side by side on a cluster" in cost_text(seconds=[5.0], workers=1, executor="ray", smaller=None)


# --------------------------------------------------------------------------- trained references


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, one_torch_thread):
    """Members, non-members and a population from the built-in corpus; two tiny targets (memorized, clean)."""
    root = tmp_path_factory.mktemp("references")
    return bench().build(root / "inputs", members=48, nonmembers=48, population=160, epochs=6, max_length=32,
                         population_units=True)


def audit(inputs, out, *extra, target="memorized", refs=4, as_json=True):
    from dpaudit.cli import main

    return main(["audit-model", str(inputs[target]), "--members", str(inputs["members"]), "--nonmembers",
                 str(inputs["nonmembers"]), "--population", str(inputs["population"]), "--train-references",
                 str(refs), "--reference-config", str(inputs["config"]), "--max-length", "32", "--out", str(out),
                 *(["--json"] if as_json else []), *extra])


def test_audit_model_trains_its_references_and_resumes(inputs, tmp_path, capsys):
    out = tmp_path / "audit"
    assert audit(inputs, out) in (0, 3)
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert "training 4 reference model(s): about" in captured.err and "--train-references" not in captured.err
    (model,) = result["models"]
    assert {"loss", "lira_online", "lira_offline", "rmia", "reference"} <= set(model["attacks"])
    refs = json.loads((out / "audit_inputs.json").read_text())["references"]
    assert refs["trained"] == 4 and refs["design"] == "online" and refs["start"] == "from scratch"
    assert refs["architecture"] == str(Path(inputs["memorized"]).resolve()) and refs["base_model"] is None
    assert refs["population"]["count"] == 160 and refs["population"]["units"] < 160  # a patient's notes: one unit
    assert 40 < refs["population"]["per_reference"][0] <= refs["population"]["per_reference"][1] < 120
    assert refs["in_per_text"] == [2, 2] and 20 < refs["audited_per_reference"][0] < 76
    assert len(refs["heldout_loss"]) == 4 and all(0 < r["texts"] < 48 for r in refs["heldout_loss"])
    assert refs["estimate_s"] > 0 and refs["cost_s"] > 0
    keep = np.load(out / "references" / "keep.npz")["keep"]
    assert keep.shape == (4, 160 + 96) and (keep.sum(axis=0) == 2).all()  # the inclusion matrix, recorded
    report = json.loads((out / "report.json").read_text())
    assert report["references"]["trained"] == 4 and report["references"]["loss_gap"] is not None
    assert report["blind_baseline"]["auc"] is not None  # the blind baseline stays beside the results
    html = (out / "report.html").read_text()
    assert "Reference models: 4 trained for this audit from scratch" in html and "Blind baseline" in html

    # an interrupted audit: one model and the signals gone; the rerun trains that one alone
    stamps = {d.name: (d / "fleet_job.json").stat().st_mtime_ns for d in (out / "references").glob("model-*")}
    shutil.rmtree(out / "references" / "model-002")
    shutil.rmtree(out / "references" / "signals")
    assert audit(inputs, out) in (0, 3)
    captured = capsys.readouterr()
    assert "training 1 reference model(s)" in captured.err and "3 of 4 already trained" in captured.err
    after = {d.name: (d / "fleet_job.json").stat().st_mtime_ns for d in (out / "references").glob("model-*")}
    assert {k: v for k, v in after.items() if k != "model-002"} == {k: v for k, v in stamps.items()
                                                                      if k != "model-002"}
    assert json.loads(captured.out)["models"][0]["attacks"]["lira_online"]["auc"] == pytest.approx(
        model["attacks"]["lira_online"]["auc"])  # the same model again (seeded)
    # nothing left to train: no cost line; the text output says what the references are
    assert audit(inputs, out, as_json=False) in (0, 3)
    captured = capsys.readouterr()
    assert "reference model(s)" not in captured.err
    assert "reference models: 4 trained for this audit (from scratch, online design), held-out loss" in captured.out


def test_a_smaller_n_chosen_at_the_cost_line(inputs, tmp_path, capsys):
    from dpaudit.stages.audit_model import audit_model

    asked = []

    def choose(estimate, n):
        asked.append((n, estimate.smaller, estimate.fresh))
        return None if len(asked) == 1 else 2

    out = tmp_path / "audit"
    kw = dict(members=inputs["members"], nonmembers=inputs["nonmembers"], population=inputs["population"],
              train_references=8, reference_config=inputs["config"], reference_design="offline",
              attacks=["loss", "rmia", "lira_offline"], max_length=32, out=out, progress=False, choose=choose)
    with pytest.raises(InputError, match="stopped before training the reference models"):
        audit_model(inputs["clean"], **kw)
    assert not out.exists()  # the probe ran elsewhere
    summary = audit_model(inputs["clean"], **kw)
    assert asked == [(8, 4, True), (8, 4, True)]
    assert "--train-references 4 would take about" in capsys.readouterr().err
    assert len(list((out / "references").glob("model-*"))) == 2 and "rmia" in summary
    refs = json.loads((out / "audit_inputs.json").read_text())["references"]
    assert refs["trained"] == 2 and refs["design"] == "offline" and refs["in_per_text"] == [0, 0]


def test_fine_tuned_references_and_a_weak_reference_warns(inputs, tmp_path, capsys):
    """--reference-base: the references fine-tune it. A base that learned nothing, trained one
    step: references far worse than the target, and the report says so."""
    import yaml

    config = yaml.safe_load(Path(inputs["config"]).read_text())
    config["train"].update(steps=1, lr=1e-6)
    weak = tmp_path / "weak.yaml"
    weak.write_text(yaml.safe_dump(config))
    out = tmp_path / "audit"
    assert audit(inputs, out, "--reference-base", str(inputs["clean"]), "--reference-config", str(weak),
                 "--reference-design", "offline", "--attacks", "loss,rmia", refs=2) in (0, 3)
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    refs = report["references"]
    assert refs["start"] == "fine-tuned" and refs["base_model"] == str(Path(inputs["clean"]).resolve())
    # the clean target's base never saw this population either: the memorized target beats it on members only,
    # so ask for what a weak reference looks like with a base of fresh weights instead
    out2 = tmp_path / "audit2"
    assert audit(inputs, out2, "--reference-config", str(weak), "--reference-design", "offline", "--attacks",
                 "loss,rmia", refs=2) in (0, 3)
    capsys.readouterr()
    report = json.loads((out2 / "report.json").read_text())
    assert report["references"]["much_worse"] == 2
    assert any("much worse than the target" in w for w in report["warnings"])
    assert "much worse than the target" in (out2 / "report.html").read_text()


# --------------------------------------------------------------------------- measured power


@pytest.mark.slow
def test_power_on_a_memorized_model_and_chance_on_a_clean_one(tmp_path_factory, one_torch_thread):
    """benchmarks/bench_references.py at a small size (about 4 minutes on 2 cores): RMIA and
    offline LiRA with 4 and 8 self-trained references beat the loss attack on the memorized
    model (at 1% FPR, 300 members against 1,000 non-members), and every attack stays at chance
    on the clean model."""
    b = bench()
    root = tmp_path_factory.mktemp("power")
    files = b.build(root / "inputs", members=300, nonmembers=1000, population=600, epochs=12)
    for refs in (4, 8):
        memorized = b.measure(files, target="memorized", refs=refs, out=root / f"m{refs}", design="offline")
        shutil.copytree(root / f"m{refs}" / "references", root / f"c{refs}" / "references")
        clean = b.measure(files, target="clean", refs=refs, out=root / f"c{refs}", design="offline")
        for name, cell in clean["attacks"].items():
            assert abs(cell["auc"] - 0.5) < 0.05, (refs, name, cell)
            assert cell["0.01"][1] <= 0.01 and cell["0.01"][0] < 0.04, (refs, name, cell)  # 1% of members, by chance
            assert cell["0.001"] is None  # 0.1% needs 10,000 non-members
        loss = memorized["attacks"]["loss"]
        assert loss["auc"] > 0.7
        for name in ("rmia", "lira_offline"):
            cell = memorized["attacks"][name]
            assert cell["auc"] > loss["auc"] + 0.03 and cell["0.01"][0] > 1.5 * loss["0.01"][0], (refs, name, cell)


@pytest.mark.slow
@pytest.mark.parametrize("fleet", [{"executor": "local", "workers": 2}, {"executor": "ray", "workers": 2}],
                         ids=["local-pool", "ray"])
def test_references_train_on_the_fleet(inputs, tmp_path, capsys, fleet):
    """The run's fleet code trains the references: a local pool of 2 processes, or Ray (a local
    instance) with fleet.executor: ray; both give the models the one-process run gives."""
    import yaml

    if fleet["executor"] == "ray":
        pytest.importorskip("ray")
    config = yaml.safe_load(Path(inputs["config"]).read_text())
    config["fleet"].update(fleet)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "audit"
    assert audit(inputs, out, "--reference-config", str(path), "--reference-design", "offline", "--attacks",
                 "loss,rmia", refs=2) in (0, 3)
    assert "2 local workers" in capsys.readouterr().err or fleet["executor"] == "ray"
    one = tmp_path / "one"
    assert audit(inputs, one, "--reference-design", "offline", "--attacks", "loss,rmia", refs=2) in (0, 3)
    capsys.readouterr()
    a = json.loads((out / "report.json").read_text())["models"][0]["attacks"]["rmia"]["auc"]
    b = json.loads((one / "report.json").read_text())["models"][0]["attacks"]["rmia"]["auc"]
    assert a == pytest.approx(b, abs=1e-6)  # the same seeds, the same models, wherever they trained


def test_architecture_and_base_model_are_one_choice(tmp_path):
    from dpaudit.config import load_config

    with pytest.raises(InputError, match="model.architecture and model.base_model both choose"):
        load_config("tiny", overrides=[f"model.architecture={tmp_path}", f"model.base_model={tmp_path}"])


def test_the_prompt_on_a_terminal(monkeypatch, capsys):
    import io
    import types

    from dpaudit.cli.commands import _ask_references

    estimate = types.SimpleNamespace(smaller=4)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert _ask_references(estimate, 8) == 8
    monkeypatch.setattr("sys.stdin", io.StringIO("12\n3\n"))  # more than asked for: asked again
    assert _ask_references(estimate, 8) == 3
    monkeypatch.setattr("sys.stdin", io.StringIO("q\n"))
    assert _ask_references(estimate, 8) is None
    captured = capsys.readouterr()
    assert captured.out == "" and "train 8 reference models? [Enter: 8, a smaller number (e.g. 4), q: stop]" in captured.err
