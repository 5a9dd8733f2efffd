"""The report stage: report.json contents, verdict logic, HTML safety, figures."""

from __future__ import annotations

import base64
import json
import math
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import dpaudit
from dpaudit.errors import InputError
from dpaudit.report import build_report
from dpaudit.report.figures import roc_curve

EVENT = {
    "type": "self_composed",
    "count": 100,
    "event": {"type": "poisson_sampled", "sampling_probability": 0.01, "event": {"type": "gaussian", "noise_multiplier": 1.0}},
}
FAKE_EPS = 2.0  # what the stand-in accountant returns at delta = 1e-5
TEXT_MARKER = "PATIENTNOTE_7731"
MALICIOUS = f"<script>alert(1)</script> {TEXT_MARKER} was admitted"
WEIRD_ID = "c&0<b>"


# --------------------------------------------------------------------------- fixtures


def _fake_accounting() -> types.ModuleType:
    """A stand-in for dpaudit.accounting: epsilon 2.0 at delta 1e-5, a bit more at smaller delta."""
    mod = types.ModuleType("dpaudit.accounting")
    mod.calls = []

    def event_from_dict(d):
        if not isinstance(d, dict) or "type" not in d:
            raise ValueError("bad event")
        return ("event", json.dumps(d, sort_keys=True))

    def epsilon_from_event(event, *, delta, method="pld"):
        mod.calls.append((event, delta, method))
        return FAKE_EPS + 0.1 * math.log10(1e-5 / delta)

    mod.event_from_dict = event_from_dict
    mod.epsilon_from_event = epsilon_from_event
    return mod


@pytest.fixture
def fake_accounting(monkeypatch):
    mod = _fake_accounting()
    monkeypatch.setitem(sys.modules, "dpaudit.accounting", mod)
    return mod


def _split(rng, *, n_in, n_out, shift, tpr, bounds=None):
    scores = np.r_[rng.normal(shift, 1.0, n_in), rng.normal(0.0, 1.0, n_out)]
    labels = np.r_[np.ones(n_in, bool), np.zeros(n_out, bool)]
    auc = min(0.5 + shift / 8, 0.97)
    d = {
        "auc": auc,
        "auc_ci": [auc - 0.02, auc + 0.02],
        "tpr_at_fpr": tpr,
        "balanced_accuracy": 0.5 + shift / 8,
        "num_in": n_in,
        "num_out": n_out,
    }
    if bounds is not None:
        d["epsilon_lower_bounds"] = bounds
    return d, scores, labels


