"""`dpaudit run`, `attack`, `report` and `audit-model` end to end on the tiny preset."""

import json

import numpy as np
import pytest

from dpaudit.cli import main

ATTACKS = {"loss", "zlib", "min_k", "min_k_pp", "reference", "lira_online", "lira_offline", "rmia"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    sets = ["fleet.num_models=4", "data.holdout_fraction=0.75", "canaries.repetitions=2"]
    code = main(["run", "--config", "tiny", "--out", str(out), *(a for s in sets for a in ("--set", s)), "--json"])
    assert code == 0
    return out


def test_run_writes_results_for_every_attack(tiny_run):
    assert {p.stem for p in (tiny_run / "results").glob("*.json")} == ATTACKS
    result = json.loads((tiny_run / "results" / "loss.json").read_text())
    assert set(result["splits"]) == {"members", "canaries"}
    canaries = result["splits"]["canaries"]
    assert {"one_run", "one_run_fdp", "gdp"} <= set(canaries["epsilon_lower_bounds"])
    assert canaries["tpr_at_fpr"]["0.01"] is None  # 8 excluded canaries are far too few for 1% FPR
    arrays = np.load(tiny_run / "results" / "loss.npz")
    assert arrays["members_scores"].shape == arrays["members_labels"].shape
    assert (tiny_run / "fleet" / "keep.npz").is_file()
    assert len(list((tiny_run / "signals").glob("*.npz"))) == 5  # target and four reference models
    extraction = json.loads((tiny_run / "extraction.json").read_text())
    assert extraction["included_total"] + extraction["excluded_total"] == 16


def test_fleet_is_trained_like_the_target(tiny_run):
    """A quarter of the patients are members and half of the canaries, each twice: so is it
    for every reference model."""
    keep = np.load(tiny_run / "fleet" / "keep.npz")["keep"]
    n_records = len((tiny_run / "candidates.jsonl").read_text().splitlines())
    assert keep.shape == (4, n_records + 16)
    assert (keep[:, :n_records].sum(axis=0) == 1).all()
    assert (keep[:, n_records:].sum(axis=0) == 2).all()
    for j in range(4):
        job = json.loads((tiny_run / "fleet" / f"model-{j:03d}" / "fleet_job.json").read_text())
        assert job["num_rows"] == keep[j, :n_records].sum() + 2 * keep[j, n_records:].sum()


def test_report_is_complete_and_hides_texts(tiny_run):
    report = json.loads((tiny_run / "report.json").read_text())
    assert report["schema_version"] == 1
    assert set(report["attacks"]) == ATTACKS
    assert report["verdict"] is None  # non-private: nothing to be consistent with
    # each record is in one of the four reference models, each canary in two
    assert report["fleet"] == {"num_models": 4, "in_per_text_min": 1, "out_per_text_min": 2}
    assert any(w.startswith("lira_online: some texts have only 1 reference model") for w in report["warnings"])
    html = (tiny_run / "report.html").read_text()
    canary = json.loads((tiny_run / "canaries.json").read_text())["canaries"][0]
    assert canary["id"] in html and canary["text"] not in html
    assert "http://" not in html and "https://" not in html


def test_attack_subset_and_report_rebuild(tiny_run, capsys):
    assert main(["attack", str(tiny_run), "--attacks", "loss,min_k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["attacks"]) == {"loss", "min_k"}
    assert main(["report", str(tiny_run), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "warning: lira_online: some texts have only 1 reference model" in captured.err
    assert set(report["attacks"]) == ATTACKS
    assert main(["attack", str(tiny_run), "--attacks", "nonsense"]) == 2


def test_attack_stage_follows_the_runs_attack_config(tiny_run, tmp_path, capsys):
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    config = yaml.safe_load((run / "config.resolved.yaml").read_text())
    config["attack"].update(attacks=["loss", "lira_offline"], params={"lira_offline": {"variance": "per_example"}})
    (run / "config.resolved.yaml").write_text(yaml.safe_dump(config))
    assert main(["attack", str(run), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["attacks"]) == {"loss", "lira_offline"}
    result = json.loads((run / "results" / "lira_offline.json").read_text())
    assert result["params"] == {"variance": "per_example"}
    fixed = np.load(tiny_run / "results" / "lira_offline.npz")["members_scores"]
    assert not np.allclose(np.load(run / "results" / "lira_offline.npz")["members_scores"], fixed)


def test_audit_model_with_reference(tiny_run, tmp_path, capsys):
    rows = [json.loads(line) for line in (tiny_run / "candidates.jsonl").read_text().splitlines()]
    members = tmp_path / "members.jsonl"
    members.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows if r["role"] == "member"))
    nonmembers = tmp_path / "nonmembers.txt"
    nonmembers.write_text("".join(r["text"].replace("\n", " ") + "\n" for r in rows if r["role"] == "heldout"))
    out = tmp_path / "audit"
    code = main(["audit-model", str(tiny_run / "model"), "--members", str(members), "--nonmembers", str(nonmembers),
                 "--reference-model", str(tiny_run / "fleet" / "model-000"), "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert {"loss", "zlib", "min_k", "min_k_pp", "reference", "lira_offline", "rmia"} <= set(result["attacks"])
    assert "lira_online" not in result["attacks"]  # needs reference models trained on the members
    for metrics in result["attacks"].values():
        assert 0.0 <= metrics["auc"] <= 1.0
        assert set(metrics["tpr_at_fpr"]) == {"0.1", "0.01", "0.001"}
    assert (out / "report.html").is_file() and (out / "report.json").is_file()
    first_member = rows[0]["text"] if rows[0]["role"] == "member" else next(r["text"] for r in rows if r["role"] == "member")
    assert first_member not in (out / "report.html").read_text()


def test_audit_model_bad_input(tiny_run, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    members = tmp_path / "m.txt"
    members.write_text("one text\n")
    assert main(["audit-model", str(tmp_path), "--members", str(members), "--nonmembers", str(members)]) == 2
    assert main(["audit-model", str(tiny_run / "model"), "--members", str(empty), "--nonmembers", str(members)]) == 2
    assert main(["audit-model", str(tiny_run / "model"), "--members", str(tmp_path / "missing.jsonl"),
                 "--nonmembers", str(members)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 3
