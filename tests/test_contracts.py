"""One contract suite per kind of member (the shape of scikit-learn's ``parametrize_with_checks``):
every trainer plug-in the toolkit ships plus a third-party one, every canary set, and every
artifact codec, each run through the same checks.

Attacks and bounds have theirs beside them: tests/attacks/test_attack_contract.py and
tests/audit/test_audit_bound_contract.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel, PreTrainedTokenizerFast

from dpaudit.accounting import DpRecord
from dpaudit.audit import CanaryScores
from dpaudit.audit.groups import UnitClipping
from dpaudit.audit.ladder import Rung
from dpaudit.canaries import (
    KINDS,
    canaries_from_dict,
    canaries_to_dict,
    list_canary_sets,
    load_canary_spec,
    make_canaries,
    validate_canary_spec,
)
from dpaudit.config import PRESETS, load_config
from dpaudit.errors import InputError
from dpaudit.plugins import load_trainer
from dpaudit.rundir import SCHEMA_VERSION, ModelDir, RunDir
from dpaudit.signals import TokenSignals
from dpaudit.stages import artifacts
from dpaudit.stages.prepare import derive_seeds
from dpaudit.stages.signal_cache import load_signals, save_signals
from dpaudit.stages.train import train_and_save
from dpaudit.train import TrainingRecord
from dpaudit.train.faulty import FAULTY_TRAINERS

# --------------------------------------------------------------------------- a tiny corpus, no download

WORDS = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(40)]
NUM_UNITS, ROWS_PER_UNIT, MAX_LENGTH, BATCH = 8, 2, 12, 4


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``w0`` .. ``w39`` (as tests/fleet/fleet_plugin.py builds one)."""
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<eos>", unk_token="<unk>")


def make_rows(tokenizer) -> Dataset:
    """``NUM_UNITS`` units of ``ROWS_PER_UNIT`` rows: the columns every trainer is given."""
    texts, units = [], []
    for u in range(NUM_UNITS):
        for r in range(ROWS_PER_UNIT):
            texts.append(" ".join(f"w{(u * 7 + r * 3 + k) % 40}" for k in range(6)))
            units.append(f"unit-{u:02d}")
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=MAX_LENGTH)
    return Dataset.from_dict({"text": texts, "input_ids": enc["input_ids"],
                              "attention_mask": enc["attention_mask"], "unit_id": units})


@pytest.fixture(scope="session")
def corpus():
    tokenizer = make_tokenizer()
    return tokenizer, make_rows(tokenizer)


# --------------------------------------------------------------------------- a third-party trainer


