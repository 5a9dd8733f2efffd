"""Extract stage: can the secrets be recovered from a model? ``models/NAME/extraction.json``.

Each measure comes from batched passes of :mod:`dpaudit.extraction`:

* Secret canaries (``canaries.secrets``; Carlini et al. 2019, "The Secret Sharer", arXiv
  1802.08232): Secret Sharer canaries inserted 1, 2, 4, 8... times beside the new-token
  canaries, half of each group inserted and half kept out as controls. For each: its
  exposure ``log2 |R| - log2 rank`` (``canaries``, ``space_bits``), exact by ranking every
  candidate secret while ``|R| <= canaries.secrets.enumerate_limit``, else estimated by the
  skew-normal fit to ``canaries.secrets.sample_size`` sampled candidates; whether greedy
  decoding from its prefix emits the secret; and how many of ``extract.samples`` samples
  from the prefix do (``by_repetitions`` summarises them per repetition count, the controls
  as 0). Repeated canaries are groups of units at note level; they never enter an epsilon
  bound (the attack stage scores only the main canary set).

* New-token canaries: greedy decoding from each canary's prefix (k-extractability, Carlini
  et al. 2023, arXiv 2202.07646), reported for included and excluded canaries
  (``included_extracted``..., ``new_token_canaries``).

* PII (``pii``): from each member note's text up to a PII field (MRN, phone), whether greedy
  decoding emits the field; the same from held-out notes, whose values the model never saw,
  is the baseline a model that memorized nothing reaches.

* ``k_extractable`` (Carlini et al. 2023): the fraction of at most ``extract.max_records``
  member and held-out records whose first ``extract.k`` tokens make greedy decoding emit the
  next ``extract.suffix_length``.

* Patient secrets (``patient_secrets``), for corpora whose notes carry an MRN (the built-in
  clinical corpus, where each patient's 2-5 notes share one MRN): for each candidate note,
  the mean per-token log-probability of the MRN given the note's text up to it, and
  whether greedy decoding from there reproduces it exactly; grouped by the patient's
  number of notes, member patients beside held-out ones. Note-level DP-SGD protects one
  note, so a member patient with ``k`` notes is a group of ``k`` protected units carrying
  the same secret; patient-level DP protects them together. Held-out patients, whose MRN
  the model never saw, are what a model that memorised nothing reaches.

  A patient is the set of one role's candidate notes that carry one MRN (whatever
  ``data.unit_column`` is); held-out notes whose MRN also occurs in a member note are left
  out (the model saw that MRN), as are notes whose MRN lies beyond the first
  ``data.max_length`` tokens (training truncated it away). At most
  :data:`MAX_NOTES_PER_GROUP` notes per group and role are scored: a larger group is a
  seeded sample of whole patients (seed :data:`SAMPLE_SEED`), which bounds the time on
  corpora larger than the demo's (where no group reaches the cap).
"""

from __future__ import annotations

import math
import re
import zlib
from collections import defaultdict

import numpy as np

from dpaudit.errors import InputError
from dpaudit.rundir import ModelDir, RunDir

#: Notes scored per (group, role) at most; beyond it a seeded sample of whole patients.
MAX_NOTES_PER_GROUP = 500
#: Seed of that sample (config-free, so that every model of a run scores the same notes).
SAMPLE_SEED = 20240611

PATIENT_FIELD = "mrn"
# "MRN 01234567" / "MRN: 01234567": the prefix ends at "MRN" or "MRN:", the target is the
# whitespace and the 8 digits (the space belongs to the target: a byte-level BPE joins it
# to the first digit).
_MRN = re.compile(r"\bMRN:?(\s+)(\d{8})(?!\d)")
# "(825) 559-0630" after whitespace, in whatever sentence the note puts it
_PHONE = re.compile(r"(\s+)(\(\d{3}\) \d{3}-\d{4})(?!\d)")
PII_FIELDS = {"mrn": _MRN, "phone": _PHONE}

_PATIENT_METHOD = (
    "for each candidate note, the mean per-token log-probability (nats) of the patient's MRN given the "
    "note's text up to it, and whether greedy decoding from there reproduces it exactly; notes grouped "
    "by the patient's number of notes, member patients beside held-out patients (whose MRN the model "
    "never saw), log-probabilities averaged over each patient's notes, then over patients"
)


#: The keys of each model in ``dpaudit extract --json`` (the whole file is in extraction.json).
JSON_KEYS = ("space_bits", "secret_set", "exposure_method", "canaries", "by_repetitions", "pii", "k_extractable",
             "included_extracted", "included_total", "excluded_extracted", "excluded_total")


