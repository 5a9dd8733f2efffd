"""Exposure of Secret Sharer canaries (Carlini et al. 2019): the prefix-tree scorer against a
naive teacher-forced pass, exact enumeration against the rank formula, the skew-normal
estimate against enumeration on a small space and against simulated log-likelihoods of a
known distribution, and seeded sampling against the model's own probabilities."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.extraction import (
    candidate_logprobs,
    continuation_scores,
    encode_continuations,
    enumerated_exposure,
    exposure,
    sample_continuations,
    sampled_exposure,
    secret_space,
)

PREFIX = "Patient code"




@pytest.fixture(scope="module")
def lm():
    """A tiny GPT-2 and tokenizer, trained a few steps on four canaries ``PREFIX + " dddd"``
    (two of them repeated) so that their exposures differ from a random secret's."""
    from dpaudit.data.tokenizer import train_tokenizer
    from dpaudit.models import build_model

    rng = np.random.default_rng(0)
    texts = [f"{PREFIX} {int(x):04d} and the MRN {int(y):08d}." for x, y in zip(rng.integers(0, 10**4, 200),
                                                                                 rng.integers(0, 10**8, 200))]
    tok = train_tokenizer(texts, vocab_size=300)
    model = build_model(size="tiny", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, seed=0)
    secrets = ["4821", "0937", "5150", "7302"]
    train = [f"{PREFIX} {s}" for s in secrets for _ in range(1 + 7 * (s in secrets[:2]))] + texts[:40]
    batch = tok(train, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(40):
        loss = model(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, tok, secrets


def _space(tok, digits: int):
    space = secret_space("#" * digits)
    pre, tgt = encode_continuations(tok, prefixes=[PREFIX] * len(space), targets=[" " + s for s in space])
    return space, pre[0], tgt


def test_secret_space_enumerates_the_pattern_in_order():
    space = secret_space("?#-#")
    assert len(space) == 26 * 100 and len(set(space)) == len(space)
    assert space[:3] == ["A0-0", "A0-1", "A0-2"] and space[-1] == "Z9-9" and space == sorted(space)
    with pytest.raises(InputError):
        secret_space("abc")


def test_tree_scores_equal_a_naive_pass_and_pruning_is_exact_above_the_threshold(lm):
    model, tok, _ = lm
    space, prefix, tgt = _space(tok, 3)
    naive = continuation_scores(model, tok, prefixes=[PREFIX] * len(space), targets=[" " + s for s in space],
                                device="cpu").sum_logprob()
    tree = candidate_logprobs(model, prefix_ids=prefix, candidate_ids=tgt, batch_size=37, device="cpu")
    np.testing.assert_allclose(tree, naive, atol=1e-4)
    cut = float(np.quantile(naive, 0.9))
    pruned = candidate_logprobs(model, prefix_ids=prefix, candidate_ids=tgt, threshold=cut, device="cpu")
    keep = np.isfinite(pruned)
    assert keep.sum() >= 90 and (naive[~keep] < cut + 1e-6).all()
    np.testing.assert_allclose(pruned[keep], naive[keep], atol=1e-4)
    assert keep[naive > cut + 1e-4].all()


def test_enumerated_exposure_is_the_exact_rank(lm):
    model, tok, secrets = lm
    space, prefix, tgt = _space(tok, 4)
    naive = candidate_logprobs(model, prefix_ids=prefix, candidate_ids=tgt, device="cpu")
    for s in secrets + ["1234"]:
        i = space.index(s)
        got = enumerated_exposure(model, prefix_ids=prefix, candidate_ids=tgt, secret_index=i, device="cpu")
        others = np.delete(naive, i)
        want = exposure(canary_logprob=naive[i], candidate_logprobs=others, secret_space_size=len(space))
        assert got.method == "exact" and got.exposure == pytest.approx(want, abs=1e-9)
        assert got.rank == pytest.approx(1 + np.sum(others > naive[i]) + 0.5 * np.sum(others == naive[i]))
    # the repeated canaries are memorized: far above the ~1 bit of a secret never seen
    top = enumerated_exposure(model, prefix_ids=prefix, candidate_ids=tgt, secret_index=space.index(secrets[0]),
                              device="cpu")
    assert top.exposure > 8


def test_skewnorm_estimate_is_close_to_enumeration_on_a_small_space(lm):
    """Carlini et al. 2019 (section 4.3): the skew-normal fit to a sample of 1,000 of the
    10^4 candidates gives each canary's exposure within about a bit (measured: 0.94 at
    most, 0.3 typically) of the exact value, where
    the exact rank is far from the tail's end (exposure < log2 |R| - 3)."""
    model, tok, secrets = lm
    space, prefix, tgt = _space(tok, 4)
    rng = np.random.default_rng(1)
    checked = 0
    for s in secrets + ["1234", "9999", "0001"]:
        i = space.index(s)
        exact = enumerated_exposure(model, prefix_ids=prefix, candidate_ids=tgt, secret_index=i, device="cpu")
        if exact.exposure > math.log2(len(space)) - 3:
            continue
        sample = rng.choice(np.delete(np.arange(len(space)), i), size=1000, replace=False)
        est = sampled_exposure(model, prefix_ids=prefix, secret_ids=tgt[i], sample_ids=[tgt[j] for j in sample],
                               secret_space_size=len(space), device="cpu")
        assert est.method == "skewnorm" and est.logprob == pytest.approx(exact.logprob, abs=1e-4)
        assert abs(est.exposure - exact.exposure) < 1.25, (s, est, exact)
        checked += 1
    assert checked >= 3


def test_skewnorm_estimate_on_a_known_distribution():
    """Log-likelihoods drawn from a skew-normal: the estimate from 2,000 of them matches the
    exact exposure of a canary ranked among the whole population of 10^6 (within 0.5 bit up to
    about 15 bits, beyond the reach of the sample's own ranks)."""
    from scipy import stats

    rng = np.random.default_rng(3)
    population = stats.skewnorm.rvs(-4.0, loc=-20.0, scale=3.0, size=10**6, random_state=rng)
    sample = rng.choice(population, size=2000, replace=False)
    for q in (0.5, 1e-2, 1e-3, 1e-4):
        canary = float(np.quantile(population, 1 - q))
        exact = exposure(canary_logprob=canary, candidate_logprobs=population, secret_space_size=10**6)
        est = exposure(canary_logprob=canary, candidate_logprobs=sample, secret_space_size=10**6, method="skewnorm")
        assert abs(est - exact) < 0.5, (q, est, exact)


def test_sampling_is_seeded_and_follows_the_model(lm):
    model, tok, _ = lm
    prefix = encode_continuations(tok, prefixes=[PREFIX], targets=[" 4821"])[0][0]
    a = sample_continuations(model, prefix_ids=prefix, num_samples=6, num_tokens=3, seed=5, device="cpu")
    b = sample_continuations(model, prefix_ids=prefix, num_samples=6, num_tokens=3, seed=5, device="cpu")
    assert a.shape == (6, 3) and (a == b).all()
    first = sample_continuations(model, prefix_ids=prefix, num_samples=4000, num_tokens=1, seed=0, device="cpu")[:, 0]
    with torch.inference_mode():
        p = torch.softmax(model(torch.tensor([prefix])).logits[0, -1].double(), -1).numpy()
    top = int(p.argmax())
    freq = float(np.mean(first == top))
    assert abs(freq - p[top]) < 4 * math.sqrt(p[top] * (1 - p[top]) / 4000) + 1e-3
    with pytest.raises(InputError):
        sample_continuations(model, prefix_ids=prefix, num_samples=0, num_tokens=1)
