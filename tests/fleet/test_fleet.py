"""Reference-model fleet: inclusion matrix, local pool, resume, refusal to mix, Ray."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the plug-in trainer's module; spawned workers inherit sys.path
    sys.path.insert(0, str(HERE))

import fleet_plugin  # noqa: E402

from dpaudit.config import load_config  # noqa: E402
from dpaudit.errors import InputError  # noqa: E402
from dpaudit.fleet import inclusion_matrix, model_seed  # noqa: E402
from dpaudit.stages.fleet import load_fleet, train_fleet  # noqa: E402


def plugin_config(**overrides):
    sets = ["train.trainer=fleet_plugin:train", *(f"{k}={v}" for k, v in overrides.items())]
    return load_config("tiny", overrides=sets)


@pytest.fixture(scope="module")
def inputs():
    tokenizer = fleet_plugin.make_tokenizer()
    return tokenizer, fleet_plugin.make_candidates(tokenizer)


@pytest.fixture(scope="module")
def pool_fleet(tmp_path_factory, inputs):
    tokenizer, candidates = inputs
    fleet_dir = tmp_path_factory.mktemp("pool") / "fleet"
    keep = train_fleet(
        fleet_dir=fleet_dir,
        candidates=candidates,
        tokenizer=tokenizer,
        config=plugin_config(),
        num_models=3,
        executor="local",
        workers=2,
        progress=False,
    )
    return fleet_dir, keep


def check_models(fleet_dir: Path, keep: np.ndarray, candidates, *, seed: int = 0) -> list[dict]:
    from transformers import AutoModelForCausalLM

    records = []
    for j in range(keep.shape[0]):
        model_dir = fleet_dir / f"model-{j:03d}"
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        assert model.config.n_layer == 1
        received = json.loads((model_dir / fleet_plugin.RECEIVED).read_text())
        expected = [candidates[int(i)]["unit_id"] for i in np.flatnonzero(keep[j])]
        assert received["unit_ids"] == expected  # exactly its rows, in order
        job = json.loads((model_dir / "fleet_job.json").read_text())
        assert job["index"] == j and job["num_rows"] == len(expected)
        assert job["seed"] == received["seed"] == model_seed(seed, j)
        records.append(received)
    return records


# --------------------------------------------------------------------------- inclusion matrix


def test_inclusion_matrix_is_balanced_by_unit_and_deterministic():
    rng = np.random.default_rng(1)
    units = [f"u{i}" for i in rng.integers(0, 25, size=120)]
    keep = inclusion_matrix(unit_ids=units, num_models=6, seed=3)
    assert keep.shape == (6, 120) and keep.dtype == bool
    assert (keep.sum(axis=0) == 3).all()  # every unit in exactly half of the models
    for u in set(units):
        cols = keep[:, [i for i, x in enumerate(units) if x == u]]
        assert (cols == cols[:, :1]).all()  # a unit's rows share one pattern
    assert np.array_equal(keep, inclusion_matrix(unit_ids=units, num_models=6, seed=3))
    assert not np.array_equal(keep, inclusion_matrix(unit_ids=units, num_models=6, seed=4))
    # the pattern belongs to the unit, not to the row position
    order = rng.permutation(len(units))
    shuffled = inclusion_matrix(unit_ids=[units[i] for i in order], num_models=6, seed=3)
    assert np.array_equal(shuffled, keep[:, order])
    # models are not all alike
    assert len({row.tobytes() for row in keep}) == 6


def test_inclusion_matrix_odd_and_invalid():
    units = [f"u{i}" for i in range(400)]
    keep = inclusion_matrix(unit_ids=units, num_models=3, seed=0)
    assert set(keep.sum(axis=0)) == {1, 2}
    assert abs(keep.mean() - 0.5) < 0.05
    assert inclusion_matrix(unit_ids=units, num_models=1, seed=0).mean() == pytest.approx(0.5, abs=0.08)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(InputError):
            inclusion_matrix(unit_ids=units, num_models=bad, seed=0)
    with pytest.raises(InputError):
        inclusion_matrix(unit_ids=[], num_models=2, seed=0)


def test_inclusion_matrix_follows_each_units_keep_fraction():
    records = [f"r{i}" for i in range(600)]
    canaries = [f"c{i}" for i in range(300)]
    units = records + canaries
    rates = [0.15] * len(records) + [0.5] * len(canaries)
    keep = inclusion_matrix(unit_ids=units, num_models=16, seed=0, keep_fraction=rates)
    per_unit = keep.sum(axis=0)
    assert set(per_unit[:600]) == {2, 3} and per_unit[:600].mean() == pytest.approx(0.15 * 16, abs=0.1)
    assert (per_unit[600:] == 8).all()
    # the models' training sets are alike in size: about the rate times the pool
    sizes = keep[:, :600].sum(axis=1)
    assert abs(sizes.mean() - 90) < 3 and sizes.max() - sizes.min() < 40
    single = inclusion_matrix(unit_ids=records, num_models=10, seed=1, keep_fraction=0.2)
    assert (single.sum(axis=0) == 2).all()
    # every unit keeps at least one "in" and one "out" model
    assert (inclusion_matrix(unit_ids=records, num_models=4, seed=0, keep_fraction=0.05).sum(axis=0) == 1).all()
    assert (inclusion_matrix(unit_ids=records, num_models=4, seed=0, keep_fraction=0.95).sum(axis=0) == 3).all()
    # one half is the balanced design
    assert np.array_equal(inclusion_matrix(unit_ids=units, num_models=6, seed=3, keep_fraction=0.5),
                          inclusion_matrix(unit_ids=units, num_models=6, seed=3))


@pytest.mark.parametrize("fraction", [0.0, 1.0, float("nan"), [0.5, 0.5], [0.2, 0.3, 0.3]])
def test_inclusion_matrix_refuses_bad_keep_fractions(fraction):
    with pytest.raises(InputError, match="keep_fraction"):
        inclusion_matrix(unit_ids=["a", "a", "b"], num_models=4, seed=0, keep_fraction=fraction)


def test_fleet_models_train_on_repeated_rows(inputs, tmp_path):
    tokenizer, candidates = inputs
    reps = [1 + (i % 3) for i in range(len(candidates))]
    repeated = candidates.add_column("repetitions", reps)
    keep = train_fleet(fleet_dir=tmp_path / "fleet", candidates=repeated, tokenizer=tokenizer, config=plugin_config(),
                       num_models=2, workers=1, progress=False)
    for j in range(2):
        received = json.loads((tmp_path / "fleet" / f"model-{j:03d}" / fleet_plugin.RECEIVED).read_text())
        expected = [candidates[int(i)]["unit_id"] for i in np.flatnonzero(keep[j]) for _ in range(reps[i])]
        assert received["unit_ids"] == expected
    with pytest.raises(InputError, match="repetitions"):
        train_fleet(fleet_dir=tmp_path / "f2", candidates=candidates.add_column("repetitions", [0] * len(candidates)),
                    tokenizer=tokenizer, config=plugin_config(), num_models=2, workers=1, progress=False)


def test_model_seeds_do_not_depend_on_fleet_size():
    seeds = [model_seed(7, j) for j in range(5)]
    assert len(set(seeds)) == 5 and seeds[0] == model_seed(7, 0)
    assert model_seed(8, 0) != seeds[0]


# --------------------------------------------------------------------------- local pool


@pytest.mark.slow
def test_local_pool_fleet(pool_fleet, inputs):
    fleet_dir, keep = pool_fleet
    _, candidates = inputs
    assert keep.shape == (3, len(candidates))
    with np.load(fleet_dir / "keep.npz", allow_pickle=False) as data:
        assert np.array_equal(data["keep"], keep)
        assert list(data["unit_ids"]) == candidates["unit_id"]
    assert (fleet_dir / "config.resolved.yaml").is_file()
    assert load_config(fleet_dir / "config.resolved.yaml").fleet.num_models == 3
    assert (fleet_dir / "tokenizer").is_dir() and (fleet_dir / "candidates").is_dir()
    records = check_models(fleet_dir, keep, candidates)
    assert all(r["pid"] != os.getpid() for r in records)  # trained in the pool's processes
    assert all(r["threads"] == max(1, os.cpu_count() // 2) for r in records)
    assert not list(fleet_dir.glob(".tmp-*"))
    loaded_keep, dirs = load_fleet(fleet_dir)
    assert np.array_equal(loaded_keep, keep) and [d.name for d in dirs] == ["model-000", "model-001", "model-002"]


def test_resume_retrains_only_missing_models(pool_fleet, inputs, tmp_path):
    tokenizer, candidates = inputs
    fleet_dir = tmp_path / "fleet"
    shutil.copytree(pool_fleet[0], fleet_dir)
    shutil.rmtree(fleet_dir / "model-001")
    leftover = fleet_dir / ".tmp-model-001-deadbeef"  # as an interrupted job leaves it
    leftover.mkdir()
    (leftover / "junk.bin").write_bytes(b"partial")

    keep, dirs = load_fleet(fleet_dir)  # only complete models, with their rows of keep
    assert [d.name for d in dirs] == ["model-000", "model-002"]
    assert np.array_equal(keep, pool_fleet[1][[0, 2]])

    def snapshot(name):
        d = fleet_dir / name
        return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()}

    before = {name: snapshot(name) for name in ("model-000", "model-002")}
    keep = train_fleet(
        fleet_dir=fleet_dir, candidates=candidates, tokenizer=tokenizer, config=plugin_config(),
        num_models=3, workers=2, progress=False,
    )
    assert {name: snapshot(name) for name in before} == before  # untouched
    assert not leftover.exists() and not list(fleet_dir.glob(".tmp-*"))
    records = check_models(fleet_dir, keep, candidates)
    assert records[1]["pid"] == os.getpid()  # one pending model runs in-process

    # a complete fleet: nothing to do
    train_fleet(fleet_dir=fleet_dir, candidates=candidates, tokenizer=tokenizer, config=plugin_config(),
                num_models=3, workers=2, progress=False)
    assert {name: snapshot(name) for name in before} == before


def test_refuses_to_mix_fleets(pool_fleet, inputs, tmp_path):
    tokenizer, candidates = inputs
    fleet_dir = tmp_path / "fleet"
    shutil.copytree(pool_fleet[0], fleet_dir)
    common = dict(fleet_dir=fleet_dir, tokenizer=tokenizer, progress=False)
    cases = [
        dict(candidates=candidates, config=plugin_config(seed=1), num_models=3),
        dict(candidates=candidates, config=plugin_config(), num_models=4),
        dict(candidates=candidates.select(range(len(candidates) - 2)), config=plugin_config(), num_models=3),
        dict(candidates=candidates.map(lambda r: {"text": r["text"] + " w1"}), config=plugin_config(), num_models=3),
        dict(candidates=candidates, config=plugin_config(**{"train.lr": 0.5}), num_models=3),
        dict(candidates=candidates, config=plugin_config(), num_models=3, workers=1,
             tokenizer=fleet_plugin.make_tokenizer(num_words=41)),
    ]
    for case in cases:
        with pytest.raises(InputError, match="new fleet directory"):
            train_fleet(**{**common, **case})
    # executor, workers and device are not part of a fleet's identity
    train_fleet(**common, candidates=candidates, num_models=3, workers=1,
                config=plugin_config(**{"train.device": "cpu", "fleet.executor": "local"}))


def test_bad_inputs(inputs, tmp_path):
    tokenizer, candidates = inputs
    base = dict(fleet_dir=tmp_path / "f", tokenizer=tokenizer, config=plugin_config(), progress=False)
    with pytest.raises(InputError, match="num_models"):
        train_fleet(**base, candidates=candidates)  # the tiny preset has fleet.num_models 0
    with pytest.raises(InputError, match="unit_id"):
        train_fleet(**base, candidates=candidates.remove_columns("unit_id"), num_models=2)
    with pytest.raises(InputError, match="no candidates"):
        train_fleet(**base, candidates=candidates.select([0, 1]), num_models=2)  # one unit, two models
    with pytest.raises(InputError, match="executor"):
        train_fleet(**base, candidates=candidates, num_models=2, executor="slurm")
    with pytest.raises(InputError, match="not a fleet"):
        load_fleet(tmp_path / "nothing")


def test_ray_missing_is_an_input_error(inputs, tmp_path, monkeypatch):
    tokenizer, candidates = inputs
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(InputError, match=r"pip install 'dpaudit\[ray\]'"):
        train_fleet(fleet_dir=tmp_path / "f", candidates=candidates, tokenizer=tokenizer, config=plugin_config(),
                    num_models=2, executor="ray", progress=False)


# --------------------------------------------------------------------------- Ray


@pytest.fixture
def ray_instance():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_ray_fleet(ray_instance, inputs, tmp_path):
    tokenizer, candidates = inputs
    fleet_dir = tmp_path / "fleet"
    keep = train_fleet(
        fleet_dir=fleet_dir, candidates=candidates, tokenizer=tokenizer, config=plugin_config(),
        num_models=2, executor="ray", address="auto", progress=False,
    )
    assert ray_instance.is_initialized()  # not ours to shut down
    records = check_models(fleet_dir, keep, candidates)
    assert all(r["pid"] != os.getpid() for r in records)
    assert len(load_fleet(fleet_dir)[1]) == 2


def test_failed_job_leaves_no_partial_model_and_resumes(inputs, tmp_path, monkeypatch):
    tokenizer, candidates = inputs
    fleet_dir = tmp_path / "fleet"
    args = dict(fleet_dir=fleet_dir, candidates=candidates, tokenizer=tokenizer, config=plugin_config(),
                num_models=2, workers=1, progress=False)
    monkeypatch.setenv(fleet_plugin.FAIL_ENV, str(model_seed(0, 1)))
    with pytest.raises(RuntimeError, match="asked to fail"):
        train_fleet(**args)
    assert not list(fleet_dir.glob(".tmp-*")) and not (fleet_dir / "model-001").exists()
    assert [d.name for d in load_fleet(fleet_dir)[1]] == ["model-000"]
    monkeypatch.delenv(fleet_plugin.FAIL_ENV)
    keep = train_fleet(**args)  # the trainer, fixed, finishes the fleet
    check_models(fleet_dir, keep, candidates)


def test_ray_workers_get_the_plugin_directory():
    from dpaudit.fleet import _trainer_import_roots

    assert _trainer_import_roots("fleet_plugin:train") == [str(HERE)]
    assert _trainer_import_roots("dpaudit.stages.fleet:run_job") == [str(Path(__file__).resolve().parents[2])]
    assert _trainer_import_roots("json:dumps") == []  # the standard library: workers have it


@pytest.mark.slow
def test_ray_fleet_on_an_instance_it_starts(inputs, tmp_path):
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    tokenizer, candidates = inputs
    keep = train_fleet(fleet_dir=tmp_path / "fleet", candidates=candidates, tokenizer=tokenizer,
                       config=plugin_config(), num_models=2, executor="ray", workers=2, progress=False)
    assert not ray.is_initialized()  # started here, shut down here
    check_models(tmp_path / "fleet", keep, candidates)


def tiny_preset_inputs(config):
    """Candidates and tokenizer as the tiny preset's run builds them (members and held-out)."""
    from dpaudit.data.corpus import load_corpus, tokenize_dataset
    from dpaudit.data.tokenizer import prepare_tokenizer, train_tokenizer

    corpus = load_corpus(source=config.data.source, num_patients=config.data.num_patients, seed=config.seed)
    tokenizer = prepare_tokenizer(train_tokenizer(corpus["text"], vocab_size=config.tokenizer.vocab_size))
    return tokenize_dataset(corpus, tokenizer, max_length=config.data.max_length), tokenizer


