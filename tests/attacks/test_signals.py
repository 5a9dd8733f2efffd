"""dpaudit.signals: batched per-token log-probs against a naive loop, caching, persistence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.signals import TokenSignals, compute_signals, compute_signals_many
from dpaudit.stages.signal_cache import cached_signals, load_signals, save_signals, signals_fingerprint


MAX_POS = 64


def byte_tokenizer():
    """One token per UTF-8 byte (ids 0..255), built in memory; no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=300, n_positions=MAX_POS, bos_token_id=0, eos_token_id=0
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(cfg)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2()


TEXTS = [
    "The patient was admitted with chest pain.",
    "",  # no token
    "a",  # one token: nothing to predict
    "ok",
    "x" * 100,  # longer than the model's 64 positions
    "Dose: 5 mg twice daily; review in 2 weeks.",
    "héllo wörld ✓",  # multi-byte
    "short one",
]


def naive(model, tokenizer, text, max_length):
    """Reference: one text at a time, no padding, float64 from the full logits."""
    ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
    if len(ids) < 2:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    lp = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    p = logp.exp()
    mean = (p * logp).sum(-1)
    std = (p * (logp - mean[:, None]) ** 2).sum(-1).sqrt()
    return lp.numpy(), mean.numpy(), std.numpy()


@pytest.mark.parametrize("batch_size,max_length", [(3, 512), (16, 20)])
def test_compute_signals_matches_naive_loop(model, tokenizer, batch_size, max_length):
    sig = compute_signals(
        model, tokenizer, TEXTS, batch_size=batch_size, max_length=max_length, device="cpu", progress=False
    )
    limit = min(max_length, MAX_POS)
    assert sig.n == len(TEXTS)
    assert sig.logprob.dtype == np.float32 and sig.mask.dtype == np.bool_
    assert sig.logprob.shape == (len(TEXTS), limit - 1)
    for i, text in enumerate(TEXTS):
        lp, mean, std = naive(model, tokenizer, text, limit)
        t = len(lp)
        assert sig.mask[i].sum() == t and sig.mask[i, :t].all()
        np.testing.assert_allclose(sig.logprob[i, :t], lp, atol=1e-4, rtol=0)
        np.testing.assert_allclose(sig.mean[i, :t], mean, atol=1e-4, rtol=0)
        np.testing.assert_allclose(sig.std[i, :t], std, atol=1e-4, rtol=0)
        assert not sig.logprob[i, t:].any() and not sig.mean[i, t:].any()
    assert sig.token_count().tolist() == [sig.mask[i].sum() for i in range(len(TEXTS))]


def test_mean_std_against_numpy_from_full_logits(model, tokenizer):
    text = "Blood pressure 120/80, pulse 72."
    sig = compute_signals(model, tokenizer, [text], device="cpu", progress=False)
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
    x = logits[:-1]
    logp = x - x.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    p = np.exp(logp)
    mean = (p * logp).sum(1)
    var = (p * logp**2).sum(1) - mean**2
    np.testing.assert_allclose(sig.logprob[0], logp[np.arange(len(ids) - 1), ids[1:]], atol=1e-4)
    np.testing.assert_allclose(sig.mean[0], mean, atol=1e-4)
    np.testing.assert_allclose(sig.std[0], np.sqrt(var), atol=1e-4)
    np.testing.assert_allclose(sig.mean_logprob()[0], sig.logprob[0].mean(), rtol=1e-6)


def test_order_restored_and_batch_size_irrelevant(model, tokenizer):
    a = compute_signals(model, tokenizer, TEXTS, batch_size=1, device="cpu", progress=False)
    b = compute_signals(model, tokenizer, TEXTS[::-1], batch_size=5, device="cpu", progress=False)
    np.testing.assert_array_equal(a.mask, b.mask[::-1])
    np.testing.assert_allclose(a.logprob, b.logprob[::-1], atol=1e-5)


def test_many_models_and_mode_restored(tokenizer):
    m1, m2 = tiny_gpt2(1), tiny_gpt2(2)
    m1.train()
    many = compute_signals_many(iter([m1, m2]), tokenizer, TEXTS[:4], device="cpu", progress=False)
    assert m1.training and not m2.training
    for m, s in zip((m1, m2), many):
        one = compute_signals(m, tokenizer, TEXTS[:4], device="cpu", progress=False)
        np.testing.assert_allclose(s.logprob, one.logprob, atol=1e-6)
    assert not np.allclose(many[0].logprob, many[1].logprob)


