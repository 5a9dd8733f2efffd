"""Typed run configuration: YAML in, validated dataclasses out, resolved YAML back.

A config is built from a preset name (``tiny``, ``demo``, ``gpu``) or a YAML file, then
``--set key.path=value`` overrides are applied. Unknown keys and wrong types are
:class:`~dpaudit.errors.InputError` s that name the full key path.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from dpaudit.errors import InputError

PRESETS = ("tiny", "demo", "gpu")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class PublicDataConfig:
    """Public data from a corpus of its own (another hospital, a public corpus): the tokenizer
    and the base model train on it, and no private unit is in it. ``source`` is loaded as
    ``data.source`` is, with this section's columns; ``hospital`` and ``num_patients`` size the
    built-in clinical corpus, generated from a seed of its own (the run's ``public`` seed)."""

    source: str = "clinical"
    text_column: str = "text"
    unit_column: str | None = "unit_id"
    split: str = "train"
    hospital: str = "general"
    num_patients: int = 400


@dataclass
class DataConfig:
    """Where the training text comes from and how it is split."""

    source: str = "clinical"  # "clinical", a local file or directory, or a hub data set name
    text_column: str = "text"
    unit_column: str | None = "unit_id"
    # the column naming each record's group (e.g. a cohort); the report says per group who pays for
    # the privacy; None: no groups, except the built-in clinical corpus, whose "group" column is
    # used (common / rare conditions)
    group_column: str | None = None
    split: str = "train"
    num_patients: int = 300  # size of the built-in clinical corpus
    hospital: str = "general"  # the built-in clinical corpus's hospital: general or oncology
    # the built-in clinical corpus: share of patients with a rare condition (hospitals that have them)
    minority_fraction: float = 0.05
    holdout_fraction: float = 0.5  # of the private units
    public_fraction: float = 0.0  # units set apart as public data (tokenizer, base model); 0: none
    public: PublicDataConfig | None = None  # public data from a corpus of its own (instead of public_fraction)
    max_length: int = 128

    def has_public(self) -> bool:
        """The run has public data: a corpus of its own, or a fraction of this one's units."""
        return self.public is not None or self.public_fraction > 0


@dataclass
class SecretCanaryConfig:
    """Secret Sharer canaries (Carlini et al. 2019, arXiv 1802.08232) inserted beside the
    main set, for exposure and extraction only: they never enter a membership attack or an
    epsilon bound (repeated canaries are groups of units). ``num`` canaries per repetition
    count; in each group half (rounded up) are inserted, the others are the controls."""

    set: str = "random_secret6"  # a random_secret or pii set (canaries/*.yaml) or a YAML path
    num: int = 0  # per repetition count; 0: no secret canaries
    repetitions: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    enumerate_limit: int = 1_000_000  # exact exposure while |R| <= this, else the skew-normal estimate
    sample_size: int = 2000  # candidates drawn for the skew-normal estimate


@dataclass
class CanaryConfig:
    """Canaries inserted into the members, each with probability ``inclusion_prob``."""

    set: str = "new_token"  # a shipped set (canaries/*.yaml) or a path to a YAML file
    num: int = 100
    repetitions: int = 1
    inclusion_prob: float = 0.5
    secrets: SecretCanaryConfig = field(default_factory=SecretCanaryConfig)


@dataclass
class TokenizerConfig:
    """Tokenizer trained from scratch when no base model is given."""

    vocab_size: int = 2000
    path: str | None = None  # a local tokenizer directory; default: the base model's, else trained


@dataclass
class LoraConfig:
    """Low-rank adapters through ``peft``; only the adapter weights train."""

    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | None = None  # None: peft's default for the architecture


@dataclass
class ModelConfig:
    """Build a GPT-2-style model from a size preset, or load a local causal LM."""

    size: str = "tiny"  # a key of dpaudit.models.SIZES
    base_model: str | None = None  # a local AutoModelForCausalLM directory (or hub name)
    # a model directory whose config.json gives the architecture, with fresh weights (instead of
    # size; not with base_model): audit-model's reference models trained like the audited one
    architecture: str | None = None
    trust_remote_code: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    # which parameters train: all, or the input embedding matrix alone (with tied embeddings
    # also the output layer), where a canary of new tokens has parameters of its own
    trainable: Literal["all", "input_embeddings"] = "all"


@dataclass
class DPConfig:
    """DP-SGD (Abadi et al. 2016). Exactly one of noise_multiplier and target_epsilon."""

    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_grad_norm: float = 1.0
    delta: float | None = None  # None: 1 / (10 N), N protected units, rounded down to a power of ten
    unit: Literal["example", "user"] = "example"
    accountant: Literal["pld", "rdp"] = "pld"
    # per-unit gradients: auto (ghost clipping where it covers the model, else vmap), ghost, vmap
    engine: Literal["auto", "ghost", "vmap"] = "auto"
    # false (secure mode): noise and Poisson sampling from OS entropy, never recorded, so nobody
    # can replay them; true: both seeded from the run seed (audits, tests), not fit for release
    reproducible: bool = False
    # white-box audit: this many Dirac canary gradients of norm C on coordinates of their own,
    # added to the clipped sum before the noise (dpaudit.train.gradient_canaries); 0: off.
    # A model trained with them is an audit model, not fit for release
    gradient_canaries: int = 0


@dataclass
class TrainConfig:
    """Optimisation. ``batch_size`` is the expected batch size (Poisson rate q = B / N)."""

    trainer: str = "dpaudit.train:nonprivate"  # MODULE:FUNCTION
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0
    epochs: float = 1.0
    steps: int | None = None  # overrides epochs when set
    batch_size: int = 16
    microbatch_size: int = 16  # per-example gradients are computed this many at a time
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA
    eval_every: int = 50
    checkpoint_every: int = 0  # 0: no intermediate checkpoints
    max_eval_examples: int = 256
    dp: DPConfig = field(default_factory=DPConfig)


@dataclass
class PretrainConfig:
    """Non-private training of a base model on the public units (``data.public_fraction``)
    before every model of the run fine-tunes it (Li et al. 2021, arXiv 2110.05679). The
    base is cached in the run directory as ``base/``. Skipped when ``model.base_model``
    names a pretrained model of the user's: that one is the base then."""

    enabled: bool = False
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: float = 1.0
    steps: int | None = None
    batch_size: int = 16
    microbatch_size: int = 16
    schedule: Literal["constant", "linear", "cosine"] = "cosine"
    warmup_steps: int = 0


@dataclass
class ModelEntry:
    """One model of the run: a name and overrides of the ``train`` section, e.g.
    ``{name: dp-eps4, train: {trainer: "dpaudit.train:dpsgd", dp: {target_epsilon: 4}}}``."""

    name: str
    train: dict[str, Any] = field(default_factory=dict)


@dataclass
class FleetConfig:
    """Reference models trained like the target, on random subsets drawn at its own rates."""

    num_models: int = 0
    executor: Literal["local", "ray"] = "local"
    address: str | None = None  # ray: "auto" or "host:port"; None starts a local instance
    workers: int = 1  # local: processes at once (the fleet's models, and the run's own models and twins)
    num_cpus: int | None = None  # ray: CPUs per model (None: cores / workers on a local instance, else 1)
    num_gpus: float = 0.0  # ray: GPUs per model


@dataclass
class AttackConfig:
    """Membership attacks to run (registry names; empty means every runnable one) and
    keyword parameters for some of them, e.g. ``params: {lira_online: {variance: per_example}}``."""

    attacks: list[str] = field(default_factory=list)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_size: int = 16


@dataclass
class LadderConfig:
    """The threat-model ladder (Nasr et al. 2021, arXiv 2101.04535): besides the audit of the
    released model, each DP model's trainer and claim are audited by adversaries of growing
    strength. ``input_space``: a twin of the model trained by the same trainer with the same
    claim in the isolated design (``input_space_canaries`` fresh-token canaries, only their
    embedding rows training, full batch, plain SGD), on a corpus of ``twin_patients``
    patients; ``gradient_canaries``: white-box Dirac canaries in the twin's DP-SGD run, scored
    from every step's noisy sum (0: no white-box rung). ``trials``: draws of each rung's
    ideal, whose median it reports (at m = 1,000 one draw's quartiles lie 15% either side
    of it)."""

    enabled: bool = False
    input_space_canaries: int = 8192
    gradient_canaries: int = 1_000_000
    twin_patients: int = 10
    trials: int = 15


@dataclass
class AuditConfig:
    """How a model's DP claim is audited.

    ``one_run`` (the default): the run's canaries, each in with probability 1/2, in the one
    trained model (Steinke et al. 2023, arXiv 2305.08846). ``multi_run``: besides, for each
    model of ``models`` (empty: every model of the run), ``num_runs`` models trained with one
    canary (``canary``, an id; None: the run's first) and ``num_runs`` without it, each with
    the model's own trainer, noise and steps on its own training rows; the ``attack`` score of
    the canary in each run gives Clopper-Pearson and GDP bounds (Jagielski et al. 2020, arXiv
    2006.07709; Nasr et al. 2023, arXiv 2302.07956). The runs go through the fleet
    (``fleet.executor``: local processes or a Ray cluster)."""

    mode: Literal["one_run", "multi_run"] = "one_run"
    num_runs: int = 16  # multi_run: K runs with the canary and K without, per audited model
    models: list[str] = field(default_factory=list)  # multi_run: the models audited; empty: all
    canary: str | None = None  # multi_run: the canary's id; None: the run's first canary
    attack: str = "loss"  # multi_run: an attack that needs only the model (loss, zlib, min_k, min_k_pp)
    # of every verdict, jointly (union bound over the attacks, tests and rungs that enter it)
    significance: float = 0.05
    ladder: LadderConfig = field(default_factory=LadderConfig)


@dataclass
class ExtractConfig:
    """The extract stage: sampled decoding from each secret canary's prefix (``samples`` at
    ``temperature``), and the k-extractable fraction (Carlini et al. 2023, arXiv 2202.07646)
    of at most ``max_records`` member and held-out records: a ``k``-token prefix, greedy
    decoding must emit the next ``suffix_length`` tokens."""

    samples: int = 16
    temperature: float = 1.0
    k: int = 32
    suffix_length: int = 16
    max_records: int = 200


@dataclass
class Config:
    """A whole run."""

    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    canaries: CanaryConfig = field(default_factory=CanaryConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    models: list[ModelEntry] = field(default_factory=lambda: [ModelEntry(name="target")])
    fleet: FleetConfig = field(default_factory=FleetConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)

    def model_names(self) -> list[str]:
        return [m.name for m in self.models]

    def for_model(self, name: str) -> Config:
        """The config one model trains with: ``train`` merged with the model's overrides."""
        for i, entry in enumerate(self.models):
            if entry.name == name:
                merged = _merge(dataclasses.asdict(self.train), entry.train)
                train = _build(TrainConfig, merged, f"models[{i}].train")
                return dataclasses.replace(self, train=train, models=[ModelEntry(name=name)])
        raise InputError(f"no model named {name!r} in this run (models: {', '.join(self.model_names())})")

    def trains_base(self) -> bool:
        """A base model is trained on the public data: ``pretrain.enabled`` and no
        ``model.base_model`` of the user's (which then is the base)."""
        return self.pretrain.enabled and not self.model.base_model

    def starts_from_base(self) -> bool:
        """Every model fine-tunes a base: one the run trains (:meth:`trains_base`) or the
        user's ``model.base_model``."""
        return self.trains_base() or self.model.base_model is not None

    def pretrain_train(self) -> TrainConfig:
        """The ``train`` section the base model trains with: ``pretrain``, non-private."""
        p = dataclasses.asdict(self.pretrain)
        p.pop("enabled")
        return dataclasses.replace(self.train, trainer="dpaudit.train:nonprivate", dp=DPConfig(), checkpoint_every=0, **p)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------- loading


def load_config(source: str | Path | Mapping[str, Any] | None = None, *,
                overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a preset name, a YAML file or a mapping (a config's ``to_dict()``), apply
    ``key.path=value`` overrides, validate."""
    raw = copy.deepcopy(dict(source)) if isinstance(source, Mapping) else _read_source(source or "demo")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set expects key=value, got {item!r}")
        _set_path(raw, key.strip().split("."), yaml.safe_load(value) if value.strip() else None)
    config = _build(Config, raw, "")
    validate(config)
    return config


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, section by section."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_source(source: str | Path) -> dict[str, Any]:
    path = Path(source)
    if str(source) in PRESETS:
        text = resources.files("dpaudit.presets").joinpath(f"{source}.yaml").read_text()
    elif path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise InputError(f"config file not found: {source}")
        text = path.read_text()
    else:
        raise InputError(f"unknown preset {str(source)!r}: expected one of {', '.join(PRESETS)} or a YAML file")
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise InputError(f"config {source} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise InputError(f"config {source} must be a mapping at the top level")
    return raw


def _set_path(raw: dict[str, Any], keys: list[str], value: Any) -> None:
    node = raw
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise InputError(f"config key {'.'.join(keys[: i + 1])} is not a section")
        node = child
    node[keys[-1]] = value


def _build(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise InputError(f"config key {path or '<root>'} must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            where = f"{path}.{key}" if path else str(key)
            raise InputError(f"unknown config key {where} (known here: {', '.join(sorted(names))})")
    values = {}
    for name, value in raw.items():
        values[name] = _coerce(hints[name], value, f"{path}.{name}" if path else name)
    return cls(**values)


def _coerce(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, path)
            except InputError as err:
                errors.append(err)
        raise errors[0]
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise InputError(f"config key {path} must be one of {', '.join(map(str, allowed))}, got {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise InputError(f"config key {path} must be a list, got {value!r}")
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        if not isinstance(value, dict):
            raise InputError(f"config key {path} must be a mapping, got {value!r}")
        return {_coerce(key_hint, k, path): _coerce(value_hint, v, f"{path}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise InputError(f"config key {path} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"config key {path} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"config key {path} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise InputError(f"config key {path} must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {hint!r} at {path}")  # a bug in this module


def validate(config: Config) -> None:
    """Range checks that types alone do not express, for the run and each of its models."""
    positive = _positive
    positive("seed", config.seed, allow_zero=True)
    positive("data.num_patients", config.data.num_patients)
    positive("data.max_length", config.data.max_length)
    positive("tokenizer.vocab_size", config.tokenizer.vocab_size)
    positive("canaries.num", config.canaries.num, allow_zero=True)
    positive("canaries.repetitions", config.canaries.repetitions)
    sec = config.canaries.secrets
    positive("canaries.secrets.num", sec.num, allow_zero=True)
    positive("canaries.secrets.enumerate_limit", sec.enumerate_limit, allow_zero=True)
    if sec.sample_size < 3:
        raise InputError(f"config key canaries.secrets.sample_size must be >= 3, got {sec.sample_size}")
    if sec.num and (not sec.repetitions or min(sec.repetitions) < 1 or len(set(sec.repetitions)) != len(sec.repetitions)):
        raise InputError(f"config key canaries.secrets.repetitions must be distinct integers >= 1, got {sec.repetitions}")
    ex = config.extract
    for key in ("samples", "k", "suffix_length"):
        positive(f"extract.{key}", getattr(ex, key))
    positive("extract.max_records", ex.max_records, allow_zero=True)
    positive("extract.temperature", ex.temperature)
    positive("fleet.num_models", config.fleet.num_models, allow_zero=True)
    positive("fleet.workers", config.fleet.workers)
    if not 0 < config.data.holdout_fraction < 1:
        raise InputError(f"config key data.holdout_fraction must be in (0, 1), got {config.data.holdout_fraction}")
    if not 0 < config.canaries.inclusion_prob < 1:
        raise InputError(f"config key canaries.inclusion_prob must be in (0, 1), got {config.canaries.inclusion_prob}")
    if not 0 <= config.data.public_fraction < 1:
        raise InputError(f"config key data.public_fraction must be in [0, 1), got {config.data.public_fraction}")
    if not 0 <= config.data.minority_fraction <= 1:
        raise InputError(f"config key data.minority_fraction must be in [0, 1], got {config.data.minority_fraction}")
    if config.data.public is not None:
        if config.data.public_fraction > 0:
            raise InputError("config keys data.public and data.public_fraction both choose the public data; set one")
        positive("data.public.num_patients", config.data.public.num_patients)
    if config.trains_base():
        if not config.data.has_public():
            raise InputError("config key pretrain.enabled needs public data: set data.public_fraction > 0 "
                             "or data.public")
        p = config.pretrain
        for key in ("lr", "epochs", "steps", "batch_size", "microbatch_size"):
            positive(f"pretrain.{key}", getattr(p, key))
    if config.model.architecture and config.model.base_model:
        raise InputError("config keys model.architecture and model.base_model both choose the model to train; "
                         "set one of them")
    if config.model.trainable != "all" and config.model.lora.enabled:
        raise InputError(f"config key model.trainable: {config.model.trainable} and model.lora.enabled both "
                         "choose the parameters that train; set one of them")
    names = config.model_names()
    if not names:
        raise InputError("config key models must list at least one model")
    for i, name in enumerate(names):
        if not _NAME_RE.match(name):
            raise InputError(f"config key models[{i}].name must be a plain name (letters, digits, '.', '_', '-'), "
                             f"got {name!r}")
    if len(set(names)) != len(names):
        raise InputError(f"config key models has duplicate names: {', '.join(sorted(n for n in set(names) if names.count(n) > 1))}")
    for name in names:
        try:
            _validate_train(config.for_model(name).train)
        except InputError as err:
            raise InputError(f"model {name}: {err}" if len(names) > 1 else str(err)) from None
    _validate_audit(config)


def _validate_audit(config: Config) -> None:
    """``audit.*``: K >= 1 runs per side, models of the run and (multi-run) a canary to insert.
    Its attack is checked against the attack registry by the stages
    (:func:`dpaudit.stages.check_config`)."""
    a = config.audit
    _positive("audit.num_runs", a.num_runs)
    unknown = sorted(set(a.models) - set(config.model_names()))
    if unknown:
        raise InputError(f"config key audit.models names model(s) not in the run: {', '.join(unknown)} "
                         f"(models: {', '.join(config.model_names())})")
    if a.mode == "multi_run" and config.canaries.num == 0:
        raise InputError("config key audit.mode multi_run needs a canary to insert: set canaries.num >= 1")
    if not 0 < a.significance < 1:
        raise InputError(f"config key audit.significance must be in (0, 1), got {a.significance}")
    lad = a.ladder
    _positive("audit.ladder.input_space_canaries", lad.input_space_canaries)
    _positive("audit.ladder.gradient_canaries", lad.gradient_canaries, allow_zero=True)
    _positive("audit.ladder.twin_patients", lad.twin_patients)
    _positive("audit.ladder.trials", lad.trials)


def _positive(path: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise InputError(f"config key {path} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _validate_train(t: TrainConfig) -> None:
    """Range checks of one model's ``train`` section."""
    d = t.dp
    positive = _positive
    positive("train.batch_size", t.batch_size)
    positive("train.microbatch_size", t.microbatch_size)
    positive("train.lr", t.lr)
    positive("train.epochs", t.epochs)
    positive("train.steps", t.steps)
    positive("train.eval_every", t.eval_every)
    positive("train.checkpoint_every", t.checkpoint_every, allow_zero=True)
    positive("train.warmup_steps", t.warmup_steps, allow_zero=True)
    positive("train.weight_decay", t.weight_decay, allow_zero=True)
    positive("train.dp.max_grad_norm", d.max_grad_norm)
    positive("train.dp.gradient_canaries", d.gradient_canaries, allow_zero=True)
    if ":" not in t.trainer:
        raise InputError(f"config key train.trainer must be MODULE:FUNCTION, got {t.trainer!r}")
    if d.noise_multiplier is not None and d.noise_multiplier <= 0:
        raise InputError(f"config key train.dp.noise_multiplier must be > 0, got {d.noise_multiplier}")
    if d.target_epsilon is not None and d.target_epsilon <= 0:
        raise InputError(f"config key train.dp.target_epsilon must be > 0, got {d.target_epsilon}")
    if d.delta is not None and not 0 < d.delta < 1:
        raise InputError(f"config key train.dp.delta must be in (0, 1), got {d.delta}")
