"""The stages of a run: prepare data, train the target model, and write the run directory.

Every stage reads and writes artifacts of one run directory (DESIGN.md, section 2).
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.config import Config
from dpaudit.errors import InputError
from dpaudit.rundir import manifest, staged_directory, write_json_atomic, write_text_atomic

log = logging.getLogger(__name__)

SEED_NAMES = ("corpus", "split", "canaries", "insertion", "train")


def derive_seeds(seed: int) -> dict[str, int]:
    """One run seed split into named child seeds with ``SeedSequence.spawn``."""
    children = np.random.SeedSequence(seed).spawn(len(SEED_NAMES))
    return {name: int(child.generate_state(1)[0]) for name, child in zip(SEED_NAMES, children)}


@dataclass
class PreparedData:
    """Everything the trainer and the attacks need, derived deterministically from the config."""

    tokenizer: Any
    members: Any  # datasets.Dataset of member records (no canaries)
    heldout: Any  # datasets.Dataset of held-out records
    canaries: list  # list[dpaudit.canaries.Canary]
    canary_spec: dict
    train_set: Any  # tokenized members with the included canaries inserted
    eval_set: Any  # tokenized held-out records
    split: dict[str, Any]


def prepare_data(config: Config, seeds: dict[str, int]) -> PreparedData:
    """Corpus -> member/held-out split by unit -> canaries -> tokenizer -> tokenized train set."""
    from dpaudit.canaries import add_canary_tokens, insert_canaries, load_canary_spec, make_canaries
    from dpaudit.data.corpus import load_corpus, split_by_unit, tokenize_dataset
    from dpaudit.data.tokenizer import load_tokenizer, train_tokenizer
    from dpaudit.models import check_tokenizer_fits, load_model_config

    d = config.data
    corpus = load_corpus(
        source=d.source,
        text_column=d.text_column,
        unit_column=d.unit_column,
        split=d.split,
        num_patients=d.num_patients,
        seed=seeds["corpus"],
        trust_remote_code=config.model.trust_remote_code,
    )
    if config.train.dp.unit == "user" and d.unit_column is None:
        raise InputError("train.dp.unit is 'user' but data.unit_column is not set: users need a unit column")
    members, heldout, split = split_by_unit(corpus, holdout_fraction=d.holdout_fraction, seed=seeds["split"])
    if len(members) == 0 or len(heldout) == 0:
        raise InputError(f"the corpus has too few units ({len(corpus)} rows) to split into members and held-out records")

    spec = load_canary_spec(config.canaries.set)
    if config.model.lora.enabled and spec["kind"] == "new_token" and config.canaries.num:
        warnings.warn(
            "LoRA trains only the adapters, so the embeddings of new-token canaries stay untrained: "
            "such canaries cannot be learned; use canaries.set=random_secret or pii with LoRA",
            UserWarning,
            stacklevel=2,
        )
    canaries = make_canaries(
        spec=spec,
        num_canaries=config.canaries.num,
        seed=seeds["canaries"],
        repetitions=config.canaries.repetitions,
        inclusion_prob=config.canaries.inclusion_prob,
    )
    trust = config.model.trust_remote_code
    if config.model.base_model:
        load_model_config(config.model.base_model, trust_remote_code=trust)  # fail early on a non-model
    tokenizer_path = config.tokenizer.path or config.model.base_model
    if tokenizer_path:
        tokenizer = load_tokenizer(tokenizer_path, trust_remote_code=trust)
    else:
        tokenizer = train_tokenizer(members["text"], vocab_size=config.tokenizer.vocab_size)
    if config.model.base_model:
        check_tokenizer_fits(config.model.base_model, tokenizer, trust_remote_code=trust)
    add_canary_tokens(tokenizer, spec)

    train_rows = insert_canaries(members, canaries, seed=seeds["insertion"]) if canaries else members
    train_set = tokenize_dataset(train_rows, tokenizer, max_length=d.max_length)
    eval_set = tokenize_dataset(heldout, tokenizer, max_length=d.max_length)
    return PreparedData(tokenizer, members, heldout, canaries, spec, train_set, eval_set, split)


def train_run(config: Config, out: str | Path, *, force: bool = False, command: list[str] | None = None) -> Path:
    """``dpaudit train``: write a complete run directory at ``out`` or nothing at all."""
    from dpaudit.canaries import save_canaries
    from dpaudit.data.corpus import save_split
    from dpaudit.models import save_model
    from dpaudit.plugins import call_trainer, load_trainer

    trainer = load_trainer(config.train.trainer)  # fail on a bad plug-in before any work
    seeds = derive_seeds(config.seed)
    with staged_directory(out, force=force) as stage:
        write_text_atomic(stage / "config.resolved.yaml", config.to_yaml())
        data = prepare_data(config, seeds)
        save_split(data.split, stage / "data_split.json")
        write_text_atomic(stage / "candidates.jsonl", "".join(
            json.dumps({"text": row["text"], "unit_id": row["unit_id"], "role": role}) + "\n"
            for role, rows in (("member", data.members), ("heldout", data.heldout))
            for row in rows
        ))
        save_canaries(data.canaries, stage / "canaries.json", spec=data.canary_spec)
        model = call_trainer(
            trainer,
            data.train_set,
            data.tokenizer,
            seed=seeds["train"],
            config=config,
            run_dir=stage,
            eval_dataset=data.eval_set,
        )
        save_model(model, data.tokenizer, stage / "model")
        write_json_atomic(stage / "manifest.json", manifest(seeds={"run": config.seed, **seeds}, command=command))
    return Path(out)
