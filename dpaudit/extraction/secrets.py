"""The secret canaries' measures (``canaries.secrets``): Secret Sharer canaries (Carlini, Liu,
Erlingsson, Kos, Song 2019, arXiv 1802.08232) inserted 1, 2, 4, 8... times, half of each
group inserted and half kept out as controls. For each: its exposure, exact by ranking every
candidate secret while ``|R| <= canaries.secrets.enumerate_limit``, else estimated by the
skew-normal fit to ``canaries.secrets.sample_size`` sampled candidates; whether greedy
decoding from its prefix emits the secret; and how many of ``extract.samples`` samples from
the prefix do (:func:`by_repetitions` summarises them per repetition count, the controls
as 0). A canary whose prefix and secret exceed ``data.max_length`` tokens (or the model's
position table) is left out, as training cut its secret away: ``secrets_left_out`` says how
many, which and why, and a warning says so.
"""

from __future__ import annotations

import math
import warnings
import zlib

import numpy as np

from dpaudit.extraction.candidates import enumerated_exposure, padded_tokens, sampled_exposure, secret_space
from dpaudit.extraction.continuations import encode_continuations, score_continuations, trained_token_limit
from dpaudit.extraction.sampling import sample_continuations

__all__ = ["by_repetitions", "secret_canaries", "secret_lengths"]

_SPACE_TOKENS: dict = {}  # the last secret space tokenised: (key, token lists), shared by the models of a run


def _split_secret(canary) -> tuple[str, str]:
    """``(prefix, target)`` of a secret canary with the whitespace before the secret moved into
    the target, as a byte-level BPE tokenises the text in training (it joins the space to the
    first digit)."""
    core = canary.prefix.rstrip()
    return core, canary.prefix[len(core):] + canary.secret


def secret_lengths(tokenizer, secrets: list) -> list[int]:
    """The tokens of each secret canary's prefix and secret: the longer of the scored
    ``prefix + secret`` (:func:`encode_continuations`, with the BOS token) and the text as
    training tokenises it (with the tokenizer's special tokens, before truncation to
    ``data.max_length``)."""
    if not secrets:
        return []
    split = [_split_secret(c) for c in secrets]
    pre, tgt = encode_continuations(tokenizer, prefixes=[p for p, _ in split], targets=[t for _, t in split],
                                    who="secret canaries")
    trained = tokenizer([c.text for c in secrets])["input_ids"]
    return [max(len(p) + len(t), len(ids)) for p, t, ids in zip(pre, tgt, trained)]


def _left_out(secrets: list, lengths: list[int], limit: int, max_length: int) -> dict:
    """``secrets_left_out`` of extraction.json: the canaries longer than ``limit`` tokens."""
    out = [c.id for c, n in zip(secrets, lengths) if n > limit]
    return {"num": len(out), "ids": out, "max_tokens": limit,
            "reason": f"prefix + secret longer than {limit} tokens (data.max_length={max_length}"
                      f"{'' if limit == max_length else ', or the model position table'}): "
                      f"training cut the secret away"}