def extract_run(rundir: RunDir | str, *, force: bool = False) -> dict[str, dict]:
    """The extract stage for every trained model of a run directory (``dpaudit extract``):
    ``{model: extraction.json}``; ``force`` recomputes results already in place."""
    from dpaudit.progress import label

    rundir = RunDir(rundir) if not isinstance(rundir, RunDir) else rundir
    rundir.check()
    config = rundir.read_config()
    out = {}
    for name in config.model_names():
        md = rundir.model(name)
        if not md.is_trained():
            continue
        with label(name):
            out[name] = extract_model(rundir, config, md, force=force)
    return out


def extract_model(rundir: RunDir, config, md: ModelDir, *, force: bool = False, tokenizer=None) -> dict:
    """Write and return the model's extraction results (skipped when already in place);
    ``tokenizer``: the run's, when the caller has it loaded already."""
    done = None if force else md.read_extraction()
    if done is not None and "k_extractable" in done:  # an older file lacks the later measures
        return done
    from dpaudit.extraction import greedy_extracted
    from dpaudit.models import load_model

    canaries = rundir.read_canaries()
    secrets, secret_spec = rundir.read_secrets()
    candidates = rundir.read_candidates()
    notes = mrn_notes(candidates)
    model, tokenizer = load_model(md.weights), tokenizer or rundir.read_tokenizer()
    kw = {"batch_size": config.attack.batch_size, "device": config.train.device}
    extracted = np.zeros(len(canaries), dtype=bool)
    if canaries:
        split = [_split_canary(c, tokenizer) for c in canaries]
        extracted = greedy_extracted(model, tokenizer, prefixes=[p for p, _ in split], targets=[t for _, t in split],
                                     **kw)
    included = np.array([c.included for c in canaries], dtype=bool)
    result = {
        **secret_canaries(model, tokenizer, secrets, secret_spec, config=config),
        "method": "greedy decoding from the canary prefix (from its first token, for a canary with none)",
        "included_extracted": int(extracted[included].sum()),
        "included_total": int(included.sum()),
        "excluded_extracted": int(extracted[~included].sum()),
        "excluded_total": int((~included).sum()),
        "new_token_canaries": {c.id: {"extracted": bool(e)} for c, e in zip(canaries, extracted)},
        "pii": pii_extraction(model, tokenizer, candidates, max_length=config.data.max_length,
                              max_records=config.extract.max_records, seed=config.seed, **kw),
        "k_extractable": k_extractable_records(model, tokenizer, candidates, config=config),
        "patient_secrets": None if notes is None else patient_secrets(
            model, tokenizer, notes, max_length=config.data.max_length, **kw),
    }
    md.write_extraction(result)
    return md.read_extraction()


def _split_canary(canary, tokenizer) -> tuple[str, str]:
    """``(prefix, target)`` for greedy extraction: the canary's own, or for a canary with no
    prefix (``new_token_bare``), its first token and the rest (a model cannot be prompted
    with nothing when its tokenizer adds no BOS token)."""
    if canary.prefix:
        return canary.prefix, canary.secret
    first = tokenizer.decode(tokenizer(canary.secret, add_special_tokens=False)["input_ids"][:1])
    if not canary.secret.startswith(first) or first == canary.secret:
        raise InputError(f"canary {canary.id} has no prefix and no first token to start extraction from")
    return first, canary.secret[len(first):]


# ----------------------------------------------------------------------------------------
# secret canaries
# ----------------------------------------------------------------------------------------

_SPACE_TOKENS: dict = {}  # the last secret space tokenised: (key, token lists), shared by the models of a run


def _split_secret(canary) -> tuple[str, str]:
    """``(prefix, target)`` of a secret canary with the whitespace before the secret moved into
    the target, as a byte-level BPE tokenises the text in training (it joins the space to the
    first digit)."""
    core = canary.prefix.rstrip()
    return core, canary.prefix[len(core):] + canary.secret


def _encode_all(tokenizer, strings: list[str]) -> np.ndarray:
    """The tokens of each string alone, padded with -1."""
    from dpaudit.extraction import padded_tokens

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
    from dpaudit.extraction import encode_continuations, padded_tokens

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
    """``space_bits``, ``secret_set``, ``exposure_method``, ``canaries`` and ``by_repetitions``
    of :data:`extraction.json <dpaudit.stages.extract>` for the run's secret canaries."""
    from dpaudit.canaries import sample_secrets, secret_space_size
    from dpaudit.extraction import (
        encode_continuations,
        enumerated_exposure,
        sample_continuations,
        sampled_exposure,
        score_continuations,
        secret_space,
    )
    from dpaudit.progress import Progress

    if not secrets:
        return {"space_bits": None, "secret_set": None, "exposure_method": None, "canaries": [], "by_repetitions": []}
    sec, ex = config.canaries.secrets, config.extract
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
            "by_repetitions": by_repetitions(rows)}


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


