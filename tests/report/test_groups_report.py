"""Who pays for the privacy (issue 29): ``models[i].groups[]`` of report.json against a naive
loop over the run's files, ``tables/groups.csv``, the section and its figure."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from test_report import _model, make_run

from dpaudit.audit import metrics
from dpaudit.audit.groups import UnitClipping
from dpaudit.report import build_report
from dpaudit.rundir import write_jsonl_atomic, write_npz_atomic
from dpaudit.signals import TokenSignals
from dpaudit.stages.signal_cache import save_signals

N = 300  # the member split of make_run: 150 members, then 150 held out


def _group(unit: int) -> str:
    return "rare" if unit % 4 == 0 else "common"


def _candidates():
    return [{"text": f"note {i}", "unit_id": f"p{i // 3:03d}", "role": "member" if i < 150 else "heldout",
             "group": _group(i // 3)} for i in range(N)]


def _signals(rng, *, rare_shift):
    """Per-token log-probs of the candidates (and 40 canaries after them); the rare group's are
    lower by ``rare_shift``."""
    width = 12
    lp = -rng.uniform(0.5, 2.5, (N + 40, width)).astype(np.float32)
    for i in range(N):
        if _group(i // 3) == "rare":
            lp[i] -= rare_shift
    mask = rng.random((N + 40, width)) < 0.9
    return TokenSignals(logprob=lp, mask=mask)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("g"))
    write_jsonl_atomic(run.data_dir / "candidates.jsonl", _candidates())
    rng = np.random.default_rng(5)
    signals = {}
    for name, shift in (("nonprivate", 0.1), ("dp4", 0.6), ("dp4-patient", 0.4)):
        md = run.model(name)
        signals[name] = _signals(rng, rare_shift=shift)
        save_signals(md.root / "signals" / "target.npz", signals[name], fingerprint="x")
        ext = md.read_extraction()
        ext.setdefault("patient_secrets", {"field": "mrn", "groups": []})["by_group"] = [
            {"group": g, "member_patients": 4, "member_notes": 10, "member_extracted_notes": k,
             "member_mean_logprob": -2.0, "heldout_patients": 4, "heldout_notes": 9, "heldout_extracted_notes": 0,
             "heldout_mean_logprob": -5.0} for g, k in (("common", 1), ("rare", 4))]
        md.write_extraction(ext)
    # dp4: the rare patients' notes clipped at every step they were sampled, the common ones at 1 in 5
    ids = np.array([f"p{u:03d}" for u in range(50)] + ["canary-1"])
    sampled = np.full(ids.size, 10)
    clipped = np.array([10 if _group(u) == "rare" else 2 for u in range(50)] + [0])
    norms = np.where(clipped == 10, 25.0, 6.0)
    uc = UnitClipping(unit_ids=ids, sampled=sampled, clipped=clipped, norm_sum=norms, max_grad_norm=1.0)
    write_npz_atomic(run.model("dp4").unit_clipping_path, **uc.to_arrays())
    signals["base"] = _signals(rng, rare_shift=0.5)  # the base model, scored as the one reference
    save_signals(run.root / "signals" / "base.npz", signals["base"], fingerprint="x")
    report = build_report(run.root)
    return run, report, signals


def test_groups_in_report_json_match_a_naive_loop(grouped):
    run, report, signals = grouped
    cands = _candidates()
    for name in ("nonprivate", "dp4", "dp4-patient", "base"):
        m = _model(report, name) if name != "base" else {"groups": report["groups_base"]}
        groups = {g["group"]: g for g in m["groups"]}
        assert set(groups) == {"common", "rare"} and groups["common"]["majority"]
        nll, tok = -signals[name].sum_logprob(), signals[name].token_count()
        ppl = {}
        for g in ("common", "rare"):
            rows = [i for i, c in enumerate(cands) if c["group"] == g and c["role"] == "heldout"]
            ppl[g] = math.exp(sum(nll[i] for i in rows) / sum(tok[i] for i in rows))
            e = groups[g]["heldout_perplexity"]
            assert e["value"] == pytest.approx(ppl[g])
            assert e["low"] < e["value"] < e["high"]
            assert groups[g]["heldout_units"] == len({cands[i]["unit_id"] for i in rows})
        ratio = groups["rare"]["perplexity_ratio"]
        assert ratio["value"] == pytest.approx(ppl["rare"] / ppl["common"])
        assert groups["common"]["perplexity_ratio"] is None
        if name == "base":  # the base model: utility only, the line every fine-tune starts from
            continue
        # membership: the loss attack's member-split scores of the group's records
        scores, labels = run.model(name).read_results()["loss"]["arrays"]["members"]
        for g in ("common", "rare"):
            rows = np.array([c["group"] == g for c in cands])
            mem = groups[g]["membership"]
            assert mem["attack"] == "loss"
            assert mem["auc"]["value"] == pytest.approx(metrics.auc(in_scores=scores[rows & labels],
                                                                    out_scores=scores[rows & ~labels]))
            assert mem["tpr_at_fpr"]["0.01"]["value"] is None  # 150 held-out records at most: not enough
        assert groups["rare"]["extraction"]["member_extracted_notes"] == 4
    dp4 = {g["group"]: g for g in _model(report, "dp4")["groups"]}
    assert dp4["rare"]["clipping"]["clipped_share"]["value"] == pytest.approx(1.0)
    assert dp4["common"]["clipping"]["clipped_share"]["value"] == pytest.approx(0.2)
    assert dp4["rare"]["clipping"]["mean_norm"]["value"] == pytest.approx(2.5)
    assert dp4["rare"]["clipping"]["units"] == 13 and dp4["common"]["clipping"]["units"] == 37
    # no per-unit record: unknown, never zero
    assert all(g["clipping"] is None for g in _model(report, "dp4-patient")["groups"])
    assert _model(report, "broken")["groups"] == [] or all(
        g["heldout_perplexity"] is None for g in _model(report, "broken")["groups"])


def test_groups_table_section_and_figure(grouped):
    run, report, _ = grouped
    assert report["tables"]["groups"] == "tables/groups.csv"
    with open(run.root / "tables" / "groups.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["model"], r["group"]) for r in rows} >= {("dp4", "rare"), ("dp4", "common"), ("nonprivate", "rare")}
    dp4_rare = next(r for r in rows if r["model"] == "dp4" and r["group"] == "rare")
    assert float(dp4_rare["clipped_share"]) == pytest.approx(1.0)
    assert "groups" in report["figures"]
    html = run.report_html.read_text()
    assert "Who pays for the privacy" in html
    assert "clipped more often" in html  # dp4's rare group: 100% against 20%, intervals apart
    assert "Perplexity of group rare over group common" in html
    assert "The base model, before fine-tuning:" in html


def test_findings_say_when_the_ratio_grows_and_when_clipping_is_saturated():
    from dpaudit.report.html import _group_findings

    def est(v, lo, hi):
        return {"value": v, "low": lo, "high": hi, "units": 20, "confidence": 0.95, "note": ""}

    def model(name, privacy, eps, ratio, shares):
        clip = None if shares is None else {g: {"units": 10, "sampled": 50, "max_grad_norm": 1.0,
                                                 "clipped_share": est(s, s, s), "mean_norm": est(n, n * .9, n * 1.1)}
                                             for g, (s, n) in shares.items()}
        return {"name": name, "privacy": privacy, "dp": {"epsilon": eps, "unit": "example"}, "groups": [
            {"group": "common", "majority": True, "perplexity_ratio": None, "clipping": (clip or {}).get("common")},
            {"group": "rare", "majority": False, "perplexity_ratio": est(*ratio), "clipping": (clip or {}).get("rare")}]}

    models = [model("nonprivate", "non_private", None, (1.1, 1.05, 1.15), None),
              model("dp1", "dp", 1.0, (1.4, 1.3, 1.5), {"common": (1.0, 4.0), "rare": (1.0, 9.0)}),
              model("dp8", "dp", 8.0, (1.2, 1.12, 1.3), {"common": (1.0, 4.0), "rare": (1.0, 9.0)})]
    text = " ".join(_group_findings(models))
    assert "grows as ε falls" in text and "1.40 [1.30, 1.50]" in text
    assert "clipped indistinguishably" in text
    assert "every unit-step of both groups was clipped in dp1, dp8" in text and "9.00 [8.10, 9.90]" in text
    models[1]["groups"][1]["perplexity_ratio"] = est(1.12, 1.0, 1.2)
    text = " ".join(_group_findings(models))
    assert "does not change measurably" in text and "no harder to predict" not in text  # 1.1 [1.05, 1.15] without DP
    models[0]["groups"][1]["perplexity_ratio"] = est(1.02, 0.9, 1.15)
    assert "no harder to predict than group common (ratio 1.02 [0.90, 1.15]" in " ".join(_group_findings(models))
    # a group that no step sampled (a tiny run) has no clipped share: no saturation claim, no error
    models[1]["groups"][1]["clipping"]["clipped_share"] = est(None, None, None)
    assert "every unit-step of both groups was clipped in dp8:" in " ".join(_group_findings(models))
