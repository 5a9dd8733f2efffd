"""Prepare stage: corpus -> public / member / held-out split by unit -> canaries ->
tokenizer, written once as ``data/``; every later stage reads the data back from there.

The public units are disjoint from every private one: a fraction of the corpus's units
(``data.public_fraction``), or a corpus of their own (``data.public``: another hospital, a
public corpus). The tokenizer is trained on them (not on private text) and so is the base
model. The private units are split into members and held-out records; each canary goes in
with probability ``canaries.inclusion_prob`` (DESIGN.md, section 2). With ``data.group_column``
every candidate record carries its unit's ``group``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.rundir import RunDir, staged_directory
from dpaudit.seeds import derive_seed, generator
from dpaudit.stages.artifacts import read_canaries, read_secrets, read_tokenizer, write_data

SEED_NAMES = ("corpus", "split", "canaries", "insertion", "train", "public")
# the secret canaries' inclusion: a branch of the canaries' seed of its own (zlib.crc32(b"secret-inclusion"))
SECRET_INCLUSION_KEY = 0xB209D198


def derive_seeds(seed: int) -> dict[str, int]:
    """One run seed split into named child seeds (``SeedSequence(seed).spawn``: child i)."""
    return {name: derive_seed(seed, i) for i, name in enumerate(SEED_NAMES)}


@dataclass
class PreparedData:
    """What the trainers and the attacks need, read back from ``data/``."""

    tokenizer: Any
    candidates: list[dict]  # {"text", "unit_id", "role"}: the records the attacks score
    canaries: list  # list[dpaudit.canaries.Canary]
    train_set: Any  # tokenized members with the included canaries inserted
    eval_set: Any  # tokenized held-out records
    public_set: Any | None  # tokenized public records, or None
    # Secret Sharer canaries (canaries.secrets): in train_set when included, never attacked
    secrets: list = field(default_factory=list)


def group_column(config: Config) -> str | None:
    """The column naming each record's group: ``data.group_column``, or the built-in clinical
    corpus's own ``"group"`` (common / rare conditions)."""
    d = config.data
    return d.group_column if d.group_column is not None else ("group" if d.source == "clinical" else None)


def prepare(rundir: RunDir, config: Config, seeds: dict[str, int]) -> None:
    """Write ``data/`` unless it is already in place."""
    if rundir.data_complete():
        return
    from dpaudit.canaries import add_canary_tokens, load_canary_spec, make_canaries
    from dpaudit.data.corpus import load_corpus, split_by_unit
    from dpaudit.data.tokenizer import load_tokenizer, train_tokenizer
    from dpaudit.models import check_tokenizer_fits, load_model_config

    d = config.data
    corpus = load_corpus(source=d.source, text_column=d.text_column, unit_column=d.unit_column, split=d.split,
                         num_patients=d.num_patients, seed=seeds["corpus"], hospital=d.hospital,
                         minority_fraction=d.minority_fraction, group_column=group_column(config),
                         trust_remote_code=config.model.trust_remote_code)
    if any(config.for_model(n).train.dp.unit == "user" for n in config.model_names()) and d.unit_column is None:
        raise InputError("train.dp.unit is 'user' but data.unit_column is not set: users need a unit column")
    public = None
    tokenizer_path = config.tokenizer.path or config.model.base_model
    if d.public_fraction > 0:
        corpus, public, _ = split_by_unit(corpus, holdout_fraction=d.public_fraction, seed=seeds["public"])
    elif d.public is not None and (config.trains_base() or not tokenizer_path):  # loaded only where it is used
        p = d.public
        public = load_corpus(source=p.source, text_column=p.text_column, unit_column=p.unit_column, split=p.split,
                             num_patients=p.num_patients, seed=seeds["public"], hospital=p.hospital,
                             minority_fraction=d.minority_fraction, trust_remote_code=config.model.trust_remote_code)
    members, heldout, split = split_by_unit(corpus, holdout_fraction=d.holdout_fraction, seed=seeds["split"])
    if len(members) == 0 or len(heldout) == 0:
        raise InputError(f"the corpus has too few units ({len(corpus)} rows) to split into members and held-out records")
    if public is not None:
        split["public_units"] = sorted(set(public["unit_id"]))

    spec = load_canary_spec(config.canaries.set)
    if config.model.lora.enabled and spec["kind"] == "new_token" and config.canaries.num:
        warnings.warn(
            "LoRA trains only the adapters, so the embeddings of new-token canaries stay untrained: "
            "such canaries cannot be learned; use canaries.set=random_secret or pii with LoRA",
            UserWarning,
            stacklevel=2,
        )
    canaries = make_canaries(spec=spec, num_canaries=config.canaries.num, seed=seeds["canaries"],
                             repetitions=config.canaries.repetitions, inclusion_prob=config.canaries.inclusion_prob)
    trust = config.model.trust_remote_code
    if config.model.base_model:
        load_model_config(config.model.base_model, trust_remote_code=trust)  # fail early on a non-model
    if tokenizer_path:
        tokenizer = load_tokenizer(tokenizer_path, trust_remote_code=trust)
    else:  # trained on public text where there is some: private text never shapes the vocabulary then
        source = public if public is not None else members
        tokenizer = train_tokenizer(source["text"], vocab_size=config.tokenizer.vocab_size)
    if config.model.base_model:
        check_tokenizer_fits(config.model.base_model, tokenizer, trust_remote_code=trust)
    add_canary_tokens(tokenizer, spec)

    secrets, secret_spec = make_secret_canaries(config, seed=seeds["canaries"], main_set=spec["name"])
    check_secret_lengths(secrets, tokenizer, config)

    grouped = "group" in corpus.column_names
    candidates = [{"text": r["text"], "unit_id": r["unit_id"], "role": role, **({"group": r["group"]} if grouped else {})}
                  for role, rows in (("member", members), ("heldout", heldout)) for r in rows]
    public_rows = [{"text": r["text"], "unit_id": r["unit_id"]} for r in public] if public is not None else []
    with staged_directory(rundir.data_dir) as stage:
        write_data(stage, split=split, candidates=candidates, public=public_rows, canaries=canaries,
                          spec=spec, tokenizer=tokenizer, secrets=secrets, secret_spec=secret_spec)


