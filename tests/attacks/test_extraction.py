"""dpaudit.extraction: exposure (rank and skew-normal) and greedy extraction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpaudit.errors import InputError
from dpaudit.extraction import exposure, greedy_extracted, k_extractable


# -- exposure ----------------------------------------------------------------------------


def test_exposure_exact_rank():
    others = -np.arange(1.0, 10.0)  # the 9 other secrets of |R| = 10: -1, -2, ..., -9
    ex = lambda c: exposure(canary_logprob=c, candidate_logprobs=others, secret_space_size=10)  # noqa: E731
    assert ex(-0.5) == pytest.approx(math.log2(10))  # rank 1
    assert ex(-1.5) == pytest.approx(math.log2(10) - 1)  # rank 2
    assert ex(-9.5) == pytest.approx(0.0)  # rank 10
    assert ex(-2.0) == pytest.approx(math.log2(10) - math.log2(2.5))  # a tie counts half
    # a model that cannot tell secrets apart: expected rank (|R|+1)/2, about 1 bit
    flat = exposure(canary_logprob=-3.0, candidate_logprobs=np.full(1023, -3.0), secret_space_size=1024)
    assert flat == pytest.approx(math.log2(1024) - math.log2(1 + 1023 / 2))


def test_exposure_rank_from_a_sample_scales_to_the_space():
    rng = np.random.default_rng(0)
    sample = rng.normal(size=1000)
    canary = np.quantile(sample, 0.99)  # about 1% of the sample is likelier
    got = exposure(canary_logprob=canary, candidate_logprobs=sample, secret_space_size=10**12)
    frac = (np.count_nonzero(sample > canary) + 0.5 * np.count_nonzero(sample == canary)) / 1000
    assert got == pytest.approx(math.log2(10**12) - math.log2(1 + (10**12 - 1) * frac))
    assert got == pytest.approx(-math.log2(frac), abs=1e-6)


def test_skewnorm_close_to_rank_on_a_large_sample():
    rng = np.random.default_rng(1)
    dist = stats.skewnorm(4.0, loc=-40.0, scale=6.0)
    sample = dist.rvs(size=20000, random_state=rng)
    size = 10**9
    for q in (0.9, 0.99, 0.999):
        canary = float(dist.ppf(q))
        by_rank = exposure(canary_logprob=canary, candidate_logprobs=sample, secret_space_size=size)
        by_fit = exposure(
            canary_logprob=canary, candidate_logprobs=sample, secret_space_size=size, method="skewnorm"
        )
        assert by_fit == pytest.approx(by_rank, abs=0.25), q
        assert by_fit == pytest.approx(-math.log2(1 - q), abs=0.25)
    # beyond every sampled candidate the rank method saturates; the fit extrapolates
    far = float(dist.ppf(1 - 1e-7))
    assert exposure(canary_logprob=far, candidate_logprobs=sample, secret_space_size=size) == pytest.approx(
        math.log2(size)
    )
    fit = exposure(canary_logprob=far, candidate_logprobs=sample, secret_space_size=size, method="skewnorm")
    assert fit == pytest.approx(-math.log2(1e-7), abs=2.0)


def test_exposure_handles_huge_spaces_and_bounds():
    got = exposure(canary_logprob=10.0, candidate_logprobs=[0.0, 1.0], secret_space_size=26**40)
    assert got == pytest.approx(40 * math.log2(26))
    assert exposure(canary_logprob=-10.0, candidate_logprobs=[0.0, 1.0], secret_space_size=2) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"method": "bogus"},
        {"secret_space_size": 1},
        {"secret_space_size": 2.5},
        {"secret_space_size": True},
        {"candidate_logprobs": []},
        {"candidate_logprobs": [0.0, np.nan]},
        {"canary_logprob": float("inf")},
        {"method": "skewnorm", "candidate_logprobs": [1.0, 1.0, 1.0, 1.0]},
    ],
)
def test_exposure_bad_input(kwargs):
    args = {"canary_logprob": 0.0, "candidate_logprobs": [0.0, -1.0, -2.0, 1.0], "secret_space_size": 100}
    with pytest.raises(InputError):
        exposure(**{**args, **kwargs})


# -- greedy extraction -------------------------------------------------------------------


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def tiny_gpt2(seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=300, n_positions=64, bos_token_id=0, eos_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(cfg)


SECRET = "Patient 4711: PIN 90210"


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def memorised(tokenizer):
    """A tiny GPT-2 trained to memorise one string (a few seconds on CPU)."""
    model = tiny_gpt2(0)
    ids = torch.tensor([tokenizer(SECRET)["input_ids"]])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(150):
            loss = model(ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert loss.item() < 0.05
    return model.eval()


def test_memorised_string_is_extracted(memorised, tokenizer):
    prefix, target = SECRET[:13], SECRET[13:]
    got = greedy_extracted(
        memorised,
        tokenizer,
        prefixes=[prefix, prefix, SECRET[:5]],
        targets=[target, " random other words", SECRET[5:]],
        batch_size=2,
        device="cpu",
    )
    assert got.dtype == np.bool_ and got.tolist() == [True, False, True]
    assert k_extractable(memorised, tokenizer, texts=[SECRET, "some other text here"], k=8, device="cpu").tolist() == [
        True,
        False,
    ]
    assert k_extractable(memorised, tokenizer, texts=[SECRET], k=8, suffix_length=4, device="cpu").tolist() == [True]


def naive_greedy(model, ids, n_new):
    """Plain greedy decoding, one token at a time, no cache, no padding."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n_new):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


