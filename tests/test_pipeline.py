"""The tiny sweep end to end: `dpaudit run`, resume after a kill, `attack`, `report`, `audit-model`."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dpaudit
from dpaudit.cli import main

pytestmark = pytest.mark.slow  # the long suite: python -m pytest -m slow (.ci/run runs it)

ATTACKS = {"loss", "zlib", "min_k", "min_k_pp", "reference", "lira_online", "lira_offline", "rmia"}
MODELS = ["nonprivate", "dp-eps2", "dp-eps8"]
SETS = ["fleet.num_models=4", "data.holdout_fraction=0.75", "canaries.repetitions=2", "audit.ladder.enabled=true",
        "audit.ladder.input_space_canaries=256", "audit.ladder.gradient_canaries=100000"]


def run_args(out):
    return ["run", "--config", "tiny", "--out", str(out), *(a for s in SETS for a in ("--set", s))]


THREADS = 2  # every training of this module, in-process and in the killed subprocess alike


@pytest.fixture(scope="module", autouse=True)
def _threads():
    """CPU training is bit-for-bit repeatable at a given thread count: pin it for the module
    (other tests may have changed torch's), and restore it after."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, _threads):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    code = main([*run_args(out), "--json"])
    assert code in (0, 3)  # the tiny DP models learn too little for a conclusive audit
    return out


def numbers(report):
    """Every number of a report, by path (timestamps and paths left out)."""
    skip = {"created", "manifest", "figures", "run_dir", "config", "cost_s"}  # cost_s: seconds
    out = {}

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                if k not in skip:
                    walk(v, f"{path}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out[path] = x

    walk(report, "")
    return out


def test_run_holds_every_model_with_every_attack(tiny_run):
    for name in MODELS:
        results = tiny_run / "models" / name / "results"
        assert {p.stem for p in results.glob("*.json")} == ATTACKS | {"index"}  # index: the stage is complete
        result = json.loads((results / "loss.json").read_text())
        assert set(result["splits"]) == {"members", "canaries"}
        canaries = result["splits"]["canaries"]
        assert {"one_run", "one_run_fdp", "gdp"} <= set(canaries["epsilon_lower_bounds"])
        assert canaries["tpr_at_fpr"]["0.01"] is None  # 8 excluded canaries are far too few for 1% FPR
        arrays = np.load(results / "loss.npz")
        assert arrays["members_scores"].shape == arrays["members_labels"].shape
        extraction = json.loads((tiny_run / "models" / name / "extraction.json").read_text())
        assert extraction["included_total"] + extraction["excluded_total"] == 16
        # the secret canaries are measured for exposure, and never enter the canary split of a bound
        assert canaries["num_in"] + canaries["num_out"] == 16
        assert len(extraction["canaries"]) == 4 and {g["repetitions"] for g in extraction["by_repetitions"]} == {0, 1, 4}
    assert len(list((tiny_run / "signals").glob("*.npz"))) == 4  # the fleet's, shared by every model


def test_fleet_is_trained_like_the_target(tiny_run):
    """A quarter of the private patients are members and half of the canaries, each twice:
    so is it for every reference model."""
    keep = np.load(tiny_run / "fleet" / "keep.npz")["keep"]
    n_records = len((tiny_run / "data" / "candidates.jsonl").read_text().splitlines())
    assert keep.shape == (4, n_records + 16)
    assert (keep[:, :n_records].sum(axis=0) == 1).all()
    assert (keep[:, n_records:].sum(axis=0) == 2).all()
    for j in range(4):
        job = json.loads((tiny_run / "fleet" / f"model-{j:03d}" / "fleet_job.json").read_text())
        assert job["num_rows"] == keep[j, :n_records].sum() + 2 * keep[j, n_records:].sum()


def test_report_has_a_model_entry_per_model(tiny_run):
    report = json.loads((tiny_run / "report.json").read_text())
    assert report["schema_version"] == 2
    assert [m["name"] for m in report["models"]] == MODELS
    for m in report["models"]:
        assert {"name", "dp", "utility", "attacks", "audit", "extraction", "verdict"} <= set(m)
        assert set(m["attacks"]) == ATTACKS
        assert {"enabled", "noise_multiplier", "sample_rate", "steps", "max_grad_norm", "unit", "delta", "epsilon",
                "accountant"} <= set(m["dp"])
        assert {"epsilon_lower_bound", "method", "significance", "num_canaries", "num_guesses", "num_correct",
                "ceiling"} <= set(m["audit"])
        assert m["utility"]["heldout_perplexity"] > 1
    by_name = {m["name"]: m for m in report["models"]}
    assert by_name["nonprivate"]["dp"]["enabled"] is False and by_name["nonprivate"]["dp"]["epsilon"] is None
    assert by_name["nonprivate"]["verdict"]["status"] == "no_claim"
    for name, eps in (("dp-eps2", 2.0), ("dp-eps8", 8.0)):
        assert by_name[name]["dp"]["epsilon"] == pytest.approx(eps, rel=1e-3)
        # canaries repeated twice: the released canaries are held to the group's epsilon (4.7, 18.9),
        # the twin's rungs (single canaries, trained at the per-unit claim) to the per-unit one, which
        # the white-box rung's 10^5 gradient canaries can test: consistent
        verdict = by_name[name]["verdict"]
        assert verdict["status"] == "consistent" and verdict["claimed_epsilon"] == pytest.approx(eps, rel=1e-3)
        assert verdict["attack"] == "white_box" and by_name[name]["audit"]["ceiling"] > verdict["claimed_epsilon"]
        # secret canaries by repetition count, each inserted group with its guarantee (a group at note level)
        groups = {g["repetitions"]: g for g in by_name[name]["extraction"]["secrets"]["groups"]}
        assert groups[0]["epsilon"] is None and groups[1]["epsilon"] == pytest.approx(eps, rel=1e-3)
        assert groups[4]["epsilon"] > eps
    assert (tiny_run / "figures" / "secrets.png").is_file() and (tiny_run / "tables" / "secret_canaries.csv").is_file()
    html = (tiny_run / "report.html").read_text()
    canary = json.loads((tiny_run / "data" / "canaries.json").read_text())["canaries"][0]
    assert canary["text"] not in html  # member texts stay out of the report unless asked for
    assert canary["id"] in (tiny_run / "tables" / "canaries.csv").read_text()
    assert "<script" not in html and 'src="http' not in html


def test_every_dp_model_has_its_ladder(tiny_run):
    """The three rungs of each DP model, in order; the twins are a run of their own, their
    vocabulary grown by their canaries' tokens alone; the white-box rung at the claimed noise stays below the claim and sees most of its ideal."""
    from dpaudit.accounting import read_record

    report = {m["name"]: m for m in json.loads((tiny_run / "report.json").read_text())["models"]}
    assert report["nonprivate"]["rungs"] == [] and not (tiny_run / "models" / "nonprivate" / "ladder.json").exists()
    for name in MODELS[1:]:
        rungs = {r["rung"]: r for r in json.loads((tiny_run / "models" / name / "ladder.json").read_text())["rungs"]}
        assert list(rungs) == ["released", "input_space", "white_box"] and not any(r["refused"] for r in rungs.values())
        assert rungs["released"]["num_canaries"] == 16 and rungs["input_space"]["num_canaries"] == 256
        record = read_record(tiny_run / "models" / name / "dp_event.json")
        white = rungs["white_box"]
        assert white["num_canaries"] == 100_000 and white["regime"]["sample_rate"] == 1.0
        # the twin keeps the claim (its noise calibrated to it, never above it)
        assert record.epsilon() * (1 - 1e-3) < white["regime"]["epsilon"] <= record.epsilon()
        assert 0.5 * white["ideal"] < white["epsilon"] < white["regime"]["epsilon"]
        assert white["confidence"] == pytest.approx(1 - 0.05 / 3)  # three rungs share the significance
        twin = tiny_run / "ladder" / "run" / "models" / name
        assert (twin / "gradient_canaries.npz").is_file() and (twin / "dp_event.json").is_file()
        assert [r["rung"] for r in report[name]["rungs"]] == list(rungs)
    # the twins' canary set holds just the tokens of their 256 canaries, and so does their vocabulary
    assert "pool_size: 512" in (tiny_run / "ladder" / "canaries.yaml").read_text()
    vocab = {d: json.loads((tiny_run / d / "config.json").read_text())["vocab_size"] for d in ("base", "ladder/base")}
    assert vocab["base"] <= vocab["ladder/base"] <= vocab["base"] + 512
    html = (tiny_run / "report.html").read_text()
    assert html.index('id="ladder"') < html.index('id="summary"')


def test_interrupted_run_resumes_to_the_same_report(tiny_run, tmp_path):
    """Kill a run after its first model is in place; the rerun reuses it and ends with the
    same numbers as the uninterrupted run."""
    out = tmp_path / "tiny"
    # same thread count as the uninterrupted run: CPU training is bit-for-bit repeatable at a given count
    proc = subprocess.Popen([sys.executable, "-m", "dpaudit", *run_args(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
    first = out / "models" / MODELS[0] / "model" / "config.json"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.exists() and not (out / "report.json").exists()
    stamp = first.stat().st_mtime_ns
    assert main(run_args(out)) in (0, 3)
    assert first.stat().st_mtime_ns == stamp  # the finished model was reused, not retrained
    resumed = json.loads((out / "report.json").read_text())
    assert numbers(resumed) == numbers(json.loads((tiny_run / "report.json").read_text()))


def test_run_api_and_force(tiny_run, tmp_path):
    from dpaudit.config import load_config

    config = load_config("tiny", overrides=SETS)
    result = dpaudit.run(config, out=tiny_run)  # everything in place: nothing is retrained
    assert result.ok and [m["name"] for m in result.report["models"]] == MODELS


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "side-by-side"])
def test_a_failing_model_fails_alone(tmp_path, capsys, workers):
    out = tmp_path / "run"
    code = main(["run", "--config", "tiny", "--out", str(out), "--set", f"fleet.workers={workers}",
                 "--set", "fleet.num_models=2", "--set",
                 "models=[{name: ok}, {name: bad, train: {trainer: 'dpaudit.train:dpsgd', batch_size: 100000, "
                 "dp: {noise_multiplier: 1.0}}}]", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 4
    by_name = {m["name"]: m for m in report["models"]}
    assert "sampling rate" in by_name["bad"]["error"]  # found when the model trains: it fails alone
    assert by_name["ok"]["error"] is None and by_name["ok"]["attacks"]
    log = (out / "run.log").read_text(encoding="utf-8")
    # side by side: one pool for both models, failed or not, and the two reference models
    assert ("models: model 4/4" in log) == (workers == 2)
    assert ("fleet: model 2/2" in log) == (workers == 1)  # else the fleet stage found them trained


def test_attack_subset_and_report_rebuild(tiny_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert main(["attack", str(run), "--attacks", "loss,min_k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["models"]["dp-eps2"]) == {"loss", "min_k"}
    assert main(["report", str(run), "--json"]) in (0, 3)
    report = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in report["models"]] == MODELS
    assert main(["attack", str(run), "--attacks", "nonsense"]) == 2


def test_audit_model_with_reference(tiny_run, tmp_path, capsys):
    rows = [json.loads(line) for line in (tiny_run / "data" / "candidates.jsonl").read_text().splitlines()]
    members = tmp_path / "members.jsonl"
    members.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows if r["role"] == "member"))
    nonmembers = tmp_path / "nonmembers.txt"
    nonmembers.write_text("".join(r["text"].replace("\n", " ") + "\n" for r in rows if r["role"] == "heldout"))
    out = tmp_path / "audit"
    code = main(["audit-model", str(tiny_run / "models" / "nonprivate" / "model"), "--members", str(members),
                 "--nonmembers", str(nonmembers), "--reference-model", str(tiny_run / "fleet" / "model-000"),
                 "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    (model,) = result["models"]
    assert {"loss", "zlib", "min_k", "min_k_pp", "reference", "lira_offline", "rmia"} <= set(model["attacks"])
    assert "lira_online" not in model["attacks"]  # needs reference models trained on the members
    for metrics in model["attacks"].values():
        assert 0.0 <= metrics["auc"] <= 1.0
        assert set(metrics["tpr_at_fpr"]) == {"0.1", "0.01", "0.001"}
    assert model["dp"]["enabled"] is None  # someone else's model: its privacy is unknown
    assert (out / "report.html").is_file() and (out / "report.json").is_file()
    first_member = next(r["text"] for r in rows if r["role"] == "member")
    assert first_member not in (out / "report.html").read_text()


def test_audit_model_bad_input(tiny_run, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    members = tmp_path / "m.txt"
    members.write_text("one text\n")
    model = tiny_run / "models" / "nonprivate" / "model"
    assert main(["audit-model", str(tmp_path), "--members", str(members), "--nonmembers", str(members)]) == 2
    assert main(["audit-model", str(model), "--members", str(empty), "--nonmembers", str(members)]) == 2
    assert main(["audit-model", str(model), "--members", str(tmp_path / "missing.jsonl"),
                 "--nonmembers", str(members)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 3