def toy_trainer(dataset, tokenizer, *, seed: int, config=None, record: TrainingRecord | None = None):
    """A trainer of someone else's: plain SGD on a one-layer GPT-2, claiming no DP. It fills
    ``record.log`` and ``record.dp`` (a non-private :class:`DpRecord`) and nothing else."""
    steps = config.train.steps if config is not None and config.train.steps else 2
    batch = config.train.batch_size if config is not None else BATCH
    gen = torch.Generator().manual_seed(seed)
    ids, mask = torch.tensor(dataset["input_ids"]), torch.tensor(dataset["attention_mask"])
    labels = ids.masked_fill(mask == 0, -100)
    with torch.random.fork_rng(devices=[]):  # the initial weights and dropout: seeded, global state restored
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer),
                                           n_positions=32))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        for step in range(1, steps + 1):
            rows = torch.randperm(len(ids), generator=gen)[:batch]
            loss = model(input_ids=ids[rows], attention_mask=mask[rows], labels=labels[rows]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if record is not None:
                record.log.append({"step": step, "train_loss": loss.item()})
    if record is not None:
        record.dp = DpRecord.nonprivate(trainer=TOY_TRAINER, num_units=len(set(dataset["unit_id"])), steps=steps,
                                        expected_batch_size=batch, sampler="shuffle")
    return model.eval()


TOY_TRAINER = f"{__name__}:toy_trainer"  # MODULE:FUNCTION, as a user names it in train.trainer


# --------------------------------------------------------------------------- every trainer

OPACUS = [pytest.param(spec, marks=pytest.mark.skipif(importlib.util.find_spec("opacus") is None,
                                                      reason="opacus is not installed"))
          for spec in ("dpaudit.train.opacus:dpsgd", "dpaudit.adapters.opacus:train_hooks_flat",
                       "dpaudit.adapters.opacus:train_ghost_flat")]
TRAINERS = ["dpaudit.train:nonprivate", "dpaudit.train:dpsgd", *OPACUS,
            *(f"dpaudit.train.faulty:{key}" for key in FAULTY_TRAINERS), TOY_TRAINER]
# records the accounting of another event than the one it runs, on purpose (dpaudit.train.faulty)
WRONG_ACCOUNTING = {"dpaudit.train.faulty:microstep_accounting"}
SIGMA = 1.0


def trainer_config(spec: str):
    overrides = [f"train.trainer={spec}", "train.steps=2", "model.size=tiny", f"train.batch_size={BATCH}",
                 f"train.microbatch_size={BATCH}", f"data.max_length={MAX_LENGTH}", "train.max_eval_examples=4",
                 "train.device=cpu"]
    if claims_dp(spec):
        # rdp: the PLD accountant costs about 0.5 s a record; the record and its codec are the same
        overrides += [f"train.dp.noise_multiplier={SIGMA}", "train.dp.reproducible=true", "train.dp.accountant=rdp"]
    return load_config("tiny", overrides=overrides)


def claims_dp(spec: str) -> bool:
    return bool(getattr(load_trainer(spec), "claims_dp", False))


@dataclass
class Trained:
    """One trainer through ``train_and_save`` three times: seed 0 (``directory``, ``model``),
    seed 0 again (``again``) and seed 1 (``other``)."""

    spec: str
    directory: Path
    model: Any
    again: Any
    other: Any
    vocab: int


@pytest.fixture(scope="session")
def trained(corpus, tmp_path_factory):
    tokenizer, rows = corpus
    cache: dict[str, Trained] = {}

    def get(spec: str) -> Trained:
        if spec not in cache:
            saved = torch.get_num_threads()
            torch.set_num_threads(1)  # tiny models: one thread is fastest, and the box is shared
            try:
                root = tmp_path_factory.mktemp(spec.replace(":", "-").replace(".", "-"))
                run = [train_and_save(root / f"run{i}", dataset=rows, tokenizer=tokenizer, seed=seed,
                                      config=trainer_config(spec)) for i, seed in enumerate((0, 0, 1))]
            finally:
                torch.set_num_threads(saved)
            cache[spec] = Trained(spec, root / "run0", run[0], run[1], run[2], len(tokenizer))
        return cache[spec]

    return get


def check_returns_a_causal_lm(t: Trained):
    model = t.model
    assert isinstance(model, PreTrainedModel) and hasattr(model, "generate")
    assert all(bool(p.isfinite().all()) for p in model.parameters())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[3, 4, 5]])).logits
    assert logits.shape == (1, 3, t.vocab) and bool(logits.isfinite().all())


def check_saves_what_it_returned(t: Trained):
    from dpaudit.models import load_model

    assert_same_weights(load_model(t.directory), t.model)
    log = ModelDir(t.directory).read_train_log()
    assert log and all(isinstance(row.get("step"), int) for row in log)


def check_dp_record(t: Trained):
    """``dp_event.json`` reads back as a DpRecord; its dict codec round-trips; epsilon is
    recomputed from the event: inf without a DP claim, finite with one."""
    record = artifacts.read_dp_record(t.directory)
    assert isinstance(record, DpRecord) and record.trainer == t.spec
    assert DpRecord.from_dict(json.loads(json.dumps(record.to_dict(), allow_nan=False))) == record
    eps = record.epsilon()
    if not claims_dp(t.spec):
        assert not record.private and eps == math.inf
        return
    assert record.private and math.isfinite(eps) and eps > 0
    assert eps == pytest.approx(record.logged_epsilon, rel=1e-9)
    # what the loop ran: Poisson rate B / N over the N = rows of example-level DP
    run = {"noise_multiplier": SIGMA, "sample_rate": BATCH / (NUM_UNITS * ROWS_PER_UNIT), "steps": 2}
    assert (record.dpsgd_parameters == run) is (t.spec not in WRONG_ACCOUNTING), record.dpsgd_parameters


def check_seed_is_honoured(t: Trained):
    assert_same_weights(t.again, t.model)
    a, b = t.model.state_dict(), t.other.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a), "seed 1 trained the same weights as seed 0"


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


