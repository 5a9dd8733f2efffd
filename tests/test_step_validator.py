"""White-box validation of one DP-SGD step (``dpaudit validate --step``, issue 12).

The statistics against a naive reference and against simulations with a known mu; the
validator on the toolkit's step (consistent, its estimate covering 1/S), on faulty steps
(violated), on Opacus's optimizer step; the run-level epsilon; the CLI and the report.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from dpaudit.audit.bounds import gdp_mu_lower_bound
from dpaudit.audit.two_sample import (
    gaussian_mu_estimate,
    two_sample_mu_bound,
    two_sample_mu_ceiling,
)
from dpaudit.errors import InputError
from dpaudit.stages.validate_step import validate_step
from dpaudit.train.engine import DPSGDEngine
from dpaudit.train.step import make_step

pytestmark = pytest.mark.slow  # the long suite: python -m pytest -m slow (.ci/run runs it)

S, C, B = 2.0, 0.1, 4  # claimed mu = 1/S = 0.5


# --------------------------------------------------------------------------- statistics


def _naive(x_in, x_out, significance, seed):
    """The same split, selection and count, with plain loops over every threshold."""
    rng = np.random.default_rng(seed)
    p_in, p_out = rng.permutation(len(x_in)), rng.permutation(len(x_out))
    sel_in, ev_in = x_in[p_in[: len(x_in) // 2]], x_in[p_in[len(x_in) // 2:]]
    sel_out, ev_out = x_out[p_out[: len(x_out) // 2]], x_out[p_out[len(x_out) // 2:]]
    best = (-1.0, None)
    for col in range(x_in.shape[1]):
        for sign in (1, -1):
            a, b = sign * sel_in[:, col], sign * sel_out[:, col]
            values = sorted(set(a) | set(b))
            cands = [values[0] - 1.0] + [(u + v) / 2 for u, v in itertools.pairwise(values)]
            scores = []
            for t in cands:
                tp, fp = int((a > t).sum()), int((b > t).sum())
                scores.append(gdp_mu_lower_bound(tp=tp, fp=fp, tn=len(b) - fp, fn=len(a) - tp,
                                                 significance=significance))
            top = [t for t, s in zip(cands, scores) if s == max(scores)]
            if max(scores) > best[0]:
                best = (max(scores), (col, sign, top[len(top) // 2]))
    col, sign, t = best[1]
    tp, fp = int((sign * ev_in[:, col] > t).sum()), int((sign * ev_out[:, col] > t).sum())
    return gdp_mu_lower_bound(tp=tp, fp=fp, tn=len(ev_out) - fp, fn=len(ev_in) - tp, significance=significance)


def test_two_sample_bound_matches_naive_reference():
    rng = np.random.default_rng(3)
    for mu in (0.0, 1.0, 3.0):
        x_in = rng.normal(0, 1, (30, 3)) + [mu, mu / 2, 0.0]
        x_out = rng.normal(0, 1, (26, 3))
        got = two_sample_mu_bound(in_samples=x_in, out_samples=x_out, significance=0.05, seed=7)
        assert got.mu == pytest.approx(_naive(x_in, x_out, 0.05, 7), abs=1e-12)
        assert got.tp + got.fn == 15 and got.fp + got.tn == 13 and got.num_selection == (15, 13)


def test_two_sample_bound_is_sound_and_has_power_in_simulation():
    """Correct Gaussian steps with a known mu: the bound exceeds mu no more often than 5% allows
    (with one candidate statistic, and with a selection among several), and it is not trivial."""
    alpha, trials, n = 0.05, 300, 100
    rng = np.random.default_rng(0)
    allowed = stats.binom.ppf(0.999, trials, alpha)
    for mu, columns in ((1.0, 1), (2.0, 1), (1.0, 6)):
        shift = np.r_[mu, np.linspace(0.0, mu, columns)[:-1]] if columns > 1 else np.array([mu])
        bounds = np.array([two_sample_mu_bound(in_samples=rng.normal(0, 1, (n, columns)) + shift,
                                               out_samples=rng.normal(0, 1, (n, columns)), significance=alpha,
                                               seed=t).mu for t in range(trials)])
        assert (bounds > mu).sum() <= allowed, (mu, columns, (bounds > mu).sum())
        assert np.median(bounds) > 0.1 * mu  # a bound stuck at 0 would pass the first check


def test_ceiling_is_a_perfect_separation():
    x_in, x_out = np.arange(10.0, 50.0), np.arange(0.0, 30.0) - 100
    got = two_sample_mu_bound(in_samples=x_in, out_samples=x_out)
    assert got.fp == 0 and got.fn == 0
    assert got.mu == got.ceiling == pytest.approx(two_sample_mu_ceiling(num_in=40, num_out=30))
    # a constant statistic shows nothing
    assert two_sample_mu_bound(in_samples=np.zeros(20), out_samples=np.zeros(20)).mu == 0.0


def test_gaussian_estimate_interval_covers_in_simulation():
    rng = np.random.default_rng(1)
    trials, mu = 300, 0.7
    covered = 0
    for _ in range(trials):
        est, low, high = gaussian_mu_estimate(in_samples=rng.normal(2 * mu, 2.0, 80),
                                              out_samples=rng.normal(0, 2.0, 80))
        assert low < est < high
        covered += low <= mu <= high
    assert covered >= stats.binom.ppf(0.001, trials, 0.95)
    assert gaussian_mu_estimate(in_samples=np.ones(10), out_samples=np.zeros(10)) == (math.inf,) * 3


def test_two_sample_inputs_are_checked():
    with pytest.raises(InputError, match="shape"):
        two_sample_mu_bound(in_samples=[1.0, 2.0], out_samples=np.zeros(10))
    with pytest.raises(InputError, match="same columns"):
        two_sample_mu_bound(in_samples=np.zeros((10, 2)), out_samples=np.zeros((10, 3)))
    with pytest.raises(InputError, match="NaN"):
        two_sample_mu_bound(in_samples=np.r_[np.zeros(9), np.nan], out_samples=np.zeros(10))


# --------------------------------------------------------------------------- the validator


class TenthNoiseEngine(DPSGDEngine):
    def noise_std(self):
        return super().noise_std() / 10


class NoClippingEngine(DPSGDEngine):
    def clip_factors(self, norms):
        return norms * 0 + 1


tenth_noise_step = make_step(TenthNoiseEngine)
no_clipping_step = make_step(NoClippingEngine)


def _validate(step, *, repetitions=40, c=C, **kw):
    return validate_step(step=step, noise_multiplier=S, max_grad_norm=c, expected_batch_size=B,
                         repetitions=repetitions, **kw)


def _check_consistent(result):
    assert result["verdict"] == "consistent" and result["exit_code"] == 0, result["reason"]
    assert result["mu_lower_bound"] <= result["claimed_mu"] == 1 / S < result["mu_ceiling"]
    low, high = result["estimate"]["mu_interval"]
    assert low <= 1 / S <= high  # the Gaussian estimate of a correct step covers 1/S
    assert high - low < 1.0  # and says something
    assert result["setting"]["canary_gradient_norm"] >= 10 * C


def test_own_step_is_consistent_and_its_estimate_covers_one_over_s():
    result = _validate("dpaudit.train:dpsgd_step", repetitions=50, sample_rate=0.05, steps=50, accountant="rdp")
    _check_consistent(result)
    assert result["claimed_epsilon"] > result["epsilon_lower_bound"] >= 0
    run = result["run"]  # over a run: the estimate's interval covers the claimed run epsilon too
    low, high = run["estimate"]["epsilon_interval"]
    assert run["epsilon_lower_bound"] <= run["claimed_epsilon"] and low <= run["claimed_epsilon"] <= high
    assert set(result) >= {"verdict", "epsilon_lower_bound", "claimed_epsilon", "mu_lower_bound", "claimed_mu",
                           "repetitions"}


@pytest.mark.parametrize("step, c", [(tenth_noise_step, C), (no_clipping_step, C),
                                     ("dpaudit.train.faulty:unscaled_noise_step", 20.0),
                                     ("dpaudit.train.faulty:reused_noise_step", C)],
                         ids=["noise/10", "no clipping", "noise not times C, C=20", "noise reused across calls"])
def test_faulty_steps_are_violated(step, c):
    result = _validate(step, c=c)
    assert result["verdict"] == "violated" and result["exit_code"] == 1, result["reason"]
    assert result["mu_lower_bound"] > 1 / S and result["epsilon_lower_bound"] > result["claimed_epsilon"]
    assert result["setting"]["canary_gradient_norm"] >= 10 * c  # for C = 20 the canary was made larger


def test_opacus_optimizer_step_is_consistent():
    pytest.importorskip("opacus")
    _check_consistent(_validate("dpaudit.train.opacus:dpsgd_step", repetitions=40))


def test_too_few_repetitions_are_inconclusive_and_bad_input_is_refused():
    # claimed mu = 1/0.4 = 2.5 is above what 8 runs a side can show
    result = validate_step(step="dpaudit.train:dpsgd_step", noise_multiplier=0.4, max_grad_norm=C,
                           expected_batch_size=B, repetitions=8)
    assert result["verdict"] == "inconclusive" and result["exit_code"] == 3 and result["mu_ceiling"] <= 2.5
    with pytest.raises(InputError, match="noise-multiplier"):
        validate_step(step="dpaudit.train:dpsgd_step", noise_multiplier=0, max_grad_norm=C, expected_batch_size=B)
    with pytest.raises(InputError, match="MODULE:FUNCTION"):
        validate_step(step="dpaudit.train", noise_multiplier=S, max_grad_norm=C, expected_batch_size=B)
    with pytest.raises(InputError, match="generator"):
        validate_step(step="dpaudit.train:dpsgd", noise_multiplier=S, max_grad_norm=C, expected_batch_size=B)
    with pytest.raises(InputError, match="go together"):
        validate_step(step="dpaudit.train:dpsgd_step", noise_multiplier=S, max_grad_norm=C, expected_batch_size=B,
                      sample_rate=0.1)


def test_run_epsilon_the_measured_noise_implies():
    from dpaudit import accounting

    q, t, delta, rdp = 0.05, 50, 1e-5, {"method": "rdp"}
    result = validate_step(step="dpaudit.train.faulty:mean_noise_on_sum_step", noise_multiplier=8.0, max_grad_norm=C,
                           expected_batch_size=16, repetitions=40, sample_rate=q, steps=t, delta=delta,
                           accountant="rdp")  # noise 16 times too small: true noise multiplier 0.5
    run = result["run"]
    assert result["verdict"] == "violated" and run["accountant"] == "rdp" and not run["at_least"]
    assert run["noise_multiplier_upper_bound"] == pytest.approx(1 / result["mu_lower_bound"])
    assert run["epsilon_lower_bound"] == pytest.approx(accounting.epsilon(
        noise_multiplier=1 / result["mu_lower_bound"], sample_rate=q, steps=t, delta=delta, **rdp))
    assert run["claimed_epsilon"] == pytest.approx(accounting.epsilon(noise_multiplier=8.0, sample_rate=q, steps=t,
                                                                      delta=delta, **rdp))
    assert run["epsilon_lower_bound"] > run["claimed_epsilon"]


# --------------------------------------------------------------------------- CLI and report


def test_cli_exit_codes_and_json(tmp_path, capsys):
    from dpaudit.cli import main

    common = ["--noise-multiplier", str(S), "--max-grad-norm", str(C), "--expected-batch-size", str(B),
              "--repetitions", "16", "--json"]
    assert main(["validate", "--step", "dpaudit.train.faulty:no_noise_step", *common, "--out", str(tmp_path)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "violated" and out["repetitions"] == 16 and out["claimed_mu"] == 1 / S
    assert (tmp_path / "step_audit.json").is_file() and (tmp_path / "step_audit.npz").is_file()
    assert main(["validate", "--step", "dpaudit.train:dpsgd_step", "--noise-multiplier", "2"]) == 2
    assert "--max-grad-norm" in capsys.readouterr().err
    assert main(["validate", "--trainer", "dpaudit.train:dpsgd", "--noise-multiplier", "2", "--epsilon", "1",
                 "--delta", "1e-5"]) == 2


def test_report_shows_the_step_audit(tmp_path):
    from dpaudit.config import load_config
    from dpaudit.report.data import assemble
    from dpaudit.report.html import render
    from dpaudit.rundir import RunDir, write_json_atomic
    from dpaudit.stages.report import read_snapshot
    from dpaudit.train.loop import DPSGD
    from dpaudit.train.plan import PrivacyPlan, dp_record

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.write_config(load_config("tiny", overrides=["models=[{name: m}]"]))
    assert assemble(read_snapshot(run)).report["step_audit"] is None
    plan = PrivacyPlan(noise_multiplier=S, max_grad_norm=C, delta=1e-3, sample_rate=0.05, steps=20, num_units=80,
                       unit="example", accountant="rdp", expected_batch_size=B, target_epsilon=None)
    run.model("m").root.mkdir(parents=True)
    write_json_atomic(run.model("m").dp_event_path, dp_record(trainer=DPSGD.name, sampler=DPSGD.sampler, plan=plan,
                                                                  num_units=80, steps=20, batch_size=B).to_dict())
    result = validate_step(step="dpaudit.train:dpsgd_step", noise_multiplier=S, max_grad_norm=C,
                           expected_batch_size=B, repetitions=16, out=run.root, delta=1e-3, accountant="rdp")
    assert result["run"]["model"] == "m" and result["run"]["steps"] == 20  # q and T of m's dp_event.json
    report = assemble(read_snapshot(run)).report
    assert report["step_audit"]["verdict"] == result["verdict"]
    assert report["step_audit"]["run"]["sample_rate"] == pytest.approx(0.05)
    html = render(report, {})
    assert 'id="step_audit"' in html and "dpaudit.train:dpsgd_step" in html and "implies ε ≥" in html
