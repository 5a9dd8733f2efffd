"""``dpaudit audit-model --train-references N``: reference models trained here, on random
halves of a population of texts disjoint from the audited ones.

LiRA (Carlini et al. 2022, arXiv 2112.03570) and RMIA (Zarifzadeh et al. 2024, arXiv
2312.03262) calibrate the target model's likelihood of a text by models trained like the
target on data of the same distribution, with and without that text. When the user has no
such models, :func:`plan_references` designs them and :func:`train_references` trains them:
``N`` models on the fleet (:func:`dpaudit.stages.fleet.train_fleet`: the local pool, or Ray
with ``fleet.executor: ray``), each through the one trainer call
(:func:`dpaudit.stages.train.train_and_save`) with the ``train`` section of
``--reference-config`` (default: the ``demo`` preset's), fine-tuning ``--reference-base``
when given, else from scratch in the audited model's architecture (its ``config.json``) with
its tokenizer.

Who trains on what (:func:`dpaudit.fleet.population_design`): every population unit is in a
random half of the models. The audited texts are never chosen by label:

* ``online`` (the default): the member and non-member texts are in a random half of the
  models too, members and non-members alike, as Carlini et al.'s online LiRA trains its
  shadow models on the candidates. Every audited text then has "in" and "out" models, so
  online LiRA fits both Gaussians and RMIA its online ``Pr(x)``; offline LiRA and the
  reference attack use each text's "out" half. Sound: the draw is independent of the
  labels, so for a model that memorized nothing the members' and non-members' scores are
  exchangeable and every attack stays at chance. The cost: each model trains on half of the
  audited texts besides its half of the population, and the reference models memorize
  member texts (``OUT/references/`` is as sensitive as the members file).
* ``offline``: no reference model sees an audited text; all ``N`` are "out" for every text
  (offline LiRA, offline RMIA, the reference attack). Its cost does not grow with the
  number of audited texts and the models can be reused for another audit of the same
  population; online LiRA cannot run.

Before training, the cost is estimated (from a probe of a few training steps, or from the
models already trained when an audit resumes) and printed on stderr with a smaller ``N``.
``OUT/references/`` is a fleet directory (see :mod:`dpaudit.stages.fleet`): an interrupted
audit resumes with the models in place, and the signals of the audited texts under each
model are cached in ``OUT/references/signals/``.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.config import Config, load_config
from dpaudit.errors import InputError
from dpaudit.fleet import ProbeTiming, cost_text, heldout_losses, population_design
from dpaudit.rundir import ModelDir
from dpaudit.stages.fleet import job_records, load_fleet, train_fleet

DEFAULT_CONFIG = "demo"
DESIGNS = ("online", "offline")
PROBE_STEPS = 4  # optimizer steps of the cost probe (the first and the last carry an evaluation)
# online LiRA wants at least two "in" and two "out" models per text (dpaudit.report.schema.MIN_ONLINE_MODELS)
FEWEST = {"online": 4, "offline": 1}


@dataclass(frozen=True)
class ReferencePlan:
    """Everything the reference models train on, checked, before anything is written.

    ``candidates`` (a ``datasets.Dataset``: ``text``, ``unit_id``, ``input_ids``,
    ``attention_mask``) holds the population, then (online) the audited texts, members first;
    ``keep[j]`` says which rows model ``j`` trains on."""

    design: str
    config: Config
    tokenizer: Any
    candidates: Any
    keep: np.ndarray
    num_population: int
    population_units: int
    num_targets: int
    start: dict[str, str | None]

    @property
    def num_models(self) -> int:
        return int(self.keep.shape[0])

    def target_keep(self) -> np.ndarray:
        """bool [N, members + non-members]: which reference models trained on each audited text."""
        if self.design == "offline":
            return np.zeros((self.num_models, self.num_targets), bool)
        return self.keep[:, self.num_population:]


def plan_references(*, model_dir: str | Path, num_models: int, population: Sequence[str],
                    population_units: Sequence[str] | None, population_path: str | Path,
                    targets: Sequence[tuple[str, Sequence[str]]], target_units: Sequence[str] | None,
                    base: str | Path | None = None, config: str | Path | None = None, design: str = "online",
                    max_length: int = 512, trust_remote_code: bool = False) -> ReferencePlan:
    """Check the inputs of ``N`` reference models and design them; write nothing.

    ``targets`` holds each audited file (members first) and its texts; ``target_units`` (one
    per audited text, in the same order) and ``population_units`` name the person of each
    text (None: every text its own unit). Raises :class:`InputError` for a population that
    overlaps an audited file, is too small for ``N`` halves, or holds a text the tokenizer
    cannot encode, and for a reference config, base or design that is no such thing."""
    import datasets

    from dpaudit.data.corpus import tokenize_dataset
    from dpaudit.data.tokenizer import load_tokenizer, unencodable
    from dpaudit.fleet import check_disjoint
    from dpaudit.models import check_tokenizer_fits, load_model_config

    if design not in DESIGNS:
        raise InputError(f"--reference-design must be one of {', '.join(DESIGNS)}, got {design!r}")
    check_disjoint(population, audited=targets, origin=str(population_path))
    target_texts = [t for _, texts in targets for t in texts]
    units = list(population_units) if population_units is not None else [str(i) for i in range(len(population))]
    tunits = list(target_units) if target_units is not None else [f"text-{i}" for i in range(len(target_texts))]
    cfg = _reference_config(config, model_dir=model_dir, base=base, num_models=num_models,
                            max_length=max_length, trust_remote_code=trust_remote_code)
    start = cfg.model.base_model or str(model_dir)
    limit = getattr(load_model_config(start, trust_remote_code=trust_remote_code), "max_position_embeddings", None)
    if isinstance(limit, int) and 2 <= limit < max_length:  # the references train on what the audit scores
        max_length = limit
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_length=limit))
    tokenizer = load_tokenizer(start, trust_remote_code=trust_remote_code)
    check_tokenizer_fits(start, tokenizer, trust_remote_code=trust_remote_code)
    keep = population_design(population_units=units, target_units=tunits if design == "online" else None,
                             num_models=num_models, seed=cfg.seed)

    online = design == "online"
    rows = {"text": list(population) + (target_texts if online else []),
            "unit_id": [f"population:{u}" for u in units] + ([f"target:{u}" for u in tunits] if online else [])}
    candidates = tokenize_dataset(datasets.Dataset.from_dict(rows), tokenizer, max_length=max_length)
    ids = list(candidates["input_ids"][: len(population)])
    ids += candidates["input_ids"][len(population):] if online else \
        tokenizer(target_texts, truncation=True, max_length=max_length)["input_ids"]
    bad = unencodable(ids, tokenizer=tokenizer)
    if bad:
        index, why = bad[0]
        where = [(str(population_path), len(population))] + [(name, len(texts)) for name, texts in targets]
        for name, size in where:
            if index < size:
                break
            index -= size
        raise InputError(f"the tokenizer of {start} cannot encode {len(bad)} text(s), the first text {index + 1} of "
                         f"{name}: {why}")
    return ReferencePlan(design=design, config=cfg, tokenizer=tokenizer, candidates=candidates,
                         keep=keep, num_population=len(population), population_units=len(set(units)),
                         num_targets=len(target_texts),
                         start={"base_model": cfg.model.base_model,
                                "architecture": cfg.model.architecture})


def _reference_config(source, *, model_dir, base, num_models: int, max_length: int, trust_remote_code: bool) -> Config:
    """The run config the references train with: ``source``'s (default :data:`DEFAULT_CONFIG`)
    ``seed``, ``train``, ``fleet`` and ``model`` sections, starting from ``base`` (or the
    config's ``model.base_model``), else from fresh weights in the audited model's
    architecture; sequences of ``max_length`` tokens, the length the audit scores."""
    raw = load_config(source or DEFAULT_CONFIG).to_dict()
    base = _absolute(base) if base is not None else raw["model"]["base_model"]
    raw["model"].update(base_model=base, architecture=None if base else _absolute(model_dir),
                        trust_remote_code=bool(trust_remote_code))
    raw["data"]["max_length"] = int(max_length)
    raw["pretrain"]["enabled"] = False
    raw["fleet"]["num_models"] = int(num_models) if isinstance(num_models, int) else 0
    raw["models"] = [{"name": "reference"}]
    raw.pop("audit", None)  # the run's audit of its own models: nothing of the references
    return load_config(raw)


def _absolute(path: str | Path) -> str:
    """A local model directory by its absolute path (the fleet's workers may run elsewhere); a hub name as it is."""
    return str(Path(path).resolve()) if Path(path).exists() else str(path)


@dataclass(frozen=True)
class CostEstimate:
    """What the reference models still to train will cost, before any is trained.

    ``seconds``: one estimate per model to train; ``text``: the line printed on stderr (with
    ``smaller``, a smaller ``N`` that would do, or None); ``fresh``: no model is trained yet,
    so a smaller ``N`` can still be chosen (a resumed fleet keeps its ``N``)."""

    seconds: tuple[float, ...]
    text: str
    smaller: int | None
    fresh: bool

    @property
    def total_s(self) -> float:
        return float(sum(self.seconds))


def estimate_references(plan: ReferencePlan, *, directory: Path) -> CostEstimate | None:
    """The cost of the reference models ``directory`` still lacks (None: all are trained):
    the mean wall time of those already trained, else a probe of :data:`PROBE_STEPS` training
    steps of the first one, run in a temporary directory outside ``directory`` and thrown away."""
    done = job_records(directory) if (directory / "keep.npz").is_file() else {}
    todo = [j for j in range(plan.num_models) if j not in done]
    if not todo:
        return None
    seconds = _estimate(plan, todo, done)
    fewest = FEWEST[plan.design]
    smaller = max(fewest, plan.num_models // 2) if plan.num_models > fewest and not done else None
    fleet = plan.config.fleet
    text = cost_text(seconds=seconds, workers=fleet.workers, executor=fleet.executor, smaller=smaller)
    if done:
        text += f" ({len(done)} of {plan.num_models} already trained in {directory})"
    elif smaller is not None:
        text += f": {_why_fewer(plan.design)}"
    return CostEstimate(seconds=tuple(seconds), text=text, smaller=smaller, fresh=not done)


def train_references(plan: ReferencePlan, *, directory: Path, progress: bool = True,
                     estimate: CostEstimate | None = None) -> dict[str, Any]:
    """Train the reference models ``directory`` still lacks (:func:`dpaudit.stages.fleet.train_fleet`,
    with the plan's ``keep``); return ``{"keep", "dirs", "jobs", "estimate_s"}`` of all ``N``."""
    train_fleet(fleet_dir=directory, candidates=plan.candidates, tokenizer=plan.tokenizer, config=plan.config,
                keep=plan.keep, progress=progress)
    keep, dirs = load_fleet(directory)
    if len(dirs) != plan.num_models:  # pragma: no cover - train_fleet trains every missing model or raises
        raise RuntimeError(f"{directory} holds {len(dirs)} of {plan.num_models} reference models")
    return {"keep": keep, "dirs": dirs, "jobs": job_records(directory),
            "estimate_s": None if estimate is None else round(estimate.total_s, 3)}


def _why_fewer(design: str) -> str:
    if design == "online":
        return "online LiRA needs 2 models with and 2 without each text, so 4 at least"
    return "offline LiRA and RMIA work with few reference models, Zarifzadeh et al. 2024"


def _units_of(plan: ReferencePlan, j: int) -> int:
    """The protected units model ``j`` trains on: rows, or persons under user-level DP."""
    rows = np.flatnonzero(plan.keep[j])
    if plan.config.train.dp.unit == "user" and plan.config.train.trainer != "dpaudit.train:nonprivate":
        return len(set(plan.candidates.select(rows)["unit_id"]))
    return len(rows)


def _estimate(plan: ReferencePlan, todo: list[int], done: dict[int, dict]) -> list[float]:
    """Seconds each model of ``todo`` will take: the mean of the models already trained, or a
    probe of :data:`PROBE_STEPS` steps of the first one's training."""
    from dpaudit.train.plan import num_steps

    if done:
        return [float(np.mean([r["wall_time_s"] for r in done.values()]))] * len(todo)
    timing = _probe(plan, todo[0])
    train = plan.config.train
    return [timing.model_seconds(steps=num_steps(train, _units_of(plan, j)), eval_every=train.eval_every) for j in todo]


def _probe(plan: ReferencePlan, index: int) -> ProbeTiming:
    from dpaudit.fleet import model_seed
    from dpaudit.progress import label
    from dpaudit.stages.train import train_and_save

    train = dataclasses.replace(plan.config.train, steps=PROBE_STEPS, checkpoint_every=0)
    config = dataclasses.replace(plan.config, train=train)
    tmp = Path(tempfile.mkdtemp(prefix="dpaudit-probe-"))  # nothing lands in the output before the user agrees
    try:
        start = time.perf_counter()
        with label("cost probe"):
            train_and_save(tmp, dataset=plan.candidates.select(np.flatnonzero(plan.keep[index])),
                           tokenizer=plan.tokenizer, seed=model_seed(plan.config.seed, index), config=config)
        wall = time.perf_counter() - start
        try:
            return ProbeTiming.from_log(ModelDir(tmp).read_train_log(), wall_s=wall)
        except ValueError:  # a plug-in trainer that logs no steps: the probe's wall time, spread over its steps
            return ProbeTiming(step_s=wall / PROBE_STEPS, eval_s=0.0, overhead_s=0.0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def reference_signals(dirs: Sequence[Path], texts: Sequence[str], *, directory: Path, batch_size: int,
                      max_length: int, device: str, progress: bool) -> list:
    """Signals of ``texts`` under each reference model (its own tokenizer), cached in
    ``directory/signals/reference-NNN.npz``."""
    from dpaudit.data.tokenizer import load_tokenizer
    from dpaudit.models import load_model
    from dpaudit.progress import label
    from dpaudit.stages.attack import model_id
    from dpaudit.stages.signal_cache import cached_signals

    out = []
    for j, d in enumerate(dirs):
        with label(f"reference-{j:03d}"):
            out.append(cached_signals(directory, f"reference-{j:03d}", load_model(d), load_tokenizer(d), texts,
                                      model_id=model_id(d), batch_size=batch_size, max_length=max_length,
                                      device=device, progress=progress))
    return out


def describe(plan: ReferencePlan, trained: dict[str, Any], *, target, references: Sequence, nonmembers: np.ndarray,
             population_path: str | Path) -> dict[str, Any]:
    """``audit_inputs.json["references"]``: how the reference models were trained, on what, and
    their held-out loss on the non-members (rows ``nonmembers`` of ``target`` and of each of
    ``references``, the signals of the audited texts) against the target's
    (:func:`dpaudit.fleet.heldout_losses`)."""
    train = plan.config.train
    keep = plan.target_keep()
    per_model, in_per_text = keep.sum(axis=1), keep.sum(axis=0)
    population_rows = plan.keep[:, : plan.num_population].sum(axis=1)
    jobs = [trained["jobs"][j] for j in sorted(trained["jobs"])]
    losses = heldout_losses(target=target.select(nonmembers), references=[r.select(nonmembers) for r in references],
                            keep=keep[:, nonmembers])
    return {
        "trained": plan.num_models,
        "design": plan.design,
        "directory": "references",
        "start": "fine-tuned" if plan.start["base_model"] else "from scratch",
        "base_model": plan.start["base_model"],
        "architecture": plan.start["architecture"],
        "trainer": train.trainer,
        "train": {k: getattr(train, k) for k in ("optimizer", "lr", "epochs", "steps", "batch_size", "schedule")},
        "seed": plan.config.seed,
        "max_length": plan.config.data.max_length,
        "population": {"path": str(population_path), "count": plan.num_population, "units": plan.population_units,
                       "per_reference": [int(population_rows.min()), int(population_rows.max())]},
        "audited_per_reference": [int(per_model.min()), int(per_model.max())],
        "in_per_text": [int(in_per_text.min()), int(in_per_text.max())],
        "steps": [_last_step(d) for d in trained["dirs"]],
        "heldout_loss": losses,
        "estimate_s": trained["estimate_s"],
        "cost_s": round(float(sum(r["wall_time_s"] for r in jobs)), 3),
    }


def _last_step(model_dir: Path) -> int | None:
    log = ModelDir(model_dir).read_train_log()
    return int(log[-1]["step"]) if log else None
