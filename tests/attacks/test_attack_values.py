"""Each attack's formula on small hand-checked inputs; AttackInputs validation."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from scipy import stats

from dpaudit.attacks import AttackInputs, get_attack
from dpaudit.errors import InputError
from dpaudit.signals import TokenSignals


def sig(rows, width=None, mean=None, std=None):
    """TokenSignals from ragged rows of log-probs."""
    width = width or max(len(r) for r in rows)
    lp = np.zeros((len(rows), width), dtype=np.float32)
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        lp[i, : len(r)] = r
        mask[i, : len(r)] = True
    return TokenSignals(logprob=lp, mask=mask, mean=mean, std=std)


def seq(values):
    """Signals whose mean log-prob per text is ``values`` (two equal tokens each)."""
    return sig([[v, v] for v in values])


def test_loss_is_mean_logprob():
    s = sig([[-1.0, -3.0], [-0.5]])
    np.testing.assert_allclose(get_attack("loss").score(AttackInputs(target=s)), [-2.0, -0.5])


def test_min_k_lowest_fraction():
    lp = np.array([[-1, -5, -3, -2, -4, -99]], dtype=np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 0]], dtype=bool)  # the -99 is padding
    inputs = AttackInputs(target=TokenSignals(logprob=lp, mask=mask))
    assert get_attack("min_k", k=0.4).score(inputs)[0] == pytest.approx(-4.5)
    assert get_attack("min_k", k=0.1).score(inputs)[0] == pytest.approx(-5.0)  # at least one token
    assert get_attack("min_k", k=1.0).score(inputs)[0] == pytest.approx(-3.0)
    assert get_attack("min_k", k=0.2).score(inputs)[0] == pytest.approx(-5.0)


def test_min_k_pp_standardises_then_takes_lowest():
    lp = np.array([[-1.0, -2.0, -3.0, -4.0, -5.0]], dtype=np.float32)
    mean = np.array([[-2.0, -2.0, -1.0, -6.0, -5.0]], dtype=np.float32)
    std = np.array([[1.0, 2.0, 0.5, 2.0, 1.0]], dtype=np.float32)
    s = TokenSignals(logprob=lp, mask=np.ones_like(lp, dtype=bool), mean=mean, std=std)
    z = np.sort((lp - mean) / std, axis=1)[0]  # [-4, 0, 0, 1, 1]
    inputs = AttackInputs(target=s)
    assert get_attack("min_k_pp", k=0.4).score(inputs)[0] == pytest.approx(z[:2].mean())
    assert get_attack("min_k_pp", k=1.0).score(inputs)[0] == pytest.approx(z.mean())
    assert not get_attack("min_k_pp").can_run(AttackInputs(target=sig([[-1.0, -2.0]])))


def test_zlib_ratio():
    texts = ["aaaaaaaaaaaaaaaaaaaaaaaa", "the quick brown fox jumps"]
    s = sig([[-2.0, -2.0], [-1.0, -3.0]])
    got = get_attack("zlib").score(AttackInputs(target=s, texts=texts))
    want = [-2.0 / len(zlib.compress(t.encode())) for t in texts]
    np.testing.assert_allclose(got, want)


def test_reference_difference_ratio_and_keep():
    target = seq([-1.0, -2.0, -3.0])
    refs = [seq([-2.0, -2.0, -2.0]), seq([-4.0, -3.0, -6.0])]
    inputs = AttackInputs(target=target, references=refs)
    np.testing.assert_allclose(get_attack("reference").score(inputs), [2.0, 0.5, 1.0])
    np.testing.assert_allclose(
        get_attack("reference", mode="ratio").score(inputs), [-1 / 3, -2 / 2.5, -3 / 4]
    )
    keep = np.array([[True, False, False], [False, False, True]])  # only out models count
    inputs = AttackInputs(target=target, references=refs, reference_keep=keep)
    np.testing.assert_allclose(get_attack("reference").score(inputs), [-1 + 4, -2 + 2.5, -3 + 2])


def lira_inputs():
    target = seq([-1.0, -2.0, -1.5])
    ref_vals = np.array(
        [
            [-1.2, -2.5, -1.0],
            [-1.8, -2.1, -2.0],
            [-1.1, -2.9, -1.4],
            [-2.0, -2.0, -2.2],
        ]
    )
    keep = np.array([[1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=bool)
    return AttackInputs(target=target, references=[seq(r) for r in ref_vals], reference_keep=keep), ref_vals, keep


def test_lira_online_fixed_and_per_example():
    inputs, vals, keep = lira_inputs()
    phi = np.array([-1.0, -2.0, -1.5])
    mu_in = np.array([vals[keep[:, i], i].mean() for i in range(3)])
    mu_out = np.array([vals[~keep[:, i], i].mean() for i in range(3)])
    # pooled within-candidate variances, 2 models per group and candidate: df = 6 - 3
    var_in = sum(((vals[keep[:, i], i] - mu_in[i]) ** 2).sum() for i in range(3)) / 3
    var_out = sum(((vals[~keep[:, i], i] - mu_out[i]) ** 2).sum() for i in range(3)) / 3
    want = stats.norm.logpdf(phi, mu_in, np.sqrt(var_in)) - stats.norm.logpdf(phi, mu_out, np.sqrt(var_out))
    got = get_attack("lira_online").score(inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5)

    s_in = np.array([vals[keep[:, i], i].std(ddof=1) for i in range(3)])
    s_out = np.array([vals[~keep[:, i], i].std(ddof=1) for i in range(3)])
    want = stats.norm.logpdf(phi, mu_in, s_in) - stats.norm.logpdf(phi, mu_out, s_out)
    np.testing.assert_allclose(get_attack("lira_online", variance="per_example").score(inputs), want, rtol=1e-5)


def test_lira_offline_is_minus_log_p_value():
    inputs, vals, keep = lira_inputs()
    phi = np.array([-1.0, -2.0, -1.5])
    mu_out = np.array([vals[~keep[:, i], i].mean() for i in range(3)])
    var_out = sum(((vals[~keep[:, i], i] - mu_out[i]) ** 2).sum() for i in range(3)) / 3
    want = -stats.norm.logsf(phi, mu_out, np.sqrt(var_out))
    np.testing.assert_allclose(get_attack("lira_offline").score(inputs), want, rtol=1e-5)
    # without reference_keep every reference is "out"
    no_keep = AttackInputs(target=inputs.target, references=inputs.references)
    mu = vals.mean(0)
    var = ((vals - mu) ** 2).sum() / (12 - 3)
    want = -stats.norm.logsf(phi, mu, np.sqrt(var))
    np.testing.assert_allclose(get_attack("lira_offline").score(no_keep), want, rtol=1e-5)


def test_lira_fills_a_missing_group_by_the_average_gap():
    target = seq([-1.0, -2.0, -1.5])
    vals = np.array([[-1.0, -2.0, -1.2], [-1.6, -2.4, -1.4]])
    keep = np.array([[True, True, True], [False, True, False]])  # candidate 1 has no out model
    inputs = AttackInputs(target=target, references=[seq(r) for r in vals], reference_keep=keep)
    gap = np.mean([-1.0 - -1.6, -1.2 - -1.4])
    mu_out_1 = vals[:, 1].mean() - gap
    # only candidate 1's two "in" values give a degree of freedom; the out group borrows it
    sd = np.sqrt(((vals[:, 1] - vals[:, 1].mean()) ** 2).sum())
    want = stats.norm.logpdf(-2.0, vals[:, 1].mean(), sd) - stats.norm.logpdf(-2.0, mu_out_1, sd)
    assert get_attack("lira_online").score(inputs)[1] == pytest.approx(want)
    # no degrees of freedom at all: sigma = 1 for both groups
    one_each = AttackInputs(target=target, references=inputs.references, reference_keep=np.array([[True, False, True], [False, True, False]]))
    v = vals
    want = stats.norm.logpdf(-1.0, v[0, 0], 1) - stats.norm.logpdf(-1.0, v[1, 0], 1)
    assert get_attack("lira_online").score(one_each)[0] == pytest.approx(want)
    with pytest.raises(InputError, match="reference_keep"):
        all_in = AttackInputs(target=target, references=inputs.references, reference_keep=np.ones((2, 3), bool))
        get_attack("lira_online").score(all_in)


def brute_rmia(r_x, r_z, gamma, leave_one_out):
    out = []
    for i, rx in enumerate(r_x):
        zs = [rz for j, rz in enumerate(r_z) if not (leave_one_out and j == i)]
        out.append(np.mean([np.exp(rx - rz) > gamma for rz in zs]))
    return np.array(out)


@pytest.mark.parametrize("gamma", [1.0, 0.5, 2.0])
def test_rmia_against_brute_force(gamma):
    rng = np.random.default_rng(0)
    n, m, nz = 30, 4, 25
    t = rng.uniform(-4, -1, n)
    refs = rng.uniform(-4, -1, (m, n))
    keep = rng.random((m, n)) < 0.5
    pt = rng.uniform(-4, -1, nz)
    prefs = rng.uniform(-4, -1, (m, nz))
    a = 0.6

    def marginal_x(i):
        pin, pout = np.exp(refs[keep[:, i], i]), np.exp(refs[~keep[:, i], i])
        if len(pin) and len(pout):
            return 0.5 * (pin.mean() + pout.mean())
        if len(pout):
            return 0.5 * ((1 + a) * pout.mean() + 1 - a)
        return pin.mean()

    r_x = np.array([t[i] - np.log(marginal_x(i)) for i in range(n)])
    r_z = pt - np.log(0.5 * ((1 + a) * np.exp(prefs).mean(0) + 1 - a))
    attack = get_attack("rmia", gamma=gamma, a=a)
    with_pop = AttackInputs(
        target=seq(t), references=[seq(r) for r in refs], reference_keep=keep,
        population_target=seq(pt), population_references=[seq(r) for r in prefs],
    )
    np.testing.assert_allclose(attack.score(with_pop), brute_rmia(r_x, r_z, gamma, False), atol=1e-5)
    loo = AttackInputs(target=seq(t), references=[seq(r) for r in refs], reference_keep=keep)
    np.testing.assert_allclose(attack.score(loo), brute_rmia(r_x, r_x, gamma, True), atol=1e-5)


def test_rmia_offline_a_default():
    rng = np.random.default_rng(1)
    t, refs = rng.uniform(-4, -1, 10), rng.uniform(-4, -1, (3, 10))
    offline = AttackInputs(target=seq(t), references=[seq(r) for r in refs])
    assert get_attack("rmia").offline_a(offline) == 1.0
    assert get_attack("rmia", a=0.3).offline_a(offline) == 0.3
    # a = 1: Pr(x) = Pr_out(x), so the ranking is that of log p(x) - log mean exp(ref)
    r = t - np.log(np.exp(refs).mean(0))
    scores = get_attack("rmia").score(offline)
    assert (np.argsort(scores, kind="stable") == np.argsort(r, kind="stable")).all()
    # with in/out models, a is fitted: 1 - Pr_in = a (1 - Pr_out) exactly when built that way
    p_out = np.exp(rng.uniform(-4, -1, 10))
    p_in = 1 - 0.8 * (1 - p_out)
    keep = np.array([[True] * 10, [False] * 10])
    fitted = AttackInputs(target=seq(t), references=[seq(np.log(p_in)), seq(np.log(p_out))], reference_keep=keep)
    assert get_attack("rmia").offline_a(fitted) == pytest.approx(0.8, abs=1e-5)


@pytest.mark.parametrize(
    "name,params",
    [
        ("min_k", {"k": 0}),
        ("min_k", {"k": 1.5}),
        ("min_k_pp", {"k": "0.2"}),
        ("lira_online", {"variance": "global"}),
        ("lira_offline", {"variance": None}),
        ("rmia", {"gamma": 0}),
        ("rmia", {"a": 1.5}),
        ("reference", {"mode": "log"}),
    ],
)
def test_bad_parameters(name, params):
    with pytest.raises(InputError):
        get_attack(name, **params)


def test_attack_inputs_validation():
    t = seq([-1.0, -2.0])
    r3 = seq([-1.0, -2.0, -3.0])
    with pytest.raises(InputError):
        AttackInputs(target=t, texts=["only one"])
    with pytest.raises(InputError):
        AttackInputs(target=t, texts="ab")
    with pytest.raises(InputError):
        AttackInputs(target=t, references=[r3])
    with pytest.raises(InputError):
        AttackInputs(target=t, references=[t], reference_keep=np.ones((2, 2), bool))
    with pytest.raises(InputError):
        AttackInputs(target=t, references=[t], reference_keep=np.ones((1, 2), int))
    with pytest.raises(InputError):
        AttackInputs(target=t, reference_keep=np.ones((0, 2), bool))
    with pytest.raises(InputError):
        AttackInputs(target=t, references=[t], population_target=r3)  # population_references missing
    with pytest.raises(InputError):
        AttackInputs(target=t, population_references=[r3])
    with pytest.raises(InputError):
        AttackInputs(target=t, references=[t], population_target=r3, population_references=[t])
    with pytest.raises(InputError):
        AttackInputs(target=np.zeros((2, 2)))
    ok = AttackInputs(target=t, texts=["a", "b"], references=[t], reference_keep=np.array([[True, False]]))
    assert ok.available() == {"texts", "references", "reference_keep"}
    with pytest.raises(ValueError):
        ok.reference_keep[0, 0] = False  # read-only


def test_missing_requirement_is_named():
    inputs = AttackInputs(target=seq([-1.0, -2.0]))
    with pytest.raises(InputError, match="texts"):
        get_attack("zlib").score(inputs)
    with pytest.raises(InputError, match="reference_keep"):
        get_attack("lira_online").score(AttackInputs(target=seq([-1.0, -2.0]), references=[seq([-1.0, -1.0])]))
    with pytest.raises(InputError, match="references"):
        get_attack("rmia").score(inputs)


def test_nan_signals_are_refused():
    s = sig([[-1.0, np.nan], [-1.0, -2.0]])
    with pytest.raises(InputError, match="NaN"):
        get_attack("loss").score(AttackInputs(target=s))
