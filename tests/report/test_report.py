"""The report stage: report.json schema (v2), verdicts per model, HTML safety, figures.

Built on small synthetic run directories written through the RunDir / ModelDir writers:
no training.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil

import numpy as np
import pytest

from dpaudit.accounting import event_to_dict, make_event
from dpaudit.audit import CanaryScores
from dpaudit.audit.ladder import RUNGS, Rung
from dpaudit.errors import InputError
from dpaudit.report import SCHEMA_VERSION, build_report
from dpaudit.stages.artifacts import write_ladder, write_manifest
from dpaudit.stages.report import read_snapshot
from dpaudit.report.data import DP_KEYS, MODEL_KEYS
from dpaudit.rundir import RunDir, write_json_atomic, write_jsonl_atomic

pytestmark = pytest.mark.slow  # the long suite: python -m pytest -m slow (.ci/run runs it)

TEXT_MARKER = "PATIENTNOTE_7731"
MALICIOUS = f"<script>alert(1)</script> {TEXT_MARKER} was admitted"
WEIRD_ID = "c&0<b>"
DELTA = 1e-3
M = 40  # canaries


def _bound(method, *, eps, sound, sig, correct=None):
    return {"method": method, "sound": sound, "epsilon": eps, "delta": DELTA, "significance": sig,
            "num_canaries": M, "num_guesses": 20 if correct is not None else None, "num_correct": correct,
            "strategy": {"name": "bonferroni", "grid": None}, "details": {"mu": 0.5} if not sound else {}}


def _write_results(md, rng, *, shift, bound_eps):
    attacks = ("loss", "zlib")
    sig = 0.05 / len(attacks)
    for name, b in zip(attacks, bound_eps):
        ms = np.r_[rng.normal(shift, 1, 150), rng.normal(0, 1, 150)]
        ml = np.r_[np.ones(150, bool), np.zeros(150, bool)]
        cs = np.r_[rng.normal(shift * 2, 1, M // 2), rng.normal(0, 1, M // 2)]
        cl = np.r_[np.ones(M // 2, bool), np.zeros(M // 2, bool)]
        members = {"auc": 0.6, "auc_ci": [0.5, 0.7], "tpr_at_fpr": {"0.1": 0.2, "0.01": 0.0, "0.001": None},
                   "balanced_accuracy": 0.55, "num_in": 150, "num_out": 150}
        canaries = {"auc": 0.7, "auc_ci": [0.5, 0.9], "tpr_at_fpr": {"0.1": None, "0.01": None, "0.001": None},
                    "balanced_accuracy": 0.6, "num_in": M // 2, "num_out": M // 2,
                    "epsilon_lower_bounds": {
                        "one_run": _bound("one_run", eps=b, sound=True, sig=sig, correct=18),
                        "gdp": _bound("gdp", eps=b * 3 + 1, sound=False, sig=sig)}}
        md.write_results(name, params={}, splits={"members": (ms, ml, members), "canaries": (cs, cl, canaries)})


def _dp_record(*, private, unit="example"):
    if not private:
        return {"schema_version": 1, "trainer": "dpaudit.train:nonprivate", "event": {"type": "non_private"},
                "accountant": None, "delta": None, "epsilon": None, "unit": unit, "num_units": 100,
                "sample_rate": None, "steps": 10, "noise_multiplier": None, "max_grad_norm": None,
                "expected_batch_size": 8, "sampler": "shuffle"}
    event = event_to_dict(make_event(noise_multiplier=1.0, sample_rate=0.08, steps=10))
    return {"schema_version": 1, "trainer": "dpaudit.train:dpsgd", "event": event, "accountant": "pld",
            "delta": DELTA, "epsilon": 123.0,  # a wrong logged value: the report must recompute
            "unit": unit, "num_units": 100, "sample_rate": 0.08, "steps": 10, "noise_multiplier": 1.0,
            "max_grad_norm": 1.0, "expected_batch_size": 8, "sampler": "poisson"}


def _train_log(md, *, learned=True):
    write_jsonl_atomic(md.train_log_path, [  # learned: the loss on the training rows fell by >= 1%
        {"step": 0, "train_eval_loss": 5.0, "heldout_loss": 5.0, "heldout_perplexity": math.exp(5.0)},
        {"step": 5, "train_loss": 4.5},
        {"step": 10, "train_loss": 4.0, "train_eval_loss": 4.0 if learned else 4.98,
         "heldout_loss": 4.2 if learned else 5.1, "heldout_perplexity": math.exp(4.2 if learned else 5.1)},
    ])


def _canary_file(run):
    canaries = [{"id": WEIRD_ID if i == 0 else f"c{i}", "kind": "digits",
                 "text": MALICIOUS if i == 0 else f"note {TEXT_MARKER} {i}", "prefix": "<b>Patient",
                 "secret": "7&3<1>" if i == 0 else f"SECRET-{i:04d}", "included": i % 2 == 0, "repetitions": 1}
                for i in range(M)]
    write_json_atomic(run.data_dir / "canaries.json", {"schema_version": 1, "spec": {"name": "digits"},
                                                       "secret_space_size": "1000000", "canaries": canaries})
    return canaries


def rung(name, *, shift=2.0, ideal=2.0, refused=None, m=60, seed=0):
    """A rung whose bound is a real one-run bound of m canaries, the members' scores shifted
    by ``shift`` (m = 60 at delta 1e-3: 2.0 gives about 0.4, 8.0 about 1.6, above dp4's 1.26);
    a refused one has no bound."""
    if refused is not None:
        return Rung(rung=name, bound=None, attack=None, significance=None, ideal=ideal, ideal_range=None,
                    num_canaries=m, regime={}, refused=refused)
    rng = np.random.default_rng(seed)
    scores = CanaryScores(in_scores=rng.normal(shift, 1, m // 2), out_scores=rng.normal(0, 1, m // 2), seed=0)
    bound = scores.bound("one_run", delta=DELTA, significance=0.05)  # one of two tests: the rung holds at 0.1
    return Rung(rung=name, bound=bound, attack="loss", significance=0.1, ideal=ideal,
                ideal_range=(0.9 * ideal, 1.1 * ideal), num_canaries=m,
                regime={"noise_multiplier": 1.0, "sample_rate": 0.08, "steps": 10}, cost_s=2.5)


def make_run(root, *overrides, ladders=None):
    """A run of four models; ``ladders`` maps a model to the rungs written as its ladder.json."""
    from dpaudit.config import load_config

    run = RunDir(root / "run")
    names = ["nonprivate", "dp4", "dp4-patient", "broken"]
    config = load_config("tiny", overrides=["models=[" + ", ".join(f"{{name: {n}}}" for n in names) + "]",
                                            *overrides])
    run.root.mkdir(parents=True)
    run.write_config(config)
    write_manifest(run, seeds={"run": 0})
    canaries = _canary_file(run)
    rng = np.random.default_rng(0)
    for name, private, unit, bounds in (("nonprivate", False, "example", (2.5, 1.0)),
                                        ("dp4", True, "example", (0.5, 0.2)),
                                        ("dp4-patient", True, "user", (0.3, 0.1))):
        md = run.model(name)
        write_json_atomic(md.dp_event_path, _dp_record(private=private, unit=unit))
        _train_log(md)
        _write_results(md, rng, shift=1.0, bound_eps=bounds)
        ext = {"method": "greedy", "included_extracted": 3, "included_total": M // 2, "excluded_extracted": 0,
               "excluded_total": M // 2,
               "canaries": {c["id"]: {"extracted": i < 3, "generated": MALICIOUS} for i, c in enumerate(canaries)}}
        if name != "nonprivate":
            ext["patient_secrets"] = {"field": "mrn", "groups": [
                {"notes": k, "member_patients": 5, "member_mean_logprob": -3.0 - k, "heldout_mean_logprob": -6.0,
                 "member_extracted": 0.1 * k, "heldout_extracted": 0.0} for k in (1, 2, 4)]}
        md.write_extraction(ext)
    broken = run.model("broken")
    broken.root.mkdir(parents=True)
    broken.write_error(stage="train", error=RuntimeError("CUDA out of memory <b>boom</b>"))
    for name, rungs in (ladders or {}).items():
        write_ladder(run.model(name), rungs)
    return run


def make_audit_model(root):
    run = RunDir(root / "audit")
    run.root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    s = np.r_[rng.normal(1, 1, 50), rng.normal(0, 1, 50)]
    y = np.r_[np.ones(50, bool), np.zeros(50, bool)]
    metrics = {"auc": 0.7, "auc_ci": [0.6, 0.8], "tpr_at_fpr": {"0.1": 0.3, "0.01": None, "0.001": None},
               "balanced_accuracy": 0.6, "num_in": 50, "num_out": 50}
    run.model("released").write_results("loss", params={}, splits={"members": (s, y, metrics)})
    run.write_audit_inputs({"model": "/models/released", "members": {"count": 50}, "nonmembers": {"count": 50}})
    write_manifest(run, seeds={})
    return run


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("r"))
    report = build_report(run.root)
    return run, report, run.report_html.read_text()


def _model(report, name):
    return next(m for m in report["models"] if m["name"] == name)


# --------------------------------------------------------------------------- schema


def test_report_json_schema(built):
    run, report, _ = built
    assert run.read_report() == report
    assert report["schema_version"] == SCHEMA_VERSION == 2
    for key in ("dpaudit_version", "title", "kind", "models", "fleet", "canaries", "config", "manifest",
                "figures", "tables", "warnings"):
        assert key in report, key
    assert report["kind"] == "run"
    assert [m["name"] for m in report["models"]] == ["nonprivate", "dp4", "dp4-patient", "broken"]
    assert isinstance(report["warnings"], list) and all(isinstance(w, str) for w in report["warnings"])
    assert report["canaries"]["count"] == M and report["canaries"]["included"] == M // 2
    assert report["canaries"]["repetitions"] == 1
    for m in report["models"]:
        assert set(MODEL_KEYS) <= set(m), m["name"]
        assert set(DP_KEYS) <= set(m["dp"])
        assert m["dp"]["enabled"] in (True, False, None)
        assert set(m["utility"]) >= {"heldout_perplexity", "initial_heldout_perplexity", "learned"}
        assert set(m["audit"]) >= {"epsilon_lower_bound", "method", "attack", "significance", "num_canaries",
                                   "num_guesses", "num_correct", "ceiling", "estimates"}
        assert m["verdict"]["status"] in ("violated", "consistent", "inconclusive", "no_claim")
        assert isinstance(m["verdict"]["reason"], str)
        for key in ("attacks", "canary_attacks"):
            for a in m[key].values():
                assert set(a["tpr_at_fpr"]) == {"0.1", "0.01", "0.001"}
                assert isinstance(a["auc"], float)


def test_dp_model_recomputes_epsilon_and_gets_a_verdict(built):
    from dpaudit.accounting import epsilon_from_record

    _, report, _ = built
    m = _model(report, "dp4")
    expected = epsilon_from_record(_dp_record(private=True))
    assert m["privacy"] == "dp" and m["dp"]["enabled"] is True
    assert m["dp"]["epsilon"] == pytest.approx(expected) and m["dp"]["epsilon"] != 123.0
    assert any("dp4:" in w and "differs" in w for w in report["warnings"])
    assert m["utility"]["learned"] is True
    assert m["utility"]["initial_heldout_perplexity"] == pytest.approx(math.exp(5.0))
    # best sound bound: the larger one_run bound; gdp (not sound) only among the estimates
    assert m["audit"]["epsilon_lower_bound"] == 0.5 and m["audit"]["method"] == "one_run"
    assert m["audit"]["attack"] == "loss" and m["audit"]["significance"] == pytest.approx(0.05)
    assert m["audit"]["estimates"] == {"loss/gdp": 2.5, "zlib/gdp": pytest.approx(1.6)}
    assert m["audit"]["ceiling"] is not None and m["audit"]["ceiling"] > 0
    assert m["verdict"]["status"] in ("consistent", "inconclusive")
    assert m["verdict"]["claimed_epsilon"] == pytest.approx(expected)
    assert m["canary_attacks"]["loss"]["bounds"]["gdp"]["sound"] is False
    assert m["extraction"]["included_rate"] == pytest.approx(3 / (M // 2))
    assert m["extraction"]["patient_secrets"]["field"] == "mrn"
    assert _model(report, "dp4-patient")["dp"]["unit"] == "user"
    assert 0 < m["dp"]["last_iterate_epsilon"] < m["dp"]["epsilon"]  # the final model shows less
    assert _model(report, "nonprivate")["dp"]["last_iterate_epsilon"] is None


def test_each_patient_gets_the_guarantee_of_their_number_of_notes(built):
    from dpaudit.accounting import group_epsilon

    _, report, html = built
    note, patient = _model(report, "dp4"), _model(report, "dp4-patient")
    by_k = {g["notes"]: g["epsilon"] for g in note["extraction"]["patient_secrets"]["groups"]}
    args = {k: note["dp"][k] for k in ("noise_multiplier", "sample_rate", "steps", "delta")}
    assert by_k[1] == note["dp"]["epsilon"]
    assert by_k[2] == pytest.approx(group_epsilon(**args, group_size=2))
    assert by_k[1] < by_k[2] < by_k[4]  # note level: a many-note patient is exposed
    assert {g["epsilon"] for g in patient["extraction"]["patient_secrets"]["groups"]} == {patient["dp"]["epsilon"]}
    assert f"{by_k[4]:.2f}" in html.split('id="units"')[1]


def test_tpr_withheld_rather_than_zero(built):
    _, report, html = built
    t = _model(report, "dp4")["attacks"]["loss"]["tpr_at_fpr"]
    assert t["0.1"] == 0.2
    assert t["0.01"] is None  # 150 non-members < 10 / 0.01: the stage's 0.0 is withheld
    assert "not enough non-members" in html or "n/e" in html


def test_non_private_model_is_no_claim(built):
    _, report, _ = built
    m = _model(report, "nonprivate")
    assert m["privacy"] == "non_private" and m["dp"]["enabled"] is False
    assert m["dp"]["epsilon"] is None
    assert m["verdict"]["status"] == "no_claim"
    assert m["audit"]["epsilon_lower_bound"] == 2.5  # still reported, for scale


def test_failed_model_appears_with_its_error(built):
    _, report, html = built
    m = _model(report, "broken")
    assert "CUDA out of memory" in m["error"]
    assert m["privacy"] == "unknown"
    assert "CUDA out of memory &lt;b&gt;boom&lt;/b&gt;" in html


def test_tables_and_figures_written(built):
    run, report, html = built
    for stem in ("compliance", "utility", "membership", "extraction", "patient_secrets", "roc"):
        assert stem in report["figures"], stem
        for fmt in ("png", "pdf"):
            assert (run.root / report["figures"][stem][fmt]).is_file()
    for stem in ("models", "attacks", "bounds", "canaries", "extraction", "patient_secrets"):
        assert (run.root / report["tables"][stem]).is_file()
    rows = list(csv.DictReader((run.tables_dir / "canaries.csv").open()))
    assert len(rows) == M and "text" not in rows[0]
    # per-row data is not inlined in the HTML
    assert "SECRET-0017" not in html and "SECRET-0017" in (run.tables_dir / "canaries.csv").read_text()


# --------------------------------------------------------------------------- HTML safety and privacy


def test_html_is_self_contained_and_escaped(built):
    run, _, html = built
    assert "<script" not in html.lower()
    assert "<link" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert TEXT_MARKER not in html
    assert TEXT_MARKER not in run.report_json.read_text()
    assert TEXT_MARKER not in (run.tables_dir / "extraction.csv").read_text()
    for img in re.findall(r"<img [^>]*>", html):
        assert 'src="data:image/png;base64,' in img
    # sections in the required order: the ladder (with the compliance figure) leads, then the summary
    # and the warnings
    order = [html.index(f'id="{s}"') for s in ("ladder", "summary", "warnings", "verdicts", "utility",
                                                "membership", "extraction", "units", "checklist", "roc",
                                                "estimates")]
    assert order == sorted(order)
    assert "not sound bounds" in html


def test_include_texts_puts_texts_in_tables_escaped(built, tmp_path):
    run, _, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(run.root, copy)
    report = build_report(copy, include_texts=True, title="<i>t</i>")
    html = (copy / "report.html").read_text()
    assert report["include_texts"] is True and report["canaries"]["texts_included"] is True
    assert "<script" not in html.lower() and "<i>t</i>" not in html and "&lt;i&gt;t&lt;/i&gt;" in html
    text = (copy / "tables" / "canaries.csv").read_text()
    assert TEXT_MARKER in text and "<script>alert(1)</script>" in text  # CSV is data, not HTML
    assert TEXT_MARKER in (copy / "tables" / "extraction.csv").read_text()


# --------------------------------------------------------------------------- audit-model outputs


def test_audit_model_output_has_unknown_privacy(tmp_path):
    run = make_audit_model(tmp_path)
    report = build_report(run)
    assert report["kind"] == "audit-model"
    (m,) = report["models"]
    assert m["name"] == "released" and m["privacy"] == "unknown" and m["dp"]["enabled"] is None
    assert m["verdict"]["status"] == "no_claim"
    assert "compliance" not in report["figures"]
    html = run.report_html.read_text()
    assert "No compliance plot" in html and "unknown" in html
    assert "trained without DP" not in html


def test_not_a_run_directory(tmp_path):
    with pytest.raises(InputError):
        build_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError):
        build_report(tmp_path / "empty")


def test_unlearned_model_is_inconclusive(tmp_path):
    from dpaudit.report.data import assemble

    run = make_run(tmp_path)
    _train_log(run.model("dp4"), learned=False)
    m = _model(assemble(read_snapshot(run)).report, "dp4")
    assert m["utility"]["learned"] is False and m["utility"]["fit_training_rows"] is False
    assert m["verdict"]["status"] == "inconclusive"


def test_learned_is_judged_on_held_out_records(tmp_path):
    """Issue 29: a fine-tune that fit its training rows (the canaries dominate their loss) but
    got worse on held-out records did not learn; the verdict's gate reads the fit, apart."""
    from dpaudit.report.data import assemble

    run = make_run(tmp_path)
    write_jsonl_atomic(run.model("dp4").train_log_path, [
        {"step": 0, "train_eval_loss": 5.0, "heldout_loss": 1.72, "heldout_perplexity": math.exp(1.72)},
        {"step": 10, "train_loss": 4.0, "train_eval_loss": 4.0, "heldout_loss": 1.745,
         "heldout_perplexity": math.exp(1.745)}])
    m = _model(assemble(read_snapshot(run)).report, "dp4")
    assert m["utility"]["learned"] is False and m["utility"]["fit_training_rows"] is True
    assert m["verdict"]["status"] != "inconclusive" or "learn" not in m["verdict"]["reason"]


def test_learned_is_unknown_when_only_the_embedding_trains(tmp_path):
    """With model.trainable: input_embeddings the records' loss cannot show learning: unknown,
    not "no", and no warning about a missing step-0 record."""
    from dpaudit.report.data import assemble

    run = make_run(tmp_path, "model.trainable=input_embeddings")
    _train_log(run.model("dp4"), learned=False)
    m = _model(assemble(read_snapshot(run)).report, "dp4")
    assert m["utility"]["learned"] is None
    assert not any("step-0" in w for w in m["warnings"])


def test_violation_is_reported(tmp_path):
    from dpaudit.report.data import assemble

    run = make_run(tmp_path)
    md = run.model("dp4")
    shutil.rmtree(md.results_dir)
    _write_results(md, np.random.default_rng(3), shift=3.0, bound_eps=(50.0, 0.1))
    m = _model(assemble(read_snapshot(run)).report, "dp4")
    assert m["verdict"]["status"] == "violated"
    assert m["audit"]["epsilon_lower_bound"] == 50.0


@pytest.mark.parametrize("repetitions", [1, 4])
def test_repeated_canaries_at_note_level_are_held_to_the_group_epsilon(tmp_path, repetitions):
    """A correct trainer whose canaries are repeated r = 4 times at note level: the audit
    measures a group of 4 notes, so a bound above the per-note epsilon but below the group's
    is no violation; with r = 1 the same bound is one."""
    from dpaudit.accounting import epsilon, group_epsilon
    from dpaudit.report.data import assemble

    common = dict(noise_multiplier=1.0, sample_rate=0.08, steps=10, delta=DELTA)
    per_note, group = epsilon(**common), group_epsilon(**common, group_size=4)
    run = make_run(tmp_path)
    data = json.loads((run.data_dir / "canaries.json").read_text())
    for c in data["canaries"]:
        c["repetitions"] = repetitions
    write_json_atomic(run.data_dir / "canaries.json", data)
    md = run.model("dp4")
    shutil.rmtree(md.results_dir)
    _write_results(md, np.random.default_rng(3), shift=3.0, bound_eps=((per_note + group) / 2, 0.1))
    m = _model(assemble(read_snapshot(run)).report, "dp4")
    assert (m["verdict"]["status"] == "violated") == (repetitions == 1)
    if repetitions == 4:
        assert m["dp"]["group_epsilon"] == pytest.approx(group)


# --------------------------------------------------------------------------- the threat-model ladder


def _claim_of_dp4():
    from dpaudit.accounting import epsilon

    return epsilon(noise_multiplier=1.0, sample_rate=0.08, steps=10, delta=DELTA)


def _assembled(tmp_path, ladders):
    from dpaudit.report.data import assemble

    return assemble(read_snapshot(make_run(tmp_path, ladders=ladders))).report


def test_rungs_are_in_report_json_in_ladder_order(tmp_path):
    written = [rung("white_box", shift=2.0), rung("released"), rung("input_space", refused="no twin")]
    report = _assembled(tmp_path, {"dp4": written})
    rungs = _model(report, "dp4")["rungs"]
    assert [r["rung"] for r in rungs] == list(RUNGS) == ["released", "input_space", "white_box"]
    released = rungs[0]
    assert released == {**written[1].to_dict(), "ceiling": pytest.approx(released["ceiling"])}
    assert released["ceiling"] > released["epsilon"]
    assert released["method"] == "one_run" and released["epsilon"] == written[1].epsilon
    assert released["confidence"] == pytest.approx(0.9) and released["num_canaries"] == 60
    assert released["ideal_range"] == [1.8, 2.2] and released["cost_s"] == 2.5
    assert released["regime"]["steps"] == 10 and released["refused"] is None
    assert rungs[1]["epsilon"] is None and rungs[1]["refused"] == "no twin"
    for name in ("nonprivate", "dp4-patient", "broken"):  # no ladder: an empty list
        assert _model(report, name)["rungs"] == []


def test_only_the_white_box_rung_exceeding_the_claim_is_a_violation(tmp_path):
    claim = _claim_of_dp4()
    white = rung("white_box", shift=8.0, ideal=3.0)
    assert white.epsilon > claim > 0.5  # the canary bounds (0.5, 0.2) and the other rungs stay below the claim
    report = _assembled(tmp_path, {"dp4": [rung("released"), rung("input_space", shift=2.0), white]})
    m = _model(report, "dp4")
    assert all(r["epsilon"] < claim for r in m["rungs"][:2])
    assert m["verdict"]["status"] == "violated"
    assert m["verdict"]["attack"] == "white_box" and m["verdict"]["epsilon_lower_bound"] == white.epsilon
    # the union bound: two canary tests at 0.025 each, then input-space and white-box at 0.1 each
    # (each rung at its own significance, not its best test's); the released rung's bound is the canaries'
    assert m["verdict"]["significance"] == pytest.approx(0.05 + 0.1 + 0.1)
    without = _model(_assembled(tmp_path / "without", {}), "dp4")
    assert without["verdict"]["status"] != "violated"


def test_inconclusive_or_consistent_follows_the_largest_rung_ceiling(tmp_path):
    claim = _claim_of_dp4()
    # the ceiling is every guess right on the rung's own m canaries, never its ideal
    low = [rung("released", ideal=0.6), rung("input_space", ideal=0.9, m=12), rung("white_box", ideal=3.0, m=16)]
    m = _model(_assembled(tmp_path / "low", {"dp4": low}), "dp4")
    assert m["verdict"]["status"] == "inconclusive"
    assert m["verdict"]["ceiling"] == m["audit"]["ceiling"] == m["rungs"][2]["ceiling"] < claim
    assert m["rungs"][1]["ceiling"] < m["rungs"][2]["ceiling"] and m["rungs"][2]["ideal"] == 3.0
    assert "strongest rung" in m["verdict"]["reason"]
    high = [*low[:2], rung("white_box", ideal=1.1, m=60)]
    m = _model(_assembled(tmp_path / "high", {"dp4": high}), "dp4")
    assert m["verdict"]["status"] == "consistent"
    assert m["verdict"]["ceiling"] == m["audit"]["ceiling"] == m["rungs"][2]["ceiling"] > claim


def test_a_rung_ceiling_is_its_best_test_s_at_that_test_s_significance(tmp_path):
    # each rung's best test ran at 0.05, its share of the rung's 0.1: every guess right at 0.05
    # is the most it could show (at 0.1 it would read higher: a test that never ran)
    from dpaudit.audit import one_run_ceiling

    ladder = [rung("released"), rung("input_space", m=12), rung("white_box", m=16)]
    m = _model(_assembled(tmp_path, {"dp4": ladder}), "dp4")
    for r, n in zip(m["rungs"], (60, 12, 16), strict=True):
        at = {s: one_run_ceiling(method="one_run", num_canaries=n, delta=DELTA, significance=s) for s in (0.05, 0.1)}
        assert r["ceiling"] == pytest.approx(at[0.05]) and at[0.05] < at[0.1]
    # the verdict's: the largest over the canary tests and the other rungs' tests, each as it ran
    assert m["verdict"]["ceiling"] == m["audit"]["ceiling"] == m["rungs"][2]["ceiling"]
    assert m["verdict"]["significance"] == pytest.approx(0.05 + 0.1 + 0.1)  # the union still counts each rung's 0.1


def test_a_refused_rung_does_not_enter_the_verdict(tmp_path):
    refused = rung("white_box", refused="canary <b>included</b> more often than the sampler's rate & so unsound",
                   ideal=50.0)
    ladder = [rung("released", ideal=0.6), rung("input_space", ideal=0.9, m=12), refused]
    run = make_run(tmp_path, ladders={"dp4": ladder})
    report = build_report(run.root)
    m = _model(report, "dp4")
    assert m["rungs"][2]["refused"].startswith("canary <b>included</b>") and m["rungs"][2]["epsilon"] is None
    assert m["verdict"]["status"] == "inconclusive" and m["verdict"]["ceiling"] == m["rungs"][1]["ceiling"] < 1
    assert m["rungs"][2]["ceiling"] is None
    assert m["verdict"]["significance"] == pytest.approx(0.05 + 0.1)  # the canaries and input-space only
    assert "run the white-box rung" in m["verdict"]["reason"]
    assert "compliance" in report["figures"]
    html = run.report_html.read_text()
    verdicts = html.split('id="verdicts"')[1].split("</section>")[0]
    assert "canary &lt;b&gt;included&lt;/b&gt; more often than the sampler&#39;s rate &amp; so unsound" in verdicts
    assert "<b>included</b>" not in html


def test_with_repeated_canaries_the_twin_rungs_keep_the_per_unit_claim(tmp_path):
    """Canaries repeated r = 4 times at note level: the released canaries are held to the
    group's epsilon, and the twin's rungs (single canaries, the twin trained at the per-unit
    claim) to the per-unit epsilon; either violation is the model's, and the significance is
    the union over both."""
    from dpaudit.accounting import group_epsilon
    from dpaudit.report.data import assemble

    per_note = _claim_of_dp4()
    group = group_epsilon(noise_multiplier=1.0, sample_rate=0.08, steps=10, delta=DELTA, group_size=4)

    def model(root, white):
        run = make_run(root, ladders={"dp4": [rung("released"), rung("input_space", refused="no twin"), white]})
        data = json.loads((run.data_dir / "canaries.json").read_text())
        for c in data["canaries"]:
            c["repetitions"] = 4
        write_json_atomic(run.data_dir / "canaries.json", data)
        md = run.model("dp4")
        shutil.rmtree(md.results_dir)  # a released bound between the per-note and the group's epsilon
        _write_results(md, np.random.default_rng(3), shift=3.0, bound_eps=((per_note + group) / 2, 0.1))
        return _model(assemble(read_snapshot(run)).report, "dp4")

    high = rung("white_box", shift=8.0)
    assert per_note < high.epsilon < group
    m = model(tmp_path / "high", high)
    assert m["verdict"]["status"] == "violated" and m["verdict"]["attack"] == "white_box"
    assert m["verdict"]["claimed_epsilon"] == pytest.approx(per_note)
    assert m["verdict"]["significance"] == pytest.approx(0.05 + 0.1)  # the canaries' two tests, then the rung
    assert "jointly at 85% confidence" in m["verdict"]["reason"]
    low = rung("white_box", shift=2.0)
    assert low.epsilon < per_note
    m = model(tmp_path / "low", low)  # the released bound is below the group's: no violation either way
    assert m["verdict"]["status"] != "violated" and m["dp"]["group_epsilon"] == pytest.approx(group)
    assert m["verdict"]["significance"] == pytest.approx(0.05 + 0.1)


def test_a_white_box_rung_of_another_mechanism_is_a_violation(tmp_path, canaries_of_another_q):
    """The white-box rung refused because its gradient canaries ran q = 0.1 under a record of
    q = 0.05: direct evidence that the accounting is not of the run, so the verdict is violated
    with the refusal as its reason; another refusal (the inclusion check) is not."""
    from dpaudit.config import load_config
    from dpaudit.stages.ladder import white_box_rung

    twin = RunDir(tmp_path / "twin")
    canaries_of_another_q(twin.model("dp4").root)
    white = white_box_rung(twin, load_config("tiny", overrides=["audit.ladder.trials=1"]), "dp4")
    assert white.bound is None and "not the claimed mechanism" in white.refused
    m = _model(_assembled(tmp_path, {"dp4": [rung("released"), rung("input_space", refused="no twin"), white]}),
               "dp4")
    assert m["verdict"]["status"] == "violated" and white.refused in m["verdict"]["reason"]
    assert m["verdict"]["exit_code"] == 1


def test_an_unreadable_ladder_is_said_and_left_out(tmp_path):
    run = make_run(tmp_path)
    run.model("dp4").ladder_path.write_text('{"schema_version": 1, "rungs": [{"rung": "telepathy"}]}')
    from dpaudit.report.data import assemble

    report = assemble(read_snapshot(run)).report
    assert _model(report, "dp4")["rungs"] == []
    assert any(w.startswith("dp4: ladder.json unreadable") for w in report["warnings"])


def test_the_compliance_figure_is_the_ladder(tmp_path):
    from dpaudit.report.figures import compliance

    ladders = {"dp4": [rung("released"), rung("input_space", refused="no twin"), rung("white_box", shift=8.0)],
               "dp4-patient": [rung("released", seed=1), rung("input_space", refused="no twin"),
                               rung("white_box", seed=2)]}
    fig = compliance(_assembled(tmp_path, ladders))
    (ax,) = fig.axes
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "released: the released model, black-box (90%)" in labels
    assert "white-box: gradient canaries, all iterates (90%)" in labels
    assert not any(label.startswith("input-space") for label in labels)  # refused everywhere: not drawn
    assert any("y = x" in label for label in labels) and any("violated" in label for label in labels)
    (top,) = ax.child_axes
    assert [t.get_text() for t in top.get_xticklabels()] == ["dp4", "dp4-patient (patient-level)", "nonprivate"]
    white = sorted(x for line in ax.lines if line.get_marker() == "D" for x in line.get_xdata())
    assert len(white) == 2 and white[1] > 1.15 * white[0]  # the patient-level model apart from the note-level one
    # each drawn rung's ideal range (its draws: 1.8 to 2.2 here) as a pale bar, named in the legend
    bars = [line for line in ax.lines if line.get_linewidth() == 6 and line.get_alpha() == 0.22 and len(line.get_xdata())]
    assert len(bars) == 4 and all(list(line.get_ydata()) == pytest.approx([1.8, 2.2]) for line in bars)
    assert any(label.startswith("its range (pale bar)") for label in labels)


def test_the_claim_line_is_flat_at_each_models_claim_across_its_rungs():
    from dpaudit.report.figures import _claim_line

    # 4 (note level) and 4 (patient level, nudged right): one step; a group's claim 9 at epsilon 8
    xs, ys = _claim_line(0.5, 16.0, [(3.6, 4.5, 4.0), (4.8, 5.9, 4.0), (7.5, 8.5, 9.0)])
    assert xs == [0.5, 3.6, 3.6, 5.9, 5.9, 7.5, 7.5, 8.5, 8.5, 16.0]
    assert ys == [0.5, 3.6, 4.0, 4.0, 5.9, 7.5, 9.0, 9.0, 8.5, 16.0]


def test_the_page_leads_with_one_sentence_per_model(tmp_path):
    claim = _claim_of_dp4()
    ladders = {"dp4": [rung("released", ideal=0.6), rung("white_box", shift=8.0, ideal=3.0)],
               "dp4-patient": [rung("released", ideal=0.6, seed=1), rung("white_box", ideal=1.1, seed=2)]}
    run = make_run(tmp_path, ladders=ladders)
    report = build_report(run.root)
    html = run.report_html.read_text()
    ladder = html.split('id="ladder"')[1].split("</section>")[0]
    assert html.index('id="ladder"') < html.index('id="summary"')
    white = ladders["dp4"][1].epsilon
    assert f"dp4: white-box ε ≥ {white:.2f}, above the claimed ε {claim:.3g}" in ladder
    patient = ladders["dp4-patient"][1].epsilon
    ceiling = _model(report, "dp4-patient")["rungs"][1]["ceiling"]
    assert ceiling > claim
    assert (f"dp4-patient: white-box {patient:.2f} of a ceiling {ceiling:.2f} at ε {claim:.3g}: the audit could see "
            "a violation, and none was found.") in ladder
    assert "broken: failed (train: CUDA out of memory &lt;b&gt;boom&lt;/b&gt;)" in ladder
    assert 'alt="threat-model ladder' in ladder
    verdicts = html.split('id="verdicts"')[1].split("</section>")[0]
    assert f"{patient:.2f} / 1.10" in verdicts and "input-space" not in verdicts  # a rung no model ran: no column


# --------------------------------------------------------------------------- TPRs withheld for every attack


def test_tprs_withheld_for_every_attack_have_no_panel_and_no_column(built):
    import copy

    from dpaudit.report.figures import membership
    from dpaudit.report.html import render

    _, report, html = built
    # 150 held-out members and 20 excluded canaries: TPR at 1% and 0.1% FPR withheld for every attack
    titles = [ax.get_title() for ax in membership(report).axes]
    assert titles == ["AUC: members vs. held-out", "AUC: canaries"]
    part = html.split('id="membership"')[1].split("</section>")[0]
    assert ("Members vs. held-out: TPR at 1% and 0.1% FPR are left out, not enough non-members: they need about "
            "1,000 and 10,000 non-members; this run has 150.") in part
    assert "this run has 20." in part
    assert "n/e" not in part and "TPR at 1% / 0.1% FPR" not in part
    assert not any("members: TPR" in w for w in report["warnings"])  # said once, where the panels would be

    # 2,000 held out and a TPR at 1% FPR for one attack: that panel and column stay, 0.1% goes
    report = copy.deepcopy(report)
    for m in report["models"]:
        for name, a in m["attacks"].items():
            a["num_out"] = 2000
            a["tpr_at_fpr"]["0.01"] = 0.05 if name == "loss" else None
    titles = [ax.get_title() for ax in membership(report).axes]
    assert titles == ["AUC: members vs. held-out", "TPR at 1% FPR: members vs. held-out", "AUC: canaries"]
    part = render(report, {}).split('id="membership"')[1].split("</section>")[0]
    assert ("Members vs. held-out: TPR at 0.1% FPR is left out, not enough non-members: it needs about 10,000 "
            "non-members; this run has 2,000.") in part
    assert "Members vs. held-out: AUC [95% CI]; TPR at 1% FPR</h3>" in part
    assert "0.050" in part and "n/e" in part  # zlib's withheld TPR at 1% beside loss's


def test_utility_axis_turns_logarithmic_when_the_base_model_is_far_off(built):
    """A base model 100x worse than its fine-tunes (the demo's shift between hospitals) would
    flatten them on a linear axis; perplexities within 10x of each other keep it linear."""
    import copy

    from dpaudit.report.figures import utility

    _, report, _ = built
    report = copy.deepcopy(report)
    for m in report["models"]:
        m["utility"].update(heldout_perplexity=20.0, initial_heldout_perplexity=25.0)
    assert utility(report).axes[0].get_yscale() == "linear"
    for m in report["models"]:
        m["utility"]["initial_heldout_perplexity"] = 2000.0
    assert utility(report).axes[0].get_yscale() == "log"


def test_secret_canaries_cut_in_training_are_counted_under_their_table(tmp_path):
    run = make_run(tmp_path)
    md = run.model("dp4")
    ext = md.read_extraction()
    ext.update(space_bits=10.0, secret_set="code3", exposure_method="exact", canaries=[],
               by_repetitions=[{"repetitions": 1, "num": 2, "mean_exposure": 1.0, "median_exposure": 1.0,
                                "extracted": 0.0, "extracted_sampled": 0.0}],
               secrets_left_out={"num": 3, "ids": ["s1", "s2", "s3"], "max_tokens": 24, "reason": "cut"})
    md.write_extraction(ext)
    report = build_report(run.root)
    assert _model(report, "dp4")["extraction"]["secrets"]["left_out"] == 3
    html = run.report_html.read_text()
    assert "dp4: 3 secret canaries left out of this table: prefix and secret are longer than 24 tokens" in html