def _encode_all(tokenizer, strings: list[str]) -> np.ndarray:
    """The tokens of each string alone, padded with -1."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the Rust tokenizer directly: 10^6 strings in seconds
        return padded_tokens([e.ids for e in backend.encode_batch(strings, add_special_tokens=False)])
    return padded_tokens(tokenizer(strings, add_special_tokens=False)["input_ids"])


def _secret_tokens(tokenizer, prefix: str, lead: str, secrets: list[str], *, cache_key=None) -> np.ndarray:
    """The tokens of ``lead + secret`` after ``prefix`` for each secret, as
    :func:`dpaudit.extraction.encode_continuations` gives them. The fast path tokenises
    ``lead + secret`` alone (once per space, cached); it is used only when it agrees with the
    joint tokenisation on a seeded sample of 32 secrets, else every secret is tokenised with
    the prefix."""
    key = (cache_key, lead, len(secrets)) if cache_key is not None else None
    if key is not None and _SPACE_TOKENS.get("key") == key:
        fast = _SPACE_TOKENS["tokens"]
    else:
        fast = _encode_all(tokenizer, [lead + s for s in secrets])
        if key is not None:
            _SPACE_TOKENS.clear()
            _SPACE_TOKENS.update(key=key, tokens=fast)
    check = np.random.default_rng(len(secrets)).choice(len(secrets), size=min(32, len(secrets)), replace=False)
    _, joint = encode_continuations(tokenizer, prefixes=[prefix] * len(check),
                                    targets=[lead + secrets[i] for i in check], who="secret canaries")
    if all([int(t) for t in fast[i] if t >= 0] == j for i, j in zip(check, joint)):
        return fast
    return padded_tokens(encode_continuations(tokenizer, prefixes=[prefix] * len(secrets),
                                              targets=[lead + s for s in secrets], who="secret canaries")[1])


def secret_canaries(model, tokenizer, secrets: list, spec: dict | None, *, config) -> dict:
    """``space_bits``, ``secret_set``, ``exposure_method``, ``canaries``, ``by_repetitions``
    and ``secrets_left_out`` of :data:`extraction.json <dpaudit.stages.extract>` for the
    run's secret canaries. Canaries whose prefix and secret exceed ``data.max_length``
    tokens (or the model's position table; :func:`secret_lengths`) are left out, with a
    warning: training truncated their secret away, so their exposure would read as a
    control's. ``secrets_left_out``: ``{"num", "ids", "max_tokens", "reason"}`` (None
    without secret canaries)."""
    from dpaudit.canaries import sample_secrets, secret_space_size
    from dpaudit.progress import Progress

    if not secrets:
        return {"space_bits": None, "secret_set": None, "exposure_method": None, "canaries": [], "by_repetitions": [],
                "secrets_left_out": None}
    sec, ex = config.canaries.secrets, config.extract
    # as patient_secrets: a secret beyond data.max_length was truncated away in training
    limit = trained_token_limit(model, config.data.max_length)
    lengths = secret_lengths(tokenizer, secrets)
    left_out = _left_out(secrets, lengths, limit, config.data.max_length)
    if left_out["num"]:
        warnings.warn(f"secret canaries: {left_out['num']} of {len(secrets)} left out of the exposure measures, their "
                      f"{left_out['reason']} (their lengths: {sorted(n for n in lengths if n > limit)} tokens)",
                      UserWarning, stacklevel=2)
        secrets = [c for c, n in zip(secrets, lengths) if n <= limit]
    if not secrets:
        return {"space_bits": None, "secret_set": spec["name"], "exposure_method": None, "canaries": [],
                "by_repetitions": [], "secrets_left_out": left_out}
    size = secret_space_size(spec)
    exact = size <= sec.enumerate_limit
    space = secret_space(spec["secret"]["pattern"]) if exact else None
    index = {s: i for i, s in enumerate(space)} if exact else None
    split = [_split_secret(c) for c in secrets]
    pre, tgt = encode_continuations(tokenizer, prefixes=[p for p, _ in split], targets=[t for _, t in split],
                                    who="secret canaries")
    greedy = score_continuations(model, pre, tgt, batch_size=config.attack.batch_size,
                                 device=config.train.device).extracted
    rows = []
    bar = Progress(total=len(secrets), desc="secret canaries", unit="canary")
    for i, c in enumerate(secrets):
        prefix, target = split[i]
        lead = target[: len(target) - len(c.secret)]
        seed = zlib.crc32(c.id.encode("utf-8")) ^ config.seed
        kw = {"batch_size": 512, "device": config.train.device}
        if exact:
            name = getattr(tokenizer, "name_or_path", None)
            cands = _secret_tokens(tokenizer, prefix, lead, space,
                                   cache_key=(name, len(tokenizer), spec["secret"]["pattern"]) if name else None)
            exp = enumerated_exposure(model, prefix_ids=pre[i], candidate_ids=cands, secret_index=index[c.secret], **kw)
        else:
            drawn = [s for s in sample_secrets(spec, num=sec.sample_size + 1, rng=np.random.default_rng(seed))
                     if s != c.secret][: sec.sample_size]
            exp = sampled_exposure(model, prefix_ids=pre[i], secret_ids=tgt[i], sample_ids=_secret_tokens(
                tokenizer, prefix, lead, drawn), secret_space_size=size, **kw)
        samples = sample_continuations(model, prefix_ids=pre[i], num_samples=ex.samples, num_tokens=len(tgt[i]),
                                       temperature=ex.temperature, seed=seed, device=config.train.device)
        hits = int((samples == np.asarray(tgt[i])[None]).all(axis=1).sum())
        rows.append({"id": c.id, "included": c.included, "repetitions": c.repetitions if c.included else 0,
                     "exposure": exp.exposure, "rank": exp.rank, "logprob": exp.logprob,
                     "extracted": bool(greedy[i]), "sampled_hits": hits, "samples": ex.samples,
                     "extracted_sampled": hits > 0})
        bar.update(1, exposure=exp.exposure)
    bar.close()
    return {"space_bits": math.log2(size), "secret_set": spec["name"],
            "exposure_method": "exact" if exact else "skewnorm", "canaries": rows,
            "by_repetitions": by_repetitions(rows), "secrets_left_out": left_out}


def by_repetitions(rows: list[dict]) -> list[dict]:
    """Per number of inserted copies (0: the controls, never inserted): how many canaries,
    their mean and median exposure, and the fractions extracted by greedy and by sampled
    decoding."""
    out = []
    for r in sorted({row["repetitions"] for row in rows}):
        group = [row for row in rows if row["repetitions"] == r]
        exp = np.array([row["exposure"] for row in group])
        out.append({"repetitions": r, "num": len(group), "mean_exposure": float(exp.mean()),
                    "median_exposure": float(np.median(exp)),
                    "extracted": float(np.mean([row["extracted"] for row in group])),
                    "extracted_sampled": float(np.mean([row["extracted_sampled"] for row in group]))})
    return out