def make_run(
    root: Path,
    *,
    bound_eps=(0.4, 0.9, 1.3),
    dp: bool | str = True,
    logged_eps: float | None = FAKE_EPS,
    train_log: bool = True,
    extraction: bool = True,
) -> Path:
    """A run directory with three attacks (members + canaries), canaries, a DP event."""
    rng = np.random.default_rng(0)
    run = root / "run"
    (run / "results").mkdir(parents=True)
    for i, (name, shift) in enumerate((("loss", 0.5), ("zlib", 0.8), ("lira", 1.5))):
        members, ms, ml = _split(
            rng, n_in=2000, n_out=2000, shift=shift,
            # 0.001 needs 10000 non-members: the stage wrongly gave 0.0, the report must withhold it
            tpr={"0.1": 0.2 + 0.1 * i, "0.01": 0.03 * (i + 1), "0.001": 0.0 if i == 0 else None},
        )
        canaries, cs, cl = _split(
            rng, n_in=60, n_out=60, shift=shift * 2, tpr={"0.1": None, "0.01": None, "0.001": None},
            bounds={
                "one_run": {"epsilon": bound_eps[i], "delta": 1e-5, "significance": 0.05, "strategy": "split", "guesses": 20},
                "gdp": {"epsilon": bound_eps[i] * 0.8, "delta": 1e-5, "significance": 0.05, "strategy": "bonferroni"},
            },
        )
        result = {"schema_version": 1, "attack": name, "params": {"k": 0.2}, "splits": {"members": members, "canaries": canaries}}
        (run / "results" / f"{name}.json").write_text(json.dumps(result))
        np.savez(run / "results" / f"{name}.npz", members_scores=ms, members_labels=ml, canaries_scores=cs, canaries_labels=cl)

    if dp:
        rec = {
            "noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 100, "delta": 1e-5, "unit": "user",
            "num_units": 5000, "max_grad_norm": 1.0, "expected_batch_size": 50, "accountant": "pld",
            "epsilon": logged_eps, "event": EVENT,
        }
        if dp == "nonprivate":
            rec.update(noise_multiplier=0.0, epsilon=None, event={"type": "non_private"})
        (run / "dp_event.json").write_text(json.dumps(rec))

    canaries = [
        {"id": WEIRD_ID, "kind": "new_token", "text": MALICIOUS, "prefix": "<b>Patient", "secret": "7&3<1>",
         "included": True, "repetitions": 1},
        {"id": "c1", "kind": "digits", "text": f"note {TEXT_MARKER} 2", "prefix": "note", "secret": "123456",
         "included": False, "repetitions": 1},
    ]
    (run / "canaries.json").write_text(json.dumps({"schema_version": 1, "canaries": canaries}))
    if extraction:
        ext = {WEIRD_ID: {"exposure": 9.5, "extracted": True, "generated": MALICIOUS}, "c1": {"exposure": 1.25, "extracted": False}}
        (run / "extraction.json").write_text(json.dumps(ext))
    if train_log:
        lines = []
        for step in range(0, 101, 5):
            r = {"step": step, "train_loss": 5.0 * math.exp(-step / 40) + 1.0}
            if step % 20 == 0:
                r.update(heldout_loss=r["train_loss"] + 0.2, heldout_perplexity=math.exp(r["train_loss"] + 0.2))
            lines.append(json.dumps(r))
        (run / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    (run / "manifest.json").write_text(json.dumps({"schema_version": 1, "seeds": {"run": 0}, "packages": {"numpy": "2.0"}}))
    (run / "config.resolved.yaml").write_text("seed: 0\ntrain: {epochs: 1}\n")
    return run


@pytest.fixture
def no_figures(monkeypatch):
    """Skip drawing in tests of report logic (drawing is tested once, on the shared build)."""
    import dpaudit.report.build as build_module

    monkeypatch.setattr(build_module, "_figures", lambda *args, **kwargs: {})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The default run, built once for the read-only tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "dpaudit.accounting", _fake_accounting())
        run = make_run(tmp_path_factory.mktemp("built"))
        report = build_report(run)
    return run, report, (run / "report.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- report.json


def test_report_json_contents(built):
    run, report, _ = built
    on_disk = json.loads((run / "report.json").read_text())
    assert on_disk == report
    assert report["schema_version"] == 1
    assert report["dpaudit_version"] == dpaudit.__version__
    assert re.match(r"\d{4}-\d\d-\d\dT", report["created"])

    p = report["privacy"]
    assert p["unit"] == "user" and p["steps"] == 100 and p["sample_rate"] == 0.01
    assert p["sampling"].startswith("Poisson with rate q = 0.01")
    assert p["delta"] == 1e-5 and p["accountant"] == "pld"
    assert p["epsilon_recomputed"] == pytest.approx(FAKE_EPS)
    assert p["epsilon_source"] == "recomputed" and p["epsilon_mismatch"] is False
    assert p["epochs"] == pytest.approx(1.0)

    assert set(report["attacks"]) == {"loss", "zlib", "lira"}
    assert report["attacks"]["lira"]["split"] == "members"
    assert report["attacks"]["lira"]["num_out"] == 2000
    assert report["attacks"]["zlib"]["tpr_at_fpr"]["0.1"] == pytest.approx(0.3)
    assert set(report["canary_attacks"]) == {"loss", "zlib", "lira"}
    assert report["canary_attacks"]["lira"]["num_in"] == 60

    emp = report["empirical_epsilon"]
    assert emp["best"]["attack"] == "lira" and emp["best"]["method"] == "one_run"
    assert emp["best"]["epsilon"] == pytest.approx(1.3)
    assert len(emp["bounds"]) == 6
    assert "corrected" in emp["note"]
    assert emp["joint_confidence"] == pytest.approx(1 - 3 * 0.05)  # the three assumption-free bounds
    assert report["verdict"] == "consistent"
    assert set(report["figures"]) == {"roc_members", "roc_canaries", "epsilon", "training"}
    assert report["training"]["last_step"] == 100


def test_tpr_without_enough_nonmembers_is_null(built):
    _, report, html = built
    # 2000 non-members are too few for FPR 0.1%; the stage's 0.0 is withheld, its null kept
    assert report["attacks"]["loss"]["tpr_at_fpr"]["0.001"] is None
    assert report["attacks"]["loss"]["tpr_suppressed"] == ["0.001"]
    assert report["attacks"]["zlib"]["tpr_at_fpr"]["0.001"] is None
    assert report["attacks"]["loss"]["tpr_at_fpr"]["0.01"] == pytest.approx(0.03)
    # 60 excluded canaries: not even FPR 10% is measurable
    assert all(v is None for v in report["canary_attacks"]["lira"]["tpr_at_fpr"].values())
    assert html.count("not enough non-members") >= 3 + 3 * 3


# --------------------------------------------------------------------------- HTML safety


def test_html_escaped_and_self_contained(built):
    _, _, html = built
    assert "<script" not in html.lower()
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]*)""", html, re.IGNORECASE)
    assert refs and all(ref.startswith("data:image/png;base64,") for ref in refs)
    assert "http://" not in html and "https://" not in html
    assert "<link" not in html.lower()
    # ids and secrets with markup characters are escaped
    assert "c&amp;0&lt;b&gt;" in html and WEIRD_ID not in html
    assert "7&amp;3&lt;1&gt;" in html
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 4
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    assert "<style>" in html


def test_member_texts_absent_by_default(built):
    run, report, html = built
    assert TEXT_MARKER not in html
    assert TEXT_MARKER not in (run / "report.json").read_text()
    assert "alert(1)" not in html
    row = next(r for r in report["canaries"]["rows"] if r["id"] == WEIRD_ID)
    assert "text" not in row and "prefix" not in row
    assert row["secret"] == "7&3<1>" and row["exposure"] == 9.5 and row["extracted"] is True
    assert "generated" in report["extraction"]["hidden_columns"]


def test_member_texts_present_and_escaped_when_asked(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path)
    report = build_report(run, include_texts=True, title="Audit <b>&</b>")
    html = (run / "report.html").read_text()
    assert TEXT_MARKER in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html.lower()
    assert "Audit &lt;b&gt;&amp;&lt;/b&gt;" in html
    row = next(r for r in report["canaries"]["rows"] if r["id"] == WEIRD_ID)
    assert row["text"] == MALICIOUS
    assert "generated" in report["extraction"]["columns"]


# --------------------------------------------------------------------------- verdict


def test_verdict_violated_when_a_bound_exceeds_the_accountant(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path, bound_eps=(0.4, 2.4, 1.3))
    report = build_report(run)
    assert report["verdict"] == "violated"
    assert report["empirical_epsilon"]["best"]["epsilon"] == pytest.approx(2.4)
    bad = [b for b in report["empirical_epsilon"]["bounds"] if b["exceeds_accountant"]]
    assert [(b["attack"], b["method"]) for b in bad] == [("zlib", "one_run")]
    html = (run / "report.html").read_text()
    assert "exceeds the accountant" in html and ">violated<" in html


def test_bound_compared_at_its_own_delta(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path, bound_eps=(0.4, 2.05, 1.3))
    path = run / "results" / "zlib.json"
    d = json.loads(path.read_text())
    d["splits"]["canaries"]["epsilon_lower_bounds"]["one_run"]["delta"] = 1e-6
    path.write_text(json.dumps(d))
    report = build_report(run)
    b = next(b for b in report["empirical_epsilon"]["bounds"] if b["attack"] == "zlib" and b["method"] == "one_run")
    assert b["accountant_epsilon"] == pytest.approx(FAKE_EPS + 0.1)  # recomputed at delta = 1e-6
    assert report["verdict"] == "consistent"


def test_nonprivate_run_has_no_verdict(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path, dp=False, train_log=False, extraction=False)
    report = build_report(run)
    assert report["privacy"] is None and report["verdict"] is None
    assert report["training"] is None
    html = (run / "report.html").read_text()
    assert "without differential privacy" in html


def test_nonprivate_event_recorded(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path, dp="nonprivate")
    report = build_report(run)
    p = report["privacy"]
    assert p["private"] is False and p["epsilon"] is None and p["epsilon_mismatch"] is False
    assert report["verdict"] is None
    assert "∞" in (run / "report.html").read_text()


def test_logged_epsilon_mismatch_is_flagged(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path, logged_eps=1.5, bound_eps=(0.4, 1.8, 1.3))
    report = build_report(run)
    p = report["privacy"]
    assert p["epsilon_logged"] == 1.5 and p["epsilon_recomputed"] == pytest.approx(FAKE_EPS)
    assert p["epsilon_mismatch"] is True and p["epsilon"] == pytest.approx(FAKE_EPS)
    assert report["verdict"] == "consistent"  # 1.8 <= the recomputed 2.0, not the logged 1.5
    assert any("differs" in w for w in report["warnings"])
    assert "MISMATCH" in (run / "report.html").read_text()


def test_accounting_unavailable_falls_back_to_logged(tmp_path, monkeypatch, no_figures):
    monkeypatch.setitem(sys.modules, "dpaudit.accounting", None)  # import raises ImportError
    run = make_run(tmp_path, logged_eps=2.0, train_log=False)
    report = build_report(run)
    p = report["privacy"]
    assert p["epsilon_recomputed"] is None and p["epsilon_source"] == "logged"
    assert p["recompute_status"].startswith("not recomputed")
    assert report["verdict"] == "consistent"


def test_real_accountant_recomputes(tmp_path, no_figures):
    accounting = pytest.importorskip("dpaudit.accounting")
    run = make_run(tmp_path, logged_eps=None, train_log=False)
    report = build_report(run)
    expected = accounting.epsilon_from_event(accounting.event_from_dict(EVENT), delta=1e-5, method="pld")
    p = report["privacy"]
    assert math.isfinite(expected) and p["epsilon_recomputed"] == pytest.approx(expected, rel=1e-9)
    assert p["epsilon_mismatch"] is True  # the log said infinity


# --------------------------------------------------------------------------- figures and files


def test_figures_png_and_pdf(built):
    run, report, _ = built
    for stem in ("roc_members", "roc_canaries", "epsilon", "training"):
        png, pdf = run / "figures" / f"{stem}.png", run / "figures" / f"{stem}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert pdf.read_bytes()[:5] == b"%PDF-"
        assert report["figures"][stem] == {"png": f"figures/{stem}.png", "pdf": f"figures/{stem}.pdf"}
    leftovers = [p.name for p in run.rglob(".*")]
    assert leftovers == []


def test_rebuild_drops_stale_figures(tmp_path, fake_accounting, monkeypatch):
    from matplotlib.figure import Figure

    import dpaudit.report.figures as F

    for name in ("plot_roc", "plot_epsilon"):  # only the training figure matters here
        monkeypatch.setattr(F, name, lambda *args, **kwargs: Figure(figsize=(1, 1)))
    run = make_run(tmp_path)
    build_report(run)
    assert (run / "figures" / "training.pdf").is_file()
    (run / "train_log.jsonl").unlink()
    report = build_report(run)
    assert "training" not in report["figures"]
    assert not (run / "figures" / "training.png").exists()


def test_bad_inputs_raise_input_error(tmp_path, fake_accounting, no_figures):
    with pytest.raises(InputError):
        build_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="nothing to report"):
        build_report(tmp_path / "empty")
    run = make_run(tmp_path)
    d = json.loads((run / "results" / "loss.json").read_text())
    d["schema_version"] = 2
    (run / "results" / "loss.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match="schema_version"):
        build_report(run)


def test_roc_curve_matches_naive_auc():
    rng = np.random.default_rng(1)
    scores = np.round(rng.normal(size=300), 1)  # many ties
    labels = rng.random(300) < 0.4
    fpr, tpr = roc_curve(scores, labels)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    pos, neg = scores[labels], scores[~labels]
    naive = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (pos.size * neg.size)
    assert np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2) == pytest.approx(naive)


def test_single_split_attack_and_list_shaped_extraction(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path)
    only = {"schema_version": 1, "attack": "min_k", "params": {}, "splits": {"canaries": {
        "auc": 0.7, "auc_ci": None, "tpr_at_fpr": {"0.1": 0.5}, "balanced_accuracy": 0.6, "num_in": 500, "num_out": 500}}}
    (run / "results" / "min_k.json").write_text(json.dumps(only))
    ext = {"schema_version": 1, "k": 32, "results": [
        {"canary_id": "c1", "exposure": 2.0, "extracted": False, "completion": f"{TEXT_MARKER} leaked"}]}
    (run / "extraction.json").write_text(json.dumps(ext))
    report = build_report(run)
    assert report["attacks"]["min_k"]["split"] == "canaries"
    assert report["attacks"]["min_k"]["tpr_at_fpr"] == {"0.1": 0.5, "0.01": None, "0.001": None}
    assert report["attacks"]["min_k"]["auc_ci"] is None
    assert "min_k" in report["canary_attacks"]
    assert report["extraction"]["summary"] == {"k": 32}
    assert report["extraction"]["rows"] == [{"id": "c1", "exposure": 2.0, "extracted": False}]
    c1 = next(r for r in report["canaries"]["rows"] if r["id"] == "c1")
    assert c1["exposure"] == 2.0
    html = (run / "report.html").read_text()
    assert TEXT_MARKER not in html and "(canaries split)" in html


def test_gaussian_assumption_bounds_do_not_decide_the_verdict(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path, bound_eps=(0.4, 1.0, 1.3))
    path = run / "results" / "zlib.json"
    d = json.loads(path.read_text())
    d["splits"]["canaries"]["epsilon_lower_bounds"]["gdp"]["epsilon"] = 50.0
    path.write_text(json.dumps(d))
    report = build_report(run)
    assert report["verdict"] == "consistent"
    assert report["empirical_epsilon"]["best"]["method"] == "one_run"


def test_dp_run_without_bounds_has_no_verdict(tmp_path, fake_accounting, no_figures):
    run = make_run(tmp_path)
    for path in (run / "results").glob("*.json"):
        d = json.loads(path.read_text())
        d["splits"]["canaries"].pop("epsilon_lower_bounds")
        path.write_text(json.dumps(d))
    report = build_report(run)
    assert report["verdict"] is None and "no assumption-free empirical" in report["verdict_reason"]
    assert report["empirical_epsilon"]["best"] is None


def test_write_json_atomic_maps_infinity_to_null(tmp_path):
    from dpaudit.report import write_json_atomic

    write_json_atomic(tmp_path / "x.json", {"eps": math.inf, "a": np.float32(0.5), "n": np.int64(3), "v": np.arange(2)})
    assert json.loads((tmp_path / "x.json").read_text()) == {"eps": None, "a": 0.5, "n": 3, "v": [0, 1]}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


@pytest.mark.parametrize(("keep", "warned"), [
    ([[1, 0, 1], [0, 1, 0], [1, 1, 1]], True),  # one model in, one out: online LiRA's means are single values
    ([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 1, 1]], False),  # two in and two out for every text
])
def test_fleet_summary_and_the_online_lira_warning(tmp_path, fake_accounting, no_figures, keep, warned):
    run = make_run(tmp_path)
    keep = np.array(keep, dtype=bool)
    (run / "fleet").mkdir()
    np.savez(run / "fleet" / "keep.npz", keep=keep, unit_ids=np.array(["a", "b", "c"]))
    for j in range(len(keep) - 1):  # the last model is unfinished: it does not count
        (run / "fleet" / f"model-{j:03d}").mkdir()
        (run / "fleet" / f"model-{j:03d}" / "fleet_job.json").write_text("{}")
    lira = json.loads((run / "results" / "lira.json").read_text())
    (run / "results" / "lira_online.json").write_text(json.dumps({**lira, "attack": "lira_online"}))
    report = build_report(run)
    finished = keep[:-1]
    assert report["fleet"] == {"num_models": len(finished), "in_per_text_min": int(finished.sum(0).min()),
                               "out_per_text_min": int((~finished).sum(0).min())}
    assert any(w.startswith("lira_online:") for w in report["warnings"]) is warned
    assert f"Reference models: {len(finished)};" in (run / "report.html").read_text(encoding="utf-8")
