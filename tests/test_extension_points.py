"""Adding a member touches at most three files (DESIGN.md, section 3): one toy member of each
kind lives in this file alone and works through the toolkit's own machinery, nothing else
edited.

- an attack: ``@register`` on an :class:`~dpaudit.attacks.Attack` subclass;
- a bound: shown in tests/audit/test_audit_bound_contract.py
  (``test_a_bound_added_here_is_dispatched_and_meets_the_contract``), not repeated here;
- a stage: a function that reads a run directory through :mod:`dpaudit.rundir` and
  :mod:`dpaudit.stages.artifacts` and writes one artifact atomically;
- a report section: a :class:`~dpaudit.report.html.Section` with an inline template;
- a trainer: ``MODULE:FUNCTION`` (the toy trainer of tests/test_contracts.py).
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import numpy as np
import pytest
from test_contracts import NUM_UNITS, TOY_TRAINER, make_rows, make_tokenizer

from dpaudit.accounting import DpRecord
from dpaudit.attacks import Attack, available_attacks, get_attack, register, registry
from dpaudit.attacks.base import reference_logprobs, sequence_logprob
from dpaudit.config import load_config
from dpaudit.errors import InputError
from dpaudit.report.data import assemble
from dpaudit.report.html import SECTIONS, Section, render
from dpaudit.report.snapshot import ModelSnapshot, RunSnapshot
from dpaudit.rundir import SCHEMA_VERSION, RunDir, read_json, staged_directory, write_json_atomic
from dpaudit.stages import artifacts
from dpaudit.stages.attack import run_attacks
from dpaudit.stages.prepare import derive_seeds, prepare
from dpaudit.stages.report import read_snapshot
from dpaudit.stages.train import train_and_save

# --------------------------------------------------------------------------- an attack

TOY_ATTACK = "toy_reference_quantile"


def _attack_contract_suite():
    """tests/attacks/test_attack_contract.py, loaded as a module of its own: its checks are its
    test functions of ``name`` (and ``variant``)."""
    path = Path(__file__).parent / "attacks" / "test_attack_contract.py"
    spec = importlib.util.spec_from_file_location("attack_contract_suite", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_attack_added_here_meets_the_contract_and_is_run_by_the_stage():
    suite = _attack_contract_suite()
    before = available_attacks()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone when the block ends

        @register(TOY_ATTACK)
        class ToyReferenceQuantile(Attack):
            """The target's mean token log-probability minus a quantile of the references' that
            left the text out (the reference attack of Carlini et al. 2021, arXiv 2012.07805,
            with a quantile for the mean)."""

            requires = frozenset({"references"})

            def __init__(self, *, quantile: float = 0.5) -> None:
                self.quantile = quantile

            def validate_params(self) -> None:
                if not 0.0 <= self.quantile <= 1.0:
                    raise InputError(f"{TOY_ATTACK}: quantile must be in [0, 1], got {self.quantile!r}")

            def _score(self, inputs):
                refs = reference_logprobs(inputs.references)  # [m, n]
                if inputs.reference_keep is not None:
                    out = np.where(inputs.reference_keep, np.nan, refs)
                    refs = np.where(np.isnan(out).all(axis=0), refs, out)  # no model left it out: all
                return sequence_logprob(inputs.target, "target") - np.nanquantile(refs, self.quantile, axis=0)

        assert available_attacks() == sorted([*before, TOY_ATTACK])
        checks = [fn for name, fn in vars(suite).items()
                  if name.startswith("test_") and "name" in inspect.signature(fn).parameters]
        assert len(checks) >= 5
        for check in checks:
            params = set(inspect.signature(check).parameters)
            assert params <= {"name", "variant"}, (check.__name__, params)
            for variant in suite.VARIANTS if "variant" in params else [None]:
                check(**{"name": TOY_ATTACK, **({"variant": variant} if variant else {})})

        inputs, _ = suite.synthetic(0, 0.3)
        scores = run_attacks(inputs, names=[TOY_ATTACK], params={TOY_ATTACK: {"quantile": 0.25}})
        np.testing.assert_array_equal(scores[TOY_ATTACK], ToyReferenceQuantile(quantile=0.25).score(inputs))
        assert TOY_ATTACK in run_attacks(inputs, names=None)  # every runnable attack
        with pytest.raises(InputError, match="quantile"):
            run_attacks(inputs, names=[TOY_ATTACK], params={TOY_ATTACK: {"quantile": 2.0}})
    assert available_attacks() == before
    with pytest.raises(InputError, match="unknown attack"):
        get_attack(TOY_ATTACK)


# --------------------------------------------------------------------------- a stage

TOY_ARTIFACT = "toy.json"


def count_included_canaries(rundir: RunDir) -> bool:
    """A stage: ``RUN/toy.json``, how many of the run's canaries went into training. Returns
    False (and does nothing) when the artifact is in place already, as a resumed run needs."""
    path = rundir.root / TOY_ARTIFACT
    if path.is_file():
        return False
    canaries = artifacts.read_canaries(rundir)
    write_json_atomic(path, {"schema_version": SCHEMA_VERSION, "canaries": len(canaries),
                             "included": sum(c.included for c in canaries)})
    return True


def test_a_stage_added_here_reads_the_run_and_skips_when_done(tmp_path):
    config = load_config("tiny")
    rundir = RunDir(tmp_path / "run")
    prepare(rundir, config, derive_seeds(config.seed))
    assert rundir.data_complete()

    assert count_included_canaries(rundir) is True
    written = read_json(rundir.root / TOY_ARTIFACT)
    canaries = rundir.read_canary_file()["canaries"]  # the file as prepare wrote it
    assert written == {"schema_version": SCHEMA_VERSION, "canaries": config.canaries.num,
                       "included": sum(c["included"] for c in canaries)}
    assert 0 < written["included"] < written["canaries"]
    assert not list(rundir.root.glob(".*.tmp"))

    stamp = (rundir.root / TOY_ARTIFACT).stat().st_mtime_ns
    assert count_included_canaries(rundir) is False  # a rerun: in place, skipped
    assert (rundir.root / TOY_ARTIFACT).stat().st_mtime_ns == stamp


# --------------------------------------------------------------------------- a report section

TOY_TEMPLATE = ('<section id="toy"><h2>Toy</h2><ul>{% for name, privacy in c.rows %}'
                '<li class="toy">{{ name }}: {{ privacy }}</li>{% endfor %}</ul></section>')


def toy_section(report, images):
    return {"rows": [(m["name"], m["privacy"]) for m in report["models"]]} if report["models"] else None


def _one_model_report(name: str) -> dict:
    record = DpRecord.nonprivate(trainer=TOY_TRAINER, num_units=8, steps=2, expected_batch_size=4, sampler="shuffle")
    snapshot = RunSnapshot(name="toy-run", kind="run", names=(name,), models=(ModelSnapshot(name=name, record=record),))
    return assemble(snapshot).report


def test_a_report_section_added_here_is_rendered_escaped():
    report = _one_model_report("m<b>1")
    html = render(report, {}, sections=(*SECTIONS, Section("toy", toy_section, template=TOY_TEMPLATE)))
    assert '<li class="toy">m&lt;b&gt;1: non_private</li>' in html
    assert "m<b>1" not in html
    assert html.index('id="toy"') > html.index('id="appendix"')  # in order: after the last of SECTIONS
    assert 'id="toy"' not in render(report, {})  # the default sections are SECTIONS, unchanged


# --------------------------------------------------------------------------- a trainer


def test_a_trainer_named_by_module_function_reaches_the_report(tmp_path):
    config = load_config("tiny", overrides=[f"train.trainer={TOY_TRAINER}", "train.steps=3", "models=[{name: toy}]"])
    rundir = RunDir(tmp_path / "run")
    rundir.write_config(config)
    md = rundir.model("toy")
    tokenizer = make_tokenizer()
    with staged_directory(md.root) as stage:
        train_and_save(stage, dataset=make_rows(tokenizer), tokenizer=tokenizer, seed=0,
                       config=config.for_model("toy"), weights=stage / "model")

    assert md.is_trained() and md.dp_event_path.is_file()
    assert [row["step"] for row in md.read_train_log()] == [1, 2, 3]
    assert md.read_train_checks() is None  # the toy fills no checks: none written

    snapshot = read_snapshot(rundir)
    assert snapshot.names == ("toy",)
    record = snapshot.models[0].record
    assert record == DpRecord.nonprivate(trainer=TOY_TRAINER, num_units=NUM_UNITS, steps=3,
                                         expected_batch_size=config.train.batch_size, sampler="shuffle")
    assert record.epsilon() == float("inf") and snapshot.models[0].step_weights is None
    dp = assemble(snapshot).report["models"][0]
    assert dp["privacy"] == "non_private" and dp["dp"]["trainer"] == TOY_TRAINER
