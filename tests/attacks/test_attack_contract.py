"""One contract, every registered attack: shape, direction, separability, determinism,
no mutation, permutation equivariance, parameters, requirements."""

from __future__ import annotations

import string

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from dpaudit.attacks import AttackInputs, attack_class, available_attacks, get_attack, runnable_attacks
from dpaudit.errors import InputError
from dpaudit.signals import TokenSignals

N, M, N_POP, WIDTH = 200, 16, 120, 40


def model_signals(rng, base, shift, lengths):
    """Token signals of one model: text difficulty ``base`` [n] plus a membership shift,
    per-model sequence-level noise and per-token noise; Min-K%++ statistics that do not
    move with membership."""
    n = len(base)
    mask = np.arange(WIDTH)[None, :] < lengths[:, None]
    level = base + shift + 0.05 * rng.standard_normal(n)
    lp = np.minimum(level[:, None] + 0.3 * rng.standard_normal((n, WIDTH)), -1e-3)
    mean = base[:, None] - 0.5 + 0.05 * rng.standard_normal((n, WIDTH))
    std = 1.0 + 0.05 * np.abs(rng.standard_normal((n, WIDTH)))
    z = np.float32(0)
    return TokenSignals(
        logprob=np.where(mask, lp, z), mask=mask, mean=np.where(mask, mean, z), std=np.where(mask, std, z)
    )


def synthetic(seed: int, delta: float, *, keep: bool = True, population: bool = True):
    """Candidates, half members; members' log-probs are ``delta`` higher under the target
    and under the reference models that trained on them (``keep``)."""
    rng = np.random.default_rng(seed)
    member = np.zeros(N, dtype=bool)
    member[rng.permutation(N)[: N // 2]] = True
    base = rng.uniform(-4.0, -3.0, N)
    lengths = rng.integers(20, WIDTH + 1, N)
    texts = ["".join(rng.choice(list(string.ascii_lowercase), 200)) for _ in range(N)]
    target = model_signals(rng, base, delta * member, lengths)
    keep_mat = rng.random((M, N)) < 0.5
    if not keep:
        keep_mat[:] = False
    refs = [model_signals(rng, base, delta * keep_mat[j], lengths) for j in range(M)]
    kw = {}
    if population:
        pbase = rng.uniform(-4.0, -3.0, N_POP)
        plen = rng.integers(20, WIDTH + 1, N_POP)
        kw = dict(
            population_target=model_signals(rng, pbase, np.zeros(N_POP), plen),
            population_references=[model_signals(rng, pbase, np.zeros(N_POP), plen) for _ in range(M)],
        )
    inputs = AttackInputs(
        target=target, texts=texts, references=refs, reference_keep=keep_mat if keep else None, **kw
    )
    return inputs, member


VARIANTS = {
    "full": dict(keep=True, population=True),
    "online_no_population": dict(keep=True, population=False),
    "offline_population": dict(keep=False, population=True),
    "offline": dict(keep=False, population=False),
}


def cases():
    return [(name, v) for name in available_attacks() for v in VARIANTS]


def runnable(name, variant, delta, seed=0):
    inputs, member = synthetic(seed, delta, **VARIANTS[variant])
    attack = get_attack(name)
    if not attack.can_run(inputs):
        pytest.skip(f"{name} cannot run on variant {variant}")
    return attack, inputs, member


def snapshot(inputs: AttackInputs):
    arrays = []
    for s in [inputs.target, *inputs.references, inputs.population_target, *inputs.population_references]:
        if s is not None:
            arrays += [a.copy() for a in (s.logprob, s.mask, s.mean, s.std)]
    if inputs.reference_keep is not None:
        arrays.append(inputs.reference_keep.copy())
    return arrays, tuple(inputs.texts)


def test_registry_has_the_shipped_attacks():
    assert set(available_attacks()) >= {
        "loss", "zlib", "reference", "min_k", "min_k_pp", "lira_online", "lira_offline", "rmia",
    }


@pytest.mark.parametrize("name,variant", cases())
def test_contract(name, variant):
    attack, inputs, member = runnable(name, variant, delta=0.3)
    before = snapshot(inputs)

    scores = attack.score(inputs)
    assert isinstance(scores, np.ndarray) and scores.dtype == np.float64 and scores.shape == (N,)
    assert np.isfinite(scores).all()
    # higher = member on a weakly separable input
    auc = roc_auc_score(member, scores)
    assert auc > 0.6, auc
    # deterministic: same object twice, and a fresh instance with the same parameters
    np.testing.assert_array_equal(scores, attack.score(inputs))
    np.testing.assert_array_equal(scores, type(attack)(**attack.get_params()).score(inputs))
    # inputs untouched
    after = snapshot(inputs)
    assert after[1] == before[1]
    for a, b in zip(before[0], after[0]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name,variant", cases())
def test_perfectly_separable_gives_auc_one(name, variant):
    attack, inputs, member = runnable(name, variant, delta=2.0)
    assert roc_auc_score(member, attack.score(inputs)) == 1.0


@pytest.mark.parametrize("name", available_attacks())
def test_permutation_equivariant(name):
    inputs, _ = synthetic(1, 0.3)
    attack = get_attack(name)
    perm = np.random.default_rng(5).permutation(N)
    permuted = AttackInputs(
        target=inputs.target.select(perm),
        texts=[inputs.texts[i] for i in perm],
        references=[r.select(perm) for r in inputs.references],
        reference_keep=inputs.reference_keep[:, perm],
        population_target=inputs.population_target,
        population_references=inputs.population_references,
    )
    np.testing.assert_allclose(attack.score(permuted), attack.score(inputs)[perm], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", available_attacks())
def test_parameters_and_requirements(name):
    cls = attack_class(name)
    attack = get_attack(name)
    assert attack.name == name and cls.name == name
    assert isinstance(cls.requires, frozenset)
    params = attack.get_params()
    assert type(attack)(**params).get_params() == params
    assert name in repr(attack) or type(attack).__name__ in repr(attack)
    with pytest.raises(InputError, match="no parameter"):
        get_attack(name, not_a_parameter=1)

    # bare inputs: target signals without distribution statistics
    full, _ = synthetic(2, 0.3)
    bare = AttackInputs(target=TokenSignals(logprob=full.target.logprob, mask=full.target.mask))
    if attack.can_run(bare):
        assert attack.score(bare).shape == (N,)
    else:
        missing = attack.missing(bare)
        assert missing
        with pytest.raises(InputError, match=missing[0].split()[0]):
            attack.score(bare)
    assert (name in runnable_attacks(bare)) == attack.can_run(bare)
    assert name in runnable_attacks(full)


@pytest.mark.parametrize("name", available_attacks())
def test_refuses_texts_without_scored_tokens(name):
    inputs, _ = synthetic(3, 0.3)
    t = inputs.target
    mask = t.mask.copy()
    mask[7] = False
    broken = AttackInputs(
        target=TokenSignals(logprob=t.logprob, mask=mask, mean=t.mean, std=t.std),
        texts=inputs.texts,
        references=inputs.references,
        reference_keep=inputs.reference_keep,
        population_target=inputs.population_target,
        population_references=inputs.population_references,
    )
    with pytest.raises(InputError, match="no scored token"):
        get_attack(name).score(broken)