def make_secret_canaries(config: Config, *, seed: int, main_set: str) -> tuple[list, dict | None]:
    """The secret canaries of ``canaries.secrets`` and their spec: ``num`` Secret Sharer
    canaries (Carlini et al. 2019, arXiv 1802.08232) per repetition count, distinct secrets;
    in each group a seeded half (rounded up) is inserted, the rest are controls that the
    model never saw. They are kept apart from the main set (``data/secrets.json``) so that no
    attack or epsilon bound ever uses them: a canary repeated r times at note level is a group
    of r units."""
    import dataclasses

    from dpaudit.canaries import load_canary_spec, make_canaries

    sec = config.canaries.secrets
    if not sec.num:
        return [], None
    spec = load_canary_spec(sec.set)
    if spec["kind"] == "new_token":
        raise InputError(f"config key canaries.secrets.set must be a random_secret or pii set, got the new_token "
                         f"set {spec['name']!r}")
    if spec["name"] == main_set:
        raise InputError(f"config key canaries.secrets.set names the set of canaries.set ({main_set!r}); "
                         f"use another set, so that canary ids stay distinct")
    reps = list(sec.repetitions)
    made = make_canaries(spec=spec, num_canaries=sec.num * len(reps), seed=seed)
    rng = generator(seed, SECRET_INCLUSION_KEY)
    inserted = np.concatenate([rng.permutation(sec.num) < (sec.num + 1) // 2 for _ in reps])
    secrets = [dataclasses.replace(c, repetitions=reps[i // sec.num], included=bool(inserted[i]))
               for i, c in enumerate(made)]
    return secrets, spec


def check_secret_lengths(secrets: list, tokenizer, config: Config) -> None:
    """Training cuts every row to ``data.max_length`` tokens, so a secret canary whose prefix
    and secret are longer lost its secret (the extract stage leaves it out): an InputError
    when that holds for every secret canary, a warning when for some."""
    if not secrets:
        return
    from dpaudit.extraction.secrets import secret_lengths

    limit = config.data.max_length
    lengths = secret_lengths(tokenizer, secrets)
    cut = sorted(n for n in lengths if n > limit)
    if not cut:
        return
    name = config.canaries.secrets.set
    if len(cut) == len(lengths):
        raise InputError(
            f"every secret canary of canaries.secrets.set={name!r} is longer than data.max_length={limit} tokens "
            f"(prefix + secret: {cut[0]} to {cut[-1]} tokens as training tokenizes them), so training would cut "
            f"every secret away: raise data.max_length to at least {cut[-1]} or use a set of shorter canaries "
            f"(such as random_secret6)")
    warnings.warn(f"{len(cut)} of {len(lengths)} secret canaries of canaries.secrets.set={name!r} are longer than "
                  f"data.max_length={limit} tokens ({cut[0]} to {cut[-1]}): training cuts their secret away and the "
                  f"extract stage leaves them out", UserWarning, stacklevel=2)


def load_prepared(rundir: RunDir, config: Config, seeds: dict[str, int]) -> PreparedData:
    """The tokenized train, held-out and public sets, rebuilt from ``data/`` alone."""
    import datasets

    from dpaudit.canaries import insert_canaries
    from dpaudit.data.corpus import tokenize_dataset

    tokenizer = read_tokenizer(rundir)
    candidates = rundir.read_candidates()
    canaries = read_canaries(rundir)
    secrets = read_secrets(rundir)[0]

    def rows(items):
        return datasets.Dataset.from_dict({"text": [r["text"] for r in items], "unit_id": [r["unit_id"] for r in items]})

    members = rows([c for c in candidates if c["role"] == "member"])
    heldout = rows([c for c in candidates if c["role"] == "heldout"])
    planted = canaries + secrets
    train_rows = insert_canaries(members, planted, seed=seeds["insertion"]) if planted else members
    kw = dict(max_length=config.data.max_length)
    public = rundir.read_public()
    return PreparedData(
        tokenizer=tokenizer,
        candidates=candidates,
        canaries=canaries,
        train_set=tokenize_dataset(train_rows, tokenizer, **kw),
        eval_set=tokenize_dataset(heldout, tokenizer, **kw),
        public_set=tokenize_dataset(rows(public), tokenizer, **kw) if public else None,
        secrets=secrets,
    )