TRAINER_CHECKS = [check_returns_a_causal_lm, check_saves_what_it_returned, check_dp_record, check_seed_is_honoured]


@pytest.mark.parametrize("check", TRAINER_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("spec", TRAINERS)
def test_trainer_contract(spec, check, trained):
    check(trained(spec))


# --------------------------------------------------------------------------- every canary set

NUM = 60


def check_spec_validates(name):
    spec = load_canary_spec(name)
    assert spec["name"] == name and spec["kind"] in KINDS
    assert validate_canary_spec(spec) == spec  # the normalised form is a fixed point


def check_deterministic_per_seed(name):
    first = make_canaries(spec=name, num_canaries=NUM, seed=3)
    assert make_canaries(spec=name, num_canaries=NUM, seed=3) == first
    other = make_canaries(spec=name, num_canaries=NUM, seed=4)
    assert [c.secret for c in other] != [c.secret for c in first]
    assert [c.included for c in other] != [c.included for c in first]


def check_distinct_and_well_formed(name):
    canaries = make_canaries(spec=name, num_canaries=NUM, seed=5, repetitions=3)
    assert len({c.secret for c in canaries}) == NUM and len({c.id for c in canaries}) == NUM
    kind = load_canary_spec(name)["kind"]
    for c in canaries:
        assert c.text == c.prefix + c.secret and c.kind == kind and c.repetitions == 3


def check_inclusion_probability(name):
    m = 1000
    for p in (0.5, 0.2):
        k = sum(c.included for c in make_canaries(spec=name, num_canaries=m, seed=11, inclusion_prob=p))
        assert abs(k - m * p) <= 5 * math.sqrt(m * p * (1 - p)), (p, k)  # a loose 5-sigma band
    assert not any(c.included for c in make_canaries(spec=name, num_canaries=NUM, seed=11, inclusion_prob=0.0))
    assert all(c.included for c in make_canaries(spec=name, num_canaries=NUM, seed=11, inclusion_prob=1.0))


def check_round_trip(name):
    canaries = make_canaries(spec=name, num_canaries=NUM, seed=6)
    spec = load_canary_spec(name)
    text = json.dumps(canaries_to_dict(canaries, spec=name), allow_nan=False)
    assert canaries_from_dict(json.loads(text)) == (canaries, spec)
    assert canaries_from_dict(canaries_to_dict(canaries)) == (canaries, None)


CANARY_CHECKS = [check_spec_validates, check_deterministic_per_seed, check_distinct_and_well_formed,
                 check_inclusion_probability, check_round_trip]


def test_canary_sets_are_shipped():
    assert len(list_canary_sets()) >= len(KINDS)
    assert {load_canary_spec(n)["kind"] for n in list_canary_sets()} == set(KINDS)


@pytest.mark.parametrize("check", CANARY_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", list_canary_sets())
def test_canary_set_contract(name, check):
    check(name)


# --------------------------------------------------------------------------- every artifact codec


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (arrays: dtype and values)."""
    if isinstance(a, TokenSignals):
        return isinstance(b, TokenSignals) and same(a.to_arrays(), b.to_arrays())
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class Codec:
    """``write(root, example)`` then ``read(root)`` gives ``expected(example)`` (default: the
    example itself); ``root`` is an empty directory."""

    name: str
    write: Any
    read: Any
    example: Any
    expected: Any = None


RNG = np.random.default_rng(0)
DP = DpRecord.dpsgd(trainer="dpaudit.train:dpsgd", noise_multiplier=1.1, sample_rate=0.01, steps=100, delta=1e-5,
                    max_grad_norm=0.5, unit="user", num_units=1000, expected_batch_size=10, accountant="rdp",
                    target_epsilon=3.0, noise="reproducible", warning="seeded noise: not for release")
NONPRIVATE = DpRecord.nonprivate(trainer=TOY_TRAINER, num_units=40, steps=7, expected_batch_size=8, sampler="shuffle")
TRAINING = TrainingRecord(log=[{"step": 0, "train_eval_loss": 4.25, "heldout_loss": None},
                               {"step": 1, "train_loss": 4.0, "lr": 0.003, "batch_size": 3, "clipped_fraction": 0.5}],
                          checks={"ok": True, "sampler": "poisson", "batch_size": {"mean": 3.0, "consistent": True},
                                  "seeds": {"model": 1, "noise": None}},
                          dp=DP)
UNIT_CLIPPING = UnitClipping(unit_ids=np.array(["p01", "p01", "canary-3"]), sampled=np.array([4, 2, 0]),
                             clipped=np.array([1, 2, 0]), norm_sum=np.array([3.5, 9.0, 0.0]), max_grad_norm=1.0)
SPLIT = {"schema_version": 1, "seed": 4, "holdout_fraction": 0.5, "member_units": ["p01", "p03"],
         "heldout_units": ["p02"], "public_units": ["p00"]}
CANARIES = make_canaries(spec="random_secret", num_canaries=5, seed=2, repetitions=2)
SIGNALS = TokenSignals(logprob=-RNG.random((4, 6)).astype(np.float32), mask=RNG.random((4, 6)) < 0.8,
                       mean=-RNG.random((4, 6)).astype(np.float32), std=RNG.random((4, 6)).astype(np.float32))
METRICS = {"auc": 0.625, "auc_ci": [0.5, 0.75], "tpr_at_fpr": {"0.1": 0.25, "0.01": None}, "num_in": 3,
           "num_out": 3, "epsilon_lower_bounds": {"one_run": {"epsilon": 0.0, "sound": True}}}
RESULTS = {"params": {"k": 0.2}, "splits": {
    "members": (RNG.normal(size=6), np.array([1, 0, 1, 0, 1, 0], bool), METRICS),
    "canaries": (RNG.normal(size=4), np.array([1, 1, 0, 0], bool), dict(METRICS, num_in=2, num_out=2))}}
MULTI_RUN = ({"canary": "canary-new_token-0000", "num_runs": 3, "verdict": {"status": "consistent"},
              "bounds": {"clopper_pearson": {"epsilon": 0.0}}},
             RNG.normal(size=3), RNG.normal(size=3))
EXTRACTION = {"canaries": [{"id": "c1", "extracted": True, "rank": 1}], "secrets": None, "k_extractable": {"k": 8}}
LADDER = [
    Rung(rung="released", bound=CanaryScores(in_scores=RNG.normal(1, 1, 50), out_scores=RNG.normal(0, 1, 50),
                                             seed=0).bound("one_run", delta=1e-5, significance=0.05),
         attack="loss", significance=0.05, ideal=0.75, ideal_range=(0.5, 1.0), num_canaries=100,
         regime={"noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 100}, cost_s=1.5),
    Rung(rung="white_box", bound=None, attack=None, significance=None, ideal=None, ideal_range=None,
         num_canaries=0, regime={}, refused="a canary included more often than the claimed sampler's rate"),
]
AUDIT_INPUTS = {"model": "/models/m", "reference_models": ["/models/r0"], "members": {"path": "m.jsonl", "count": 3},
                "max_length": 64, "blind_baseline": {"auc": 0.5, "lift": {"loss": None}}}


def _stamped(obj):
    return {"schema_version": SCHEMA_VERSION, **obj}


def _read_training(root):
    md = ModelDir(root)
    return md.read_train_log(), md.read_train_checks(), artifacts.read_dp_record(md)


def _training_expected(record):
    return record.log, record.checks, record.dp


def _write_dp_dict(root, record):
    (root / "record.json").write_text(json.dumps(record.to_dict(), allow_nan=False))


def _read_dp_dict(root):
    return DpRecord.from_dict(json.loads((root / "record.json").read_text()))


def _write_results(root, results):
    ModelDir(root).write_results("toy_attack", **results)


def _results_expected(results):
    return {"toy_attack": {"params": results["params"],
                           "splits": {s: metrics for s, (_, _, metrics) in results["splits"].items()},
                           "arrays": {s: (scores, labels) for s, (scores, labels, _) in results["splits"].items()}}}


def _write_error(root, example):
    stage, error = example
    ModelDir(root).write_error(stage=stage, error=error)


CODECS = [
    Codec("dp_record_dict", _write_dp_dict, _read_dp_dict, DP),
    Codec("dp_record_dict_nonprivate", _write_dp_dict, _read_dp_dict, NONPRIVATE),
    Codec("dp_record_file", artifacts.write_dp_record, artifacts.read_dp_record, DP),
    Codec("training", artifacts.write_training, _read_training, TRAINING, _training_expected),
    Codec("training_nonprivate", artifacts.write_training, _read_training,
          dataclasses.replace(TRAINING, dp=NONPRIVATE, checks=None), _training_expected),
    Codec("unit_clipping", lambda root, u: artifacts.write_training(root, TrainingRecord(unit_clipping=u)),
          lambda root: artifacts.read_unit_clipping(root).to_arrays(), UNIT_CLIPPING, lambda u: u.to_arrays()),
    Codec("split", lambda root, s: artifacts.save_split(s, root / "split.json"),
          lambda root: artifacts.load_split(root / "split.json"), SPLIT),
    Codec("canaries", lambda root, c: artifacts.save_canaries(c, root / "c.json", spec="random_secret"),
          lambda root: artifacts.load_canaries(root / "c.json"), CANARIES,
          lambda c: (c, load_canary_spec("random_secret"))),
    Codec("signals", lambda root, s: save_signals(root / "s.npz", s, fingerprint="abc"),
          lambda root: load_signals(root / "s.npz"), SIGNALS),
    Codec("signals_without_statistics", lambda root, s: save_signals(root / "s.npz", s),
          lambda root: load_signals(root / "s.npz"), TokenSignals(logprob=SIGNALS.logprob, mask=SIGNALS.mask)),
    *(Codec(f"config_{preset}", lambda root, c: RunDir(root).write_config(c), lambda root: RunDir(root).read_config(),
            load_config(preset)) for preset in PRESETS),
    Codec("config_overridden", lambda root, c: RunDir(root).write_config(c), lambda root: RunDir(root).read_config(),
          load_config("tiny", overrides=["seed=3", "train.lr=0.01", "attack.attacks=[loss, zlib]",
                                         "attack.params={min_k: {k: 0.1}}", "model.lora.enabled=true",
                                         "model.lora.target_modules=[c_attn]", "train.dp.delta=1e-6"])),
    Codec("attack_results", _write_results, lambda root: ModelDir(root).read_results(), RESULTS, _results_expected),
    Codec("extraction", lambda root, e: ModelDir(root).write_extraction(e), lambda root: ModelDir(root).read_extraction(),
          EXTRACTION, _stamped),
    Codec("multi_run", lambda root, m: ModelDir(root).write_multi_run(m[0], in_scores=m[1], out_scores=m[2]),
          lambda root: ModelDir(root).read_multi_run(), MULTI_RUN,
          lambda m: {**_stamped(m[0]), "in_scores": m[1], "out_scores": m[2]}),
    Codec("ladder", lambda root, rungs: artifacts.write_ladder(ModelDir(root), rungs),
          lambda root: artifacts.read_ladder(ModelDir(root)), LADDER),
    Codec("audit_inputs", lambda root, a: RunDir(root).write_audit_inputs(a),
          lambda root: RunDir(root).read_audit_inputs(), AUDIT_INPUTS, _stamped),
    Codec("error", _write_error, lambda root: ModelDir(root).read_error(), ("train", InputError("bad <input>")),
          lambda e: _stamped({"stage": e[0], "type": "InputError", "message": "bad <input>"})),
    Codec("manifest", lambda root, m: RunDir(root).write_manifest(m), lambda root: RunDir(root).read_manifest(),
          artifacts.manifest(seeds=derive_seeds(7), command=["dpaudit", "run", "--preset", "tiny"])),
]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_artifact_codec_round_trip(codec, tmp_path):
    codec.write(tmp_path, codec.example)
    expected = codec.example if codec.expected is None else codec.expected(codec.example)
    back = codec.read(tmp_path)
    assert same(back, expected), (back, expected)
    assert not [p.name for p in tmp_path.rglob("*.tmp")]  # written atomically: no temporary left


def test_stage_manifest_writer(tmp_path):
    """The stages' writer: what it wrote reads back, seeds and command as given."""
    seeds = derive_seeds(7)
    artifacts.write_manifest(RunDir(tmp_path), seeds=seeds, command=["dpaudit", "run"])
    back = RunDir(tmp_path).read_manifest()
    assert back["seeds"] == seeds and back["command"] == ["dpaudit", "run"]
    assert back["schema_version"] == SCHEMA_VERSION and back["packages"]["dpaudit"] is not None