# ----------------------------------------------------------------------------------------
# PII fields and k-extractable records
# ----------------------------------------------------------------------------------------


def _sample(indices: list[int], limit: int, rng: np.random.Generator) -> list[int]:
    return indices if len(indices) <= limit else sorted(rng.choice(indices, size=limit, replace=False).tolist())


def pii_extraction(model, tokenizer, candidates: list[dict], *, max_length: int, max_records: int, seed: int,
                   batch_size: int = 16, device="auto") -> dict | None:
    """``{"members": {field: {"num", "extracted", "fraction"}}, "heldout": {...}}``: greedy
    decoding from each note's text up to a PII field (:data:`PII_FIELDS`) emits the field
    exactly; held-out notes whose value also occurs in a member note are left out, as are
    fields beyond ``max_length`` tokens; at most ``max_records`` notes per role and field (a
    seeded sample). None when no field occurs in both roles."""
    from dpaudit.extraction import encode_continuations, score_continuations

    out: dict = {"members": {}, "heldout": {}, "method": "greedy decoding from the note's text up to the field"}
    rng = np.random.default_rng(seed)
    for field in PII_FIELDS:
        notes = pii_notes(candidates, field)
        if notes is None:
            continue
        pre, tgt = encode_continuations(tokenizer, prefixes=[n["prefix"] for n in notes],
                                        targets=[n["target"] for n in notes], who="pii")
        for role, key in (("member", "members"), ("heldout", "heldout")):
            ix = [i for i, n in enumerate(notes) if n["role"] == role and len(pre[i]) + len(tgt[i]) <= max_length]
            ix = _sample(ix, max_records, rng)
            hit = score_continuations(model, [pre[i] for i in ix], [tgt[i] for i in ix], batch_size=batch_size,
                                      device=device).extracted if ix else np.zeros(0, bool)
            out[key][field] = {"num": len(ix), "extracted": int(hit.sum()),
                               "fraction": float(hit.mean()) if ix else None}
    return out if out["members"] else None