def test_batched_teacher_forcing_agrees_with_naive_decoding(tokenizer):
    model = tiny_gpt2(3).eval()
    prompts = ["a", "hello there", "The quick brown fox", "x y", "0123456789abcdef"]
    prefixes, targets = [], []
    for i, p in enumerate(prompts):
        ids = tokenizer(p)["input_ids"]
        gen = naive_greedy(model, ids, 3 + 2 * i)
        prefixes.append(ids)
        targets.append(gen[len(ids):])
    from dpaudit.extraction.continuations import _greedy_match

    assert _greedy_match(model, prefixes, targets, batch_size=2, device="cpu").all()
    wrong = [t[:-1] + [(t[-1] + 1) % 256] for t in targets]
    assert not _greedy_match(model, prefixes, wrong, batch_size=3, device="cpu").any()


def test_greedy_bad_input(memorised, tokenizer):
    with pytest.raises(InputError):
        greedy_extracted(memorised, tokenizer, prefixes=["a"], targets=["b", "c"], device="cpu")
    with pytest.raises(InputError):
        greedy_extracted(memorised, tokenizer, prefixes=["a"], targets=[""], device="cpu")
    with pytest.raises(InputError):
        greedy_extracted(memorised, tokenizer, prefixes=[""], targets=["abc"], device="cpu")
    with pytest.raises(InputError):
        greedy_extracted(memorised, tokenizer, prefixes=["a" * 40], targets=["b" * 40], device="cpu")
    with pytest.raises(InputError):
        k_extractable(memorised, tokenizer, texts=["short"], k=5, device="cpu")
    with pytest.raises(InputError):
        k_extractable(memorised, tokenizer, texts=["short"], k=0, device="cpu")
    assert greedy_extracted(memorised, tokenizer, prefixes=[], targets=[], device="cpu").shape == (0,)


# -- continuation scores -----------------------------------------------------------------


def naive_continuation(model, prefix_ids, target_ids):
    """Per-token log-probabilities of the target and plain greedy decoding, one item at a
    time, one forward pass per target token, no padding."""
    lps, ids = [], list(prefix_ids)
    with torch.no_grad():
        for tok in target_ids:
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].double(), dim=-1)
            lps.append(float(logp[tok]))
            ids.append(tok)
    gen = naive_greedy(model, prefix_ids, len(target_ids))[len(prefix_ids):]
    return np.array(lps), gen == list(target_ids)


@pytest.mark.parametrize("output_layer_everywhere", [False, True])
def test_continuation_scores_agree_with_a_naive_loop(memorised, tokenizer, monkeypatch, output_layer_everywhere):
    from dpaudit import extraction as E
    from dpaudit.extraction import continuations

    if output_layer_everywhere:  # the path of a model that does not take logits_to_keep
        monkeypatch.setattr(continuations, "takes_logits_to_keep", lambda model: False)
    prefixes = [SECRET[:13], SECRET[:13], SECRET[:5], "hello", "The quick brown fox jumps", "x"]
    targets = [SECRET[13:], " random words", SECRET[5:], " world", " over it", "yz"]
    got = E.continuation_scores(memorised, tokenizer, prefixes=prefixes, targets=targets, batch_size=4, device="cpu")
    pre, tgt = E.encode_continuations(tokenizer, prefixes=prefixes, targets=targets)
    assert len(got.token_logprobs) == len(prefixes) and got.extracted.dtype == np.bool_
    for i in range(len(prefixes)):
        lps, hit = naive_continuation(memorised, pre[i], tgt[i])
        np.testing.assert_allclose(got.token_logprobs[i], lps, atol=1e-4)
        assert got.mean_logprob()[i] == pytest.approx(lps.mean(), abs=1e-4)
        assert got.sum_logprob()[i] == pytest.approx(lps.sum(), abs=1e-3)
        assert bool(got.extracted[i]) == hit
    assert got.extracted.tolist()[:3] == [True, False, True]
    assert got.extracted.tolist() == greedy_extracted(
        memorised, tokenizer, prefixes=prefixes, targets=targets, device="cpu").tolist()
    # the same from token ids, whatever the batch size
    again = E.score_continuations(memorised, pre, tgt, batch_size=1, device="cpu")
    np.testing.assert_allclose(again.mean_logprob(), got.mean_logprob(), atol=1e-5)


def test_continuation_scores_bad_input(memorised, tokenizer):
    from dpaudit.extraction import continuation_scores, score_continuations

    with pytest.raises(InputError):
        continuation_scores(memorised, tokenizer, prefixes=["a"], targets=[""], device="cpu")
    with pytest.raises(InputError):
        score_continuations(memorised, [[1, 2]], [[]], device="cpu")
    with pytest.raises(InputError):
        score_continuations(memorised, [[1, 2]], [[3], [4]], device="cpu")
    with pytest.raises(InputError):
        score_continuations(memorised, [[1] * 40], [[2] * 40], device="cpu")  # beyond 64 positions
    empty = score_continuations(memorised, [], [], device="cpu")
    assert empty.extracted.shape == (0,) and empty.mean_logprob().shape == (0,)