def test_tiny_preset_candidates_digest(tmp_path):
    from dpaudit.stages.fleet import _dataset_digest

    candidates, _ = tiny_preset_inputs(load_config("tiny"))
    assert len(candidates) > 40 and set(candidates.column_names) >= {"text", "input_ids", "attention_mask", "unit_id"}
    # unpadded (ragged) token lists hash, and a different row order is a different digest
    assert _dataset_digest(candidates) != _dataset_digest(candidates.select(range(len(candidates))[::-1]))
    assert _dataset_digest(candidates) == _dataset_digest(candidates.select(range(len(candidates))))


@pytest.mark.slow
def test_fleet_with_the_toolkits_nonprivate_trainer(tmp_path):
    import dpaudit.train

    if not callable(getattr(dpaudit.train, "nonprivate", None)):
        pytest.skip("dpaudit.train:nonprivate is not there yet")
    config = load_config("tiny")
    candidates, tokenizer = tiny_preset_inputs(config)
    keep = train_fleet(fleet_dir=tmp_path / "fleet", candidates=candidates, tokenizer=tokenizer, config=config,
                       num_models=2, workers=2, progress=False)
    keep2, dirs = load_fleet(tmp_path / "fleet")
    assert np.array_equal(keep, keep2) and len(dirs) == 2
    from transformers import AutoModelForCausalLM

    for j, d in enumerate(dirs):
        assert AutoModelForCausalLM.from_pretrained(d).config.vocab_size >= len(tokenizer)
        assert json.loads((d / "fleet_job.json").read_text())["num_rows"] == int(keep[j].sum())