def k_extractable_records(model, tokenizer, candidates: list[dict], *, config) -> dict:
    """``{"k", "suffix_length", "members": {"num", "extracted", "fraction"}, "heldout": ...}``
    (Carlini et al. 2023, arXiv 2202.07646) over at most ``extract.max_records`` records per
    role with at least ``k + suffix_length`` tokens within ``data.max_length`` (a seeded
    sample); ``num`` 0 when no record is long enough."""
    from dpaudit.extraction import k_extractable

    ex = config.extract
    out: dict = {"k": ex.k, "suffix_length": ex.suffix_length}
    need = ex.k + ex.suffix_length
    rng = np.random.default_rng(config.seed)
    for role, key in (("member", "members"), ("heldout", "heldout")):
        texts = [c["text"] for c in candidates if c["role"] == role]
        lengths = [len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
        ix = [i for i, n in enumerate(lengths) if n >= need] if need <= config.data.max_length else []
        ix = _sample(ix, ex.max_records, rng)
        hit = k_extractable(model, tokenizer, texts=[texts[i] for i in ix], k=ex.k, suffix_length=ex.suffix_length,
                            batch_size=config.attack.batch_size, device=config.train.device) if ix else np.zeros(0, bool)
        out[key] = {"num": len(ix), "extracted": int(hit.sum()), "fraction": float(hit.mean()) if ix else None}
    return out


def pii_notes(candidates: list[dict], field: str) -> list[dict] | None:
    """The candidate notes that carry a PII ``field`` (a key of :data:`PII_FIELDS`), each
    ``{"role", "patient", "prefix", "target"}`` (``patient`` = the field's value, ``target`` =
    the whitespace before it and the value), or None when members or held-out records carry
    none; held-out notes whose value also occurs in a member note are left out."""
    regex = PII_FIELDS[field]
    out = []
    for row in candidates:
        m = regex.search(row["text"])
        if m is not None and row["role"] in ("member", "heldout"):
            out.append({"role": row["role"], "patient": m.group(2),
                        "prefix": row["text"][: m.start(1)], "target": row["text"][m.start(1) : m.end(2)]})
    members = {n["patient"] for n in out if n["role"] == "member"}
    out = [n for n in out if n["role"] == "member" or n["patient"] not in members]
    if not members or all(n["role"] == "member" for n in out):
        return None
    return out


def mrn_notes(candidates: list[dict]) -> list[dict] | None:
    """:func:`pii_notes` of the MRN (``patient`` = the MRN)."""
    return pii_notes(candidates, "mrn")


def _cap(patients: list[tuple[str, list[int]]], limit: int, rng: np.random.Generator) -> list[tuple[str, list[int]]]:
    """Whole patients in a seeded random order while their notes fit in ``limit`` (all of
    them when they do)."""
    if sum(len(ix) for _, ix in patients) <= limit:
        return patients
    kept, used = [], 0
    for j in rng.permutation(len(patients)):
        if used + len(patients[j][1]) <= limit:
            kept.append(patients[j])
            used += len(patients[j][1])
    return sorted(kept)


def patient_groups(notes: list[dict], *, max_notes: int = MAX_NOTES_PER_GROUP,
                   seed: int = SAMPLE_SEED) -> dict[int, dict[str, list[tuple[str, list[int]]]]]:
    """``{k: {role: [(patient, [note indices])]}}``: the patients of each role with ``k``
    notes, capped at ``max_notes`` notes per group and role (a seeded sample of whole
    patients), patients in MRN order."""
    by: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, n in enumerate(notes):
        by[(n["role"], n["patient"])].append(i)
    groups: dict[int, dict[str, list]] = defaultdict(lambda: {"member": [], "heldout": []})
    for (role, patient), ix in sorted(by.items()):
        groups[len(ix)][role].append((patient, ix))
    rng = np.random.default_rng(seed)
    return {k: {role: _cap(groups[k][role], max_notes, rng) for role in ("member", "heldout")}
            for k in sorted(groups)}


def patient_secrets(model, tokenizer, notes: list[dict], *, max_length: int, batch_size: int = 16,
                    device="auto", max_notes: int = MAX_NOTES_PER_GROUP, seed: int = SAMPLE_SEED) -> dict:
    """``{"field", "method", "max_notes_per_group", "groups": [...]}`` of
    :data:`extraction.json <dpaudit.stages.extract>`: per number of notes ``k``, member
    and held-out patients, their mean per-token MRN log-probability (mean over each
    patient's notes, then over patients) and the fraction of their notes whose MRN greedy
    decoding reproduces. Notes whose prefix and MRN exceed ``max_length`` tokens (or the
    model's position table) are left out before grouping."""
    from dpaudit.extraction import encode_continuations, score_continuations

    pre, tgt = encode_continuations(tokenizer, prefixes=[n["prefix"] for n in notes],
                                    targets=[n["target"] for n in notes], who="patient_secrets")
    limit = max_length
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int):
        limit = min(limit, positions)
    fits = [i for i in range(len(notes)) if len(pre[i]) + len(tgt[i]) <= limit]
    notes = [notes[i] for i in fits]
    pre, tgt = [pre[i] for i in fits], [tgt[i] for i in fits]
    groups = patient_groups(notes, max_notes=max_notes, seed=seed)
    wanted = sorted(i for g in groups.values() for pats in g.values() for _, ix in pats for i in ix)
    # ``batch_size`` is sized for texts of ``max_length`` tokens; these items are much
    # shorter (a note's header), so a batch holds as many tokens, in more rows: fewer,
    # larger matrix products (which matters most on a busy CPU), no more memory.
    longest = max((len(pre[i]) + len(tgt[i]) for i in wanted), default=1)
    rows = max(batch_size, batch_size * max_length // longest)
    scores = score_continuations(model, [pre[i] for i in wanted], [tgt[i] for i in wanted],
                                 batch_size=rows, device=device)
    mean_lp = dict(zip(wanted, scores.mean_logprob()))
    hit = dict(zip(wanted, scores.extracted))
    rows = []
    for k, g in groups.items():
        row: dict = {"notes": k}
        for role in ("member", "heldout"):
            row[f"{role}_patients"] = len(g[role])
        for role in ("member", "heldout"):  # each patient's notes averaged, then the patients
            per_patient = [np.mean([mean_lp[i] for i in ix]) for _, ix in g[role]]
            row[f"{role}_mean_logprob"] = float(np.mean(per_patient)) if per_patient else None
        for role in ("member", "heldout"):  # a fraction of notes
            flat = [hit[i] for _, ix in g[role] for i in ix]
            row[f"{role}_extracted"] = float(np.mean(flat)) if flat else None
        rows.append(row)
    return {"field": PATIENT_FIELD, "method": _PATIENT_METHOD, "max_notes_per_group": max_notes, "groups": rows}
