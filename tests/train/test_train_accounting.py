"""dpaudit.accounting against dp_accounting called directly, the known values, calibration
and bad input."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp

from dpaudit import accounting
from dpaudit.errors import InputError


def direct(sigma, q, steps, delta, method):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    acc = pld.PLDAccountant() if method == "pld" else rdp.RdpAccountant()
    acc.compose(event)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("method", ["pld", "rdp"])
@pytest.mark.parametrize("sigma", [0.8, 2.0])
@pytest.mark.parametrize("q,steps", [(0.01, 100), (0.1, 30), (1.0, 3)])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_epsilon_equals_dp_accounting(method, sigma, q, steps, delta):
    ours = accounting.epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, method=method)
    assert ours == pytest.approx(direct(sigma, q, steps, delta, method), rel=1e-12)


def test_known_values():
    q = 256 / 60000
    steps = math.ceil(60 * 60000 / 256)
    kwargs = dict(noise_multiplier=1.1, sample_rate=q, steps=steps, delta=1e-5)
    assert accounting.epsilon(**kwargs) == pytest.approx(2.38, abs=0.01)
    assert accounting.epsilon(**kwargs, method="rdp") == pytest.approx(2.60, abs=0.01)


@pytest.mark.parametrize("method", ["pld", "rdp"])
@pytest.mark.parametrize("target", [1.0, 4.0])
def test_noise_multiplier_gives_epsilon_at_or_just_below_target(method, target):
    kwargs = dict(sample_rate=0.05, steps=50, delta=1e-5, method=method)
    sigma = accounting.noise_multiplier(target_epsilon=target, **kwargs)
    eps = accounting.epsilon(noise_multiplier=sigma, **kwargs)
    assert eps <= target
    assert eps >= target * 0.999
    assert accounting.epsilon(noise_multiplier=sigma * (1 - 1e-3), **kwargs) > target


def test_event_round_trip_through_json():
    event = accounting.make_event(noise_multiplier=1.1, sample_rate=0.01, steps=100)
    data = accounting.event_to_dict(event)
    assert data == {
        "type": "self_composed",
        "count": 100,
        "event": {"type": "poisson_sampled", "sampling_probability": 0.01,
                  "event": {"type": "gaussian", "noise_multiplier": 1.1}},
    }
    again = accounting.event_from_dict(json.loads(json.dumps(data)))
    assert again == event
    assert accounting.epsilon_from_event(again, delta=1e-5) == accounting.epsilon(
        noise_multiplier=1.1, sample_rate=0.01, steps=100, delta=1e-5
    )
    composed = dp_accounting.ComposedDpEvent([event, dp_accounting.GaussianDpEvent(3.0)])
    assert accounting.event_from_dict(json.loads(json.dumps(accounting.event_to_dict(composed)))) == composed


def test_event_from_dict_rejects_junk():
    with pytest.raises(InputError, match="unknown DP event type"):
        accounting.event_from_dict({"type": "magic"})
    with pytest.raises(InputError, match="unknown fields"):
        accounting.event_from_dict({"type": "gaussian", "noise_multiplier": 1.0, "extra": 1})
    with pytest.raises(InputError):
        accounting.event_from_dict({"noise_multiplier": 1.0})


def test_record_recomputation(tmp_path):
    event = accounting.make_event(noise_multiplier=1.0, sample_rate=0.1, steps=20)
    record = {"event": accounting.event_to_dict(event), "delta": 1e-5, "accountant": "rdp", "epsilon": 123.0}
    (tmp_path / "dp_event.json").write_text(json.dumps(record))
    expected = accounting.epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=20, delta=1e-5, method="rdp")
    assert accounting.epsilon_from_record(tmp_path) == pytest.approx(expected)  # not the logged 123
    assert accounting.epsilon_from_record(record, method="pld") < expected
    nonprivate = {"event": {"type": "non_private"}, "delta": None}
    assert accounting.epsilon_from_record(nonprivate) == math.inf
    with pytest.raises(InputError, match="no DP event record"):
        accounting.read_record(tmp_path / "missing")


def test_default_delta_and_warning():
    assert accounting.default_delta(60000) == pytest.approx(1e-6)
    assert accounting.default_delta(40) == pytest.approx(1e-3)
    assert accounting.default_delta(100) == pytest.approx(1e-3)
    for n in (1, 7, 40, 999, 12345, 10**7):
        assert accounting.default_delta(n) <= 1 / (10 * n)
        assert accounting.default_delta(n) > 1 / (100 * n)
    with pytest.warns(UserWarning, match="1/N"):
        accounting.check_delta(0.05, 20)
    assert accounting.check_delta(1e-4, 20) == 1e-4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(noise_multiplier=0.0), "sigma must be > 0"),
        (dict(noise_multiplier=-1.0), "sigma must be > 0"),
        (dict(sample_rate=0.0), r"q must be in \(0, 1\]"),
        (dict(sample_rate=1.5), r"q must be in \(0, 1\]"),
        (dict(delta=0.0), r"delta must be in \(0, 1\)"),
        (dict(delta=1.0), r"delta must be in \(0, 1\)"),
        (dict(steps=0), "steps must be a positive integer"),
        (dict(method="prv"), "unknown accountant"),
    ],
)
def test_bad_input(kwargs, message):
    base = dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1e-5)
    with pytest.raises(InputError, match=message):
        accounting.epsilon(**{**base, **kwargs})


def test_unreachable_target_epsilon():
    with pytest.raises(InputError, match="cannot be reached"):
        accounting.noise_multiplier(target_epsilon=1e-4, sample_rate=1.0, steps=1000, delta=1e-5)
    with pytest.raises(InputError, match="target epsilon"):
        accounting.noise_multiplier(target_epsilon=0.0, sample_rate=0.1, steps=10, delta=1e-5)
    with pytest.raises(InputError, match=r"q must be in"):
        accounting.noise_multiplier(target_epsilon=1.0, sample_rate=2.0, steps=10, delta=1e-5)


def test_group_epsilon_of_repeated_units():
    """r copies sampled independently: a mixture-of-Gaussians event. One copy is plain DP-SGD;
    two copies at q=0.05, sigma=1, T=200 cost about 10.7 against 4.8 for one."""
    common = dict(noise_multiplier=1.0, sample_rate=0.05, steps=200, delta=1e-5)
    single = accounting.epsilon(**common)
    one = accounting.group_epsilon(**common, group_size=1)
    assert single <= one <= single * 1.003  # a coarser pessimistic grid: an upper bound, within 0.3%
    pair = accounting.group_epsilon(**common, group_size=2)
    assert pair == pytest.approx(10.7, abs=0.05)
    # never above the group-privacy conversion: (2 eps, (1 + e^eps) delta)-DP for a pair
    assert pair <= 2 * accounting.epsilon(**{**common, "delta": 1e-5 / (1 + math.exp(single))})
    with pytest.raises(InputError):
        accounting.group_epsilon(**common, group_size=0)


@pytest.mark.parametrize(("q", "steps", "sigma", "expected"), [
    (0.0078, 383, 0.62, 1.07), (0.05, 60, 0.86, 2.40), (0.125, 24, 1.09, 3.22), (0.25, 40, 1.98, 3.84),
    (1.0, 10, 3.42, 4.00)])
def test_last_iterate_heuristic(q, steps, sigma, expected):
    """Steinke et al. 2025: the final iterate of DP-SGD at accountant epsilon 4 (delta 1e-5)
    shows at most about these epsilons on linear losses; with q = 1 it is all of epsilon."""
    common = dict(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=1e-5)
    heuristic = accounting.last_iterate_epsilon(**common)
    assert heuristic == pytest.approx(expected, abs=0.01)
    assert heuristic <= accounting.epsilon(**common) + 0.01  # post-processing of all the iterates


@pytest.mark.parametrize("sigma", [11.797, 3.4189436053153144, 1.0883847050045161])
def test_last_iterate_heuristic_at_full_batch_is_the_accountants_epsilon(sigma):
    """q = 1: the canary is in every step, the last iterate a Gaussian mechanism of sensitivity
    T and noise sigma T^(1/2), as the composition of the T steps is (the mixture PLD of
    dp_accounting fails on a single point at sigma 1.088, the demo's epsilon 16)."""
    common = dict(noise_multiplier=sigma, sample_rate=1.0, steps=10, delta=1e-5)
    assert accounting.last_iterate_epsilon(**common, step_weights=[1.0] * 10) == pytest.approx(
        accounting.epsilon(**common), rel=1e-4)


def test_last_iterate_heuristic_with_a_schedule():
    common = dict(noise_multiplier=0.96, sample_rate=0.1, steps=20, delta=1e-5)
    flat = accounting.last_iterate_epsilon(**common)
    # the general path (rounded levels) agrees with the constant one on a nearly constant schedule
    assert accounting.last_iterate_epsilon(**common, step_weights=[1.0] * 19 + [0.999]) == pytest.approx(flat, rel=1e-3)
    # a warmup puts less weight on some steps' signal: less to see than with a constant rate
    warm = accounting.last_iterate_epsilon(**common, step_weights=[(i + 1) / 20 for i in range(20)])
    assert warm < flat
    with pytest.raises(InputError, match="step_weights"):
        accounting.last_iterate_epsilon(**common, step_weights=[0.0] * 20)
