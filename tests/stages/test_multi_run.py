"""The multi-run audit (audit.mode: multi_run): its design, its statistics and the stage on tiny."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

FLEET_TESTS = Path(__file__).resolve().parents[1] / "fleet"
if str(FLEET_TESTS) not in sys.path:  # the fleet tests' plug-in trainer
    sys.path.insert(0, str(FLEET_TESTS))

import fleet_plugin

from dpaudit.audit import ceiling_table, epsilon_clopper_pearson, gdp_epsilon
from dpaudit.audit.strategy import DEFAULT_FPR_GRID, fpr_level_count
from dpaudit.config import load_config
from dpaudit.errors import InputError
from dpaudit.stages.artifacts import read_canaries, read_dp_record, read_tokenizer
from dpaudit.stages.multi_run import multi_run_bounds, multi_run_design

DP_MODEL = "models=[{name: dp, train: {trainer: 'dpaudit.train:dpsgd', dp: {target_epsilon: 8}}}]"


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("sets, message", [
    (["audit.num_runs=0"], "audit.num_runs must be > 0"),
    (["audit.models=[nope]"], "audit.models names model(s) not in the run: nope"),
    (["audit.attack=rmia"], "rmia needs references"),
    (["audit.attack=bogus"], "audit.attack must be an attack"),
    (["canaries.num=0"], "needs a canary"),
])
def test_bad_multi_run_config_is_one_clear_input_error(sets, message):
    from dpaudit.stages import check_config

    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_config(load_config("tiny", overrides=["audit.mode=multi_run", *sets]))
    if sets == ["canaries.num=0"]:
        load_config("tiny", overrides=sets)  # a one-run audit needs no canary


# --------------------------------------------------------------------------- statistics


def naive_counts(ins, outs, threshold):
    """Confusion counts of "member iff score > threshold", one score per run."""
    thr = -np.inf if threshold is None else threshold
    return {"tp": int(np.sum(ins > thr)), "fn": int(np.sum(ins <= thr)),
            "fp": int(np.sum(outs > thr)), "tn": int(np.sum(outs <= thr))}


def test_the_counts_fed_to_clopper_pearson_are_the_runs_counts():
    rng = np.random.default_rng(3)
    ins, outs = rng.normal(1.5, 1.0, 30), rng.normal(0.0, 1.0, 30)
    r = multi_run_bounds(in_scores=ins, out_scores=outs, delta=1e-5)
    cp = r["clopper_pearson"]
    assert (r["num_in"], r["num_out"], cp.num_canaries) == (30, 30, 60)
    d = cp.details
    naive = naive_counts(ins, outs, d["threshold"])
    assert {k: d[k] for k in ("tp", "fn", "tn")} == {k: naive[k] for k in ("tp", "fn", "tn")}
    assert d["fp"] == naive["fp"]  # continuous scores: no ties, so the order statistic lets exactly j through
    # the Bonferroni correction: one test per distinct threshold of the FPR grid
    g = len({fpr_level_count(a, 30) for a in DEFAULT_FPR_GRID})
    assert d["num_candidates"] == g
    expected = max(epsilon_clopper_pearson(**naive_counts(ins, outs, c["threshold"]), delta=1e-5,
                                           significance=0.05 / g) for c in d["candidates"])
    assert cp.epsilon == pytest.approx(expected) and cp.epsilon > 0
    assert cp.sound and not r["gdp"].sound
    with pytest.warns(UserWarning, match="well below 0.5"):
        swapped = multi_run_bounds(in_scores=outs, out_scores=ins, delta=1e-5)
    assert swapped["clopper_pearson"].epsilon < cp.epsilon  # the side a run was on matters


def test_ceiling_is_the_perfect_attack_and_matches_the_ceiling_table():
    (row,) = ceiling_table(ms=(100,), delta=1e-5, significance=0.05)
    r = multi_run_bounds(in_scores=np.ones(100), out_scores=np.zeros(100), delta=1e-5)
    assert r["ceiling"] == pytest.approx(row.clopper_pearson_default)
    assert r["clopper_pearson"].epsilon == pytest.approx(r["ceiling"])
    assert multi_run_bounds(in_scores=[1.0, 1.0], out_scores=[0.0, 0.0], delta=1e-5)["ceiling"] == 0.0


@pytest.mark.parametrize("mechanism", ["gaussian", "randomized_response"])
def test_bounds_stay_below_the_true_epsilon_of_a_simulated_mechanism(mechanism):
    """One run = one draw of the mechanism on the neighbouring inputs: the bound may exceed
    the true epsilon in at most a 5% share of audits (with binomial slack), and it is not
    vacuous. GDP holds for the Gaussian mechanism (it is exactly mu-GDP) and is not tested on
    randomized response, whose trade-off curve is not Gaussian."""
    rng = np.random.default_rng(11)
    trials, k = 60, 200
    if mechanism == "gaussian":
        mu, delta = 1.0, 0.05
        truth = gdp_epsilon(mu=mu, delta=delta)

        def draw():
            return rng.normal(mu, 1.0, k), rng.normal(0.0, 1.0, k)
    else:
        truth, delta = 1.0, 1e-5
        p = np.exp(truth) / (1 + np.exp(truth))

        def draw():
            return (rng.random(k) < p).astype(float), (rng.random(k) < 1 - p).astype(float)
    results = [multi_run_bounds(in_scores=a, out_scores=b, delta=delta) for a, b in (draw() for _ in range(trials))]
    allowed = stats.binom.ppf(0.999, trials, 0.05)
    methods = ("clopper_pearson", "gdp") if mechanism == "gaussian" else ("clopper_pearson",)
    for method in methods:
        eps = np.array([r[method].epsilon for r in results])
        assert (eps > truth).sum() <= allowed, method
        assert np.median(eps) > 0.3 * truth, method  # the runs' counts reached the bound


# --------------------------------------------------------------------------- design and fleet


class _Prepared:
    """The parts of PreparedData the design reads."""

    def __init__(self, train_set, canaries):
        self.train_set, self.canaries = train_set, canaries


def test_design_keeps_everything_but_the_canary_in_half_the_runs():
    from datasets import Dataset

    from dpaudit.canaries import Canary

    c0 = Canary(id="c0", kind="k", text="c0 text", prefix="c0", secret="s", included=True, repetitions=2)
    c1 = Canary(id="c1", kind="k", text="c1 text", prefix="c1", secret="s", included=True, repetitions=1)
    train = Dataset.from_dict({"text": ["a", "c0 text", "b", "c1 text", "c0 text"],
                               "unit_id": ["u1", "c0", "u2", "c1", "c0"]})
    canary, rows, keep = multi_run_design(_Prepared(train, [c0, c1]), canary_id=None, num_runs=3)
    assert canary.id == "c0"
    assert rows["unit_id"] == ["u1", "u2", "c1", "c0"] and rows["repetitions"] == [1, 1, 1, 2]
    assert keep.shape == (6, 4) and keep[:, :3].all()
    assert keep[:3, 3].all() and not keep[3:, 3].any()
    canary, rows, _ = multi_run_design(_Prepared(train, [c0, c1]), canary_id="c1", num_runs=1)
    assert rows["unit_id"] == ["u1", "c0", "u2", "c0", "c1"]
    with pytest.raises(InputError, match="audit.canary names no canary"):
        multi_run_design(_Prepared(train, [c0, c1]), canary_id="c9", num_runs=1)


def test_fleet_trains_exactly_the_rows_of_a_given_keep_matrix(tmp_path):
    from dpaudit.stages.fleet import load_fleet, train_fleet

    tokenizer = fleet_plugin.make_tokenizer()
    candidates = fleet_plugin.make_candidates(tokenizer, num_units=3, rows_per_unit=1)
    config = load_config("tiny", overrides=["train.trainer=fleet_plugin:train"])
    keep = np.array([[True, True, True], [True, True, False]])
    common = {"candidates": candidates, "tokenizer": tokenizer, "config": config, "progress": False}
    out = train_fleet(fleet_dir=tmp_path / "f", keep=keep, **common)
    assert np.array_equal(out, keep)
    stored, dirs = load_fleet(tmp_path / "f")
    assert np.array_equal(stored, keep)
    for row, d in zip(keep, dirs):
        received = json.loads((d / fleet_plugin.RECEIVED).read_text())["unit_ids"]
        assert received == [u for u, k in zip(candidates["unit_id"], row) if k]
    with pytest.raises(InputError, match="keep must be a bool matrix"):
        train_fleet(fleet_dir=tmp_path / "g", keep=np.ones((2, 5), bool), **common)
    with pytest.raises(InputError, match="keep has 2 rows"):
        train_fleet(fleet_dir=tmp_path / "g", keep=keep, num_models=3, **common)


# --------------------------------------------------------------------------- the stage on tiny


def tiny_multi_run(out, *sets):
    from dpaudit.stages import attack_run, run

    config = load_config("tiny", overrides=[DP_MODEL, "pretrain.enabled=false", "attack.attacks=[loss]",
                                            "train.dp.accountant=rdp",  # fast; PLD takes seconds per run
                                            "audit.mode=multi_run", *sets])
    result = run(config, out=out, until="train")
    return config, result.rundir, attack_run(result.rundir, config=config)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi") / "run"
    return tiny_multi_run(out, "audit.num_runs=2")


@pytest.mark.slow
def test_stage_trains_2k_copies_of_the_audited_mechanism(tiny):
    _, rundir, result = tiny
    assert result.ok, result.failed
    target = read_dp_record(rundir.model("dp")).to_dict()
    fleet = rundir.multi_run_dir("dp")
    keep = np.load(fleet / "keep.npz")["keep"]
    assert keep.shape[0] == 4 and keep[:2, -1].all() and not keep[2:, -1].any() and keep[:, :-1].all()
    n_base = keep.shape[1] - 1
    seeds = set()
    for j in range(4):
        event = json.loads((fleet / f"model-{j:03d}" / "dp_event.json").read_text())
        job = json.loads((fleet / f"model-{j:03d}" / "fleet_job.json").read_text())
        assert event["noise_multiplier"] == target["noise_multiplier"] and event["steps"] == target["steps"]
        assert event["delta"] == target["delta"]
        assert job["num_rows"] == n_base + (1 if j < 2 else 0)
        seeds.add(job["seed"])
    assert len(seeds) == 4


@pytest.mark.slow
def test_stage_scores_each_run_and_writes_the_artifact(tiny):
    from dpaudit.attacks import AttackInputs, get_attack
    from dpaudit.models import load_model
    from dpaudit.signals import compute_signals

    config, rundir, _ = tiny
    res = rundir.model("dp").read_multi_run()
    canary = read_canaries(rundir)[0]
    assert res["canary_id"] == canary.id and res["num_runs"] == 2 and res["attack"] == "loss"
    assert res["in_scores"].shape == (2,) and res["out_scores"].shape == (2,)
    fleet = rundir.multi_run_dir("dp")
    for j, expected in ((0, res["in_scores"][0]), (3, res["out_scores"][1])):
        sig = compute_signals(load_model(fleet / f"model-{j:03d}"), read_tokenizer(rundir), [canary.text],
                              max_length=config.data.max_length, progress=False)
        assert get_attack("loss").score(AttackInputs(target=sig))[0] == pytest.approx(expected, abs=1e-5)
    cp = res["clopper_pearson"]
    assert cp["num_canaries"] == 4 and cp["sound"] and cp["details"]["tp"] + cp["details"]["fn"] == 2
    assert res["ceiling"] == 0.0  # 2 runs per side can show nothing
    assert res["verdict"]["status"] == "inconclusive" and "audit.num_runs" in res["verdict"]["reason"]
    assert res["claimed_epsilon"] == pytest.approx(8.0, rel=0.02)
    assert res["train_time_s_mean"] > 0 and len(res["run_seeds"]) == 4


@pytest.mark.slow
def test_stage_resumes_and_reaches_the_report_data(tiny):
    from dpaudit.report.model import _multi_run
    from dpaudit.stages.multi_run import multi_run_model

    config, rundir, _ = tiny
    path = rundir.model("dp").multi_run_path
    before = path.stat().st_mtime_ns
    multi_run_model(rundir, config, "dp", None, default_delta=1e-5)  # in place: nothing is redone
    assert path.stat().st_mtime_ns == before
    warnings = []
    entry = _multi_run(rundir.model("dp").read_multi_run(), warnings.append)  # report["models"][i]["multi_run"]
    assert entry["clopper_pearson"]["method"] == "clopper_pearson" and "in_scores" not in entry
    assert json.loads(json.dumps(entry)) == entry and not warnings


@pytest.mark.slow
def test_multi_run_audit_catches_a_trainer_that_adds_no_noise(tmp_path):
    """16 runs per side of a trainer that claims epsilon 0.1 and adds no noise: the canary is
    learned in the runs with it (AUC 0.99 measured), so the Clopper-Pearson bound (0.56
    measured, ceiling 0.86) exceeds the claim. 5 to 8 minutes on 2 busy cores."""
    _, rundir, result = tiny_multi_run(
        tmp_path / "run", "audit.num_runs=16", "train.epochs=4",
        "models=[{name: dp, train: {trainer: 'dpaudit.train.faulty:no_noise', dp: {target_epsilon: 0.1}}}]")
    assert result.ok, result.failed
    res = rundir.model("dp").read_multi_run()
    assert res["auc"] > 0.9
    assert res["clopper_pearson"]["epsilon"] > res["claimed_epsilon"] == pytest.approx(0.1, rel=0.01)
    assert res["verdict"]["status"] == "violated"
    from dpaudit.report.data import assemble
    from dpaudit.report.html import render
    from dpaudit.stages.report import read_snapshot

    report = assemble(read_snapshot(rundir)).report
    assert report["models"][0]["multi_run"]["verdict"]["status"] == "violated"
    assert any("multi-run audit found a violation" in w for w in report["warnings"])
    assert "Multi-run audit" in render(report, {})