def test_progress_goes_to_the_log_never_to_stdout(model, tokenizer, capsys, caplog):
    """Off a terminal there is no bar: progress is a log line (``dpaudit.progress``), which
    the CLI sends to stderr and run.log."""
    with caplog.at_level("INFO", logger="dpaudit.progress"):
        compute_signals(model, tokenizer, TEXTS[:3], device="cpu", progress=True)
    assert any(r.name == "dpaudit.progress" and "signals" in r.getMessage() and "3/3" in r.getMessage()
               for r in caplog.records)
    assert capsys.readouterr().out == ""
    caplog.clear()
    with caplog.at_level("INFO", logger="dpaudit.progress"):
        compute_signals(model, tokenizer, TEXTS[:3], device="cpu", progress=False)
    assert not caplog.records
    out, err = capsys.readouterr()
    assert out == "" and err == ""


@pytest.mark.parametrize(
    "kwargs",
    [
        {"texts": "one string"},
        {"texts": ["ok", 3]},
        {"batch_size": 0},
        {"max_length": 1},
        {"device": "no-such-device"},
    ],
)
def test_bad_input_raises_input_error(model, tokenizer, kwargs):
    args = {"texts": ["ok"], "device": "cpu", "progress": False, **kwargs}
    texts = args.pop("texts")
    with pytest.raises(InputError):
        compute_signals(model, tokenizer, texts, **args)


def test_empty_text_list(model, tokenizer):
    sig = compute_signals(model, tokenizer, [], device="cpu", progress=False)
    assert sig.logprob.shape == (0, 0)


# -- TokenSignals ------------------------------------------------------------------------


def make_signals(rng, n=5, width=7, stats=True):
    lengths = rng.integers(0, width + 1, size=n)
    mask = np.arange(width)[None] < lengths[:, None]
    lp = np.where(mask, -rng.random((n, width)) * 5, 0).astype(np.float32)
    if not stats:
        return TokenSignals(logprob=lp, mask=mask)
    return TokenSignals(logprob=lp, mask=mask, mean=lp - 1, std=np.abs(lp) + 0.5)


@pytest.mark.parametrize("stats", [True, False])
def test_save_load_round_trip(tmp_path, stats):
    sig = make_signals(np.random.default_rng(0), stats=stats)
    path = save_signals(tmp_path / "x.npz", sig)
    assert path == tmp_path / "x.npz" and path.is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]  # no temp file left
    back = load_signals(path)
    for f in ("logprob", "mask", "mean", "std"):
        a, b = getattr(sig, f), getattr(back, f)
        if a is None:
            assert b is None
        else:
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    with np.load(path, allow_pickle=False) as z:  # plain arrays only
        assert {"logprob", "mask"} <= set(z.files)


def test_load_errors(tmp_path):
    with pytest.raises(InputError):
        load_signals(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError):
        load_signals(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(InputError, match="logprob"):
        load_signals(tmp_path / "other.npz")


def test_token_signals_validation_and_read_only():
    lp = np.zeros((2, 3), dtype=np.float32)
    mask = np.ones((2, 3), dtype=bool)
    sig = TokenSignals(logprob=lp, mask=mask)
    with pytest.raises(ValueError):
        sig.logprob[0, 0] = 1.0
    lp[0, 0] = -1.0  # the caller's own array stays writeable
    with pytest.raises(InputError):
        TokenSignals(logprob=lp, mask=mask[:, :2])
    with pytest.raises(InputError):
        TokenSignals(logprob=lp[0], mask=mask[0])
    with pytest.raises(InputError):
        TokenSignals(logprob=lp, mask=mask, mean=lp)  # std missing
    assert TokenSignals(logprob=lp, mask=mask.astype(int)).mask.dtype == np.bool_


def test_summaries_and_select():
    lp = np.array([[-1, -3, 0], [-2, 0, 0], [0, 0, 0]], dtype=np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=bool)
    sig = TokenSignals(logprob=lp, mask=mask)
    assert sig.token_count().tolist() == [2, 1, 0]
    np.testing.assert_allclose(sig.sum_logprob(), [-4, -2, 0])
    m = sig.mean_logprob()
    np.testing.assert_allclose(m[:2], [-2, -2])
    assert np.isnan(m[2])
    sub = sig.select([1, 0])
    np.testing.assert_array_equal(sub.logprob, lp[[1, 0]])
    assert sig.select(np.array([True, False, True])).n == 2
    assert sig.select([]).n == 0


# -- cache -------------------------------------------------------------------------------


class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_hook(self)

    def __call__(self, *args):
        self.calls += 1


def test_cached_signals_hit_miss_and_atomic_write(tmp_path, model, tokenizer):
    counter = ForwardCounter(model)
    try:
        kw = dict(model_id="tiny-gpt2@seed0", device="cpu", progress=False, batch_size=4)
        a = cached_signals(tmp_path, "target", model, tokenizer, TEXTS, **kw)
        path = tmp_path / "signals" / "target.npz"
        assert path.is_file() and counter.calls > 0
        assert sorted(p.name for p in path.parent.iterdir()) == ["target.npz"]
        calls, mtime = counter.calls, path.stat().st_mtime_ns

        b = cached_signals(tmp_path, "target", model, tokenizer, TEXTS, **kw)  # hit
        assert counter.calls == calls and path.stat().st_mtime_ns == mtime
        np.testing.assert_array_equal(a.logprob, b.logprob)
        np.testing.assert_array_equal(a.std, b.std)

        cached_signals(tmp_path, "target", model, tokenizer, TEXTS[:-1], **kw)  # texts changed
        assert counter.calls > calls
        calls = counter.calls
        kw2 = {**kw, "model_id": "tiny-gpt2@seed1"}
        c = cached_signals(tmp_path, "target", model, tokenizer, TEXTS, **kw2)  # model changed
        assert counter.calls > calls and c.n == len(TEXTS)
        calls = counter.calls
        cached_signals(tmp_path, "target", model, tokenizer, TEXTS, **kw2)
        assert counter.calls == calls

        path.write_bytes(b"corrupt")  # unreadable cache = miss
        cached_signals(tmp_path, "target", model, tokenizer, TEXTS, **kw2)
        assert counter.calls > calls
        assert load_signals(path).n == len(TEXTS)
    finally:
        counter.handle.remove()


def test_cached_signals_rejects_bad_names(tmp_path, model, tokenizer):
    for name in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(InputError):
            cached_signals(tmp_path, name, model, tokenizer, ["ok"], model_id="m", progress=False)
    with pytest.raises(InputError):
        cached_signals(tmp_path, "t", model, tokenizer, ["ok"], model_id="", progress=False)


def test_fingerprint_separates_inputs():
    f = signals_fingerprint(["ab", "c"], model_id="m", max_length=8)
    assert f == signals_fingerprint(["ab", "c"], model_id="m", max_length=8)
    assert f != signals_fingerprint(["a", "bc"], model_id="m", max_length=8)
    assert f != signals_fingerprint(["ab", "c"], model_id="m2", max_length=8)
    assert f != signals_fingerprint(["ab", "c"], model_id="m", max_length=9)


@pytest.mark.parametrize("kind", ["gpt2_like", "peaked", "flat"])
def test_batch_stats_numerics_against_float64(kind):
    """Two texts of 64 and 40 tokens, 5,000-way logits: several cache-sized slices, rows
    beyond a text's length skipped and zeroed, against float64 log-softmax."""
    from dpaudit.signals.compute import _batch_stats

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 5000, generator=gen)
    if kind == "gpt2_like":  # large negative logits, spread of a few nats
        x = -100.0 + 4.0 * x
    elif kind == "peaked":  # one dominant token per row
        x = 2.0 * x
        x[..., 7] += 30.0
    else:
        x = 1e-3 * x
    ids = torch.randint(0, 5000, (2, 64), generator=gen)
    lengths = np.array([64, 40])
    logp = torch.log_softmax(x.double(), -1)[:, :-1]
    p = logp.exp()
    mean = (p * logp).sum(-1)
    std = (p * (logp - mean[..., None]) ** 2).sum(-1).sqrt()
    lp = logp.gather(2, ids[:, 1:, None])[..., 0]
    keep = (torch.arange(63)[None, :] < torch.as_tensor(lengths - 1)[:, None]).double()
    got = _batch_stats(x.clone(), ids, lengths)
    assert got.shape == (3, 2, 63) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], (lp * keep).numpy(), atol=1e-4, rtol=1e-6)
    np.testing.assert_allclose(got[1], (mean * keep).numpy(), atol=1e-4, rtol=1e-6)
    np.testing.assert_allclose(got[2], (std * keep).numpy(), atol=1e-4, rtol=1e-4)


def _offset_gpt2(offset: float, perturb: float):
    """tiny_gpt2 with sharper weights and every logit shifted by ``-offset`` (as real GPT-2's
    sit near -40..-130): hidden dimension 5 is the constant -10 after ln_f and every token's
    embedding holds ``offset / 10`` there. The shift is softmax-invariant (float32 log-probs do
    not see it) but puts the logits where bf16 steps are 0.25-0.5 nats. ``perturb`` adds a
    small fixed noise to every weight: a slightly different model, as a reference model is."""
    m = tiny_gpt2(0)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(123)
        for p in m.parameters():
            p.mul_(3.0)
            if perturb:
                p.add_(perturb * p.std() * torch.randn(p.shape, generator=gen))
        m.transformer.ln_f.weight[5] = 0.0
        m.transformer.ln_f.bias[5] = -10.0
        m.transformer.wte.weight[:, 5] = offset / 10.0
    return m


def _ranks(x):
    return np.argsort(np.argsort(x)).astype(np.float64)


def _spearman(a, b):
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def test_bf16_autocast_keeps_logprobs_and_reference_ranking(tokenizer, monkeypatch):
    """Under bf16 autocast (the CUDA path, run here on CPU) the output layer stays float32:
    with logits near -100 a bf16 rounding of them would move each log-prob by up to 0.25
    nats and scramble target-minus-reference scores (before the fix: max error 0.29 nats,
    Spearman -0.02; after: 0.013 nats, 0.965)."""
    from dpaudit.signals import compute

    rng = np.random.default_rng(0)
    words = "patient admitted with chest pain dose mg twice daily review weeks blood pressure pulse".split()
    texts = [" ".join(rng.choice(words, 10)) for _ in range(80)]
    target, reference = _offset_gpt2(100.0, 0.02), _offset_gpt2(100.0, 0.0)
    kw = dict(batch_size=16, device="cpu", progress=False)
    f32 = compute_signals_many([target, reference], tokenizer, texts, **kw)
    monkeypatch.setitem(compute._AUTOCAST, "cpu", torch.bfloat16)
    b16 = compute_signals_many([target, reference], tokenizer, texts, **kw)
    for a, b in zip(f32, b16):
        np.testing.assert_array_equal(a.mask, b.mask)
        err = np.abs(a.logprob - b.logprob)[a.mask]
        assert err.max() < 0.05, err.max()
        assert np.abs(a.mean - b.mean)[a.mask].max() < 0.05
    score32 = f32[0].mean_logprob() - f32[1].mean_logprob()
    score16 = b16[0].mean_logprob() - b16[1].mean_logprob()
    assert _spearman(score32, score16) > 0.9, _spearman(score32, score16)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "opt", "gpt_neox"])
@pytest.mark.parametrize("tied", [True, False])
def test_float32_head_reproduces_the_model_logits(arch, tied):
    """Each supported family, tied or not: the base model's last hidden state times the head
    (float32, slice by slice in _batch_stats) gives the model's own statistics."""
    from dpaudit.models import build_tiny
    from dpaudit.signals.compute import _batch_stats, _float32_head

    model = build_tiny(arch, vocab_size=300, bos_token_id=0, eos_token_id=0, seed=1, tied=tied).eval()
    if arch == "gpt2" and not tied:  # a head with a bias (as GPT-J's)
        model.lm_head = torch.nn.Linear(64, 300, bias=True)
        torch.nn.init.normal_(model.lm_head.bias, std=2.0)
    found = _float32_head(model)
    assert found is not None and found[1] is model.get_output_embeddings()
    ids = torch.randint(1, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    lengths = np.array([40, 25])
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits
        hidden = found[0](input_ids=ids, use_cache=False)[0]
        want = _batch_stats(logits.clone(), ids, lengths)
        got = _batch_stats(hidden, ids, lengths, found[1])
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_float32_head_falls_back_for_other_models():
    from dpaudit.signals.compute import _float32_head

    class Scaled(type(tiny_gpt2())):  # a subclass may scale or softcap its logits
        pass

    assert _float32_head(tiny_gpt2()) is not None
    assert _float32_head(Scaled(tiny_gpt2().config)) is None
    odd = tiny_gpt2()
    odd.lm_head = torch.nn.Sequential(odd.lm_head)  # not a plain Linear
    assert _float32_head(odd) is None
    assert _float32_head(torch.nn.Linear(2, 2)) is None
