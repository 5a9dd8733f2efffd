"""dpaudit.Audit: a user's own loop (Opacus make_private, a Hugging Face Trainer) audited as it
is; the documented examples (docs/examples/) run at tiny size; faults flagged; --json clean."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

pytest.importorskip("opacus")

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader

import dpaudit
from dpaudit.cli import main
from dpaudit.errors import InputError
from dpaudit.rundir import RunDir

pytestmark = pytest.mark.slow  # the long suite: python -m pytest -m slow (.ci/run runs it)

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
EPSILON, DELTA = 4.0, 1e-5


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _example(name: str, out: Path, monkeypatch) -> Path:
    monkeypatch.setenv("OUT", str(out))
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    return out


def _preregistered(monkeypatch, fraction=0.2):
    """The white-box rung's guess fraction fixed in advance instead of chosen by simulating the
    claim (a minute of PLD accounting on a CPU; tested with the ladder): still a choice that
    depends on no score, so the rung's bound stays sound."""
    import dpaudit.audit.ladder

    monkeypatch.setattr(dpaudit.audit.ladder, "choose_guess_fraction", lambda **kw: fraction)


def _json(capsys, argv) -> tuple[int, dict]:
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)  # exactly one JSON object: anything else fails to parse


def _model_report(report) -> dict:
    (model,) = report["models"]
    return model


# --------------------------------------------------------------------------- the ways in


@pytest.fixture(scope="module")
def opacus_run(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        yield _example("opacus_loop.py", tmp_path_factory.mktemp("opacus") / "run", mp)
    finally:
        mp.undo()


def test_opacus_make_private_loop_gets_a_verdict_through_audit(opacus_run, capsys, monkeypatch):
    """The documented Opacus loop, no plug-in: attack and report on its run directory give the
    verdict and the rungs; the correct loop is not violated, and its white-box rung ran."""
    checks = json.loads((opacus_run / "models/loop/train_checks.json").read_text())
    assert checks["ok"] and checks["sampler"] == "poisson" and checks["noise"]["consistent"]
    _preregistered(monkeypatch)
    code, attacked = _json(capsys, ["attack", str(opacus_run), "--attacks", "loss,reference", "--json"])
    assert code == 0 and "loop" in attacked["models"]
    code, report = _json(capsys, ["report", str(opacus_run), "--json"])
    model = _model_report(report)
    assert model["verdict"]["status"] in ("consistent", "inconclusive") and code in (0, 3), model["verdict"]
    rungs = {r["rung"]: r for r in model["rungs"]}
    assert rungs["input_space"]["refused"] and rungs["white_box"]["epsilon"] is not None
    assert rungs["white_box"]["epsilon"] < EPSILON
    assert (opacus_run / "report.html").is_file()


def test_hf_trainer_with_opacus_gets_a_verdict_through_the_callback(tmp_path, monkeypatch, capsys):
    run = _example("hf_trainer.py", tmp_path / "run", monkeypatch)
    record = json.loads((run / "models/loop/dp_event.json").read_text())
    checks = json.loads((run / "models/loop/train_checks.json").read_text())
    assert checks["ok"] and checks["steps"]["consistent"] and checks["noise"]["consistent"]
    assert record["steps"] == checks["batch_size"]["steps"] > 0 and record["target_epsilon"] == EPSILON
    # the rungs' verdict without the white-box simulation (it is the Opacus loop's test's)
    (run / "models/loop/gradient_canaries.npz").unlink()
    from dpaudit.stages import attack_run
    from dpaudit.stages.report import build_report

    attack_run(run, attacks=["loss"], extract=False)
    model = _model_report(build_report(run))
    assert model["verdict"]["status"] in ("consistent", "inconclusive"), model["verdict"]


# --------------------------------------------------------------------------- faults


def _tiny(num_patients=60, max_length=24):
    from transformers import GPT2Config, GPT2LMHeadModel

    from dpaudit.data.corpus import load_corpus
    from dpaudit.data.tokenizer import train_tokenizer

    notes = load_corpus(source="clinical", num_patients=num_patients, seed=0)["text"]
    tokenizer = train_tokenizer(notes, vocab_size=300)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_layer=1, n_embd=32, n_head=2, n_positions=64,
                                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
    rows = [tokenizer(t, truncation=True, max_length=max_length) for t in notes[: len(notes) // 2]]

    def collate(batch):
        batch = tokenizer.pad(batch, return_tensors="pt")
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
        return batch

    return model, tokenizer, rows, collate, notes[len(notes) // 2:][:20]


def _loop(out: Path, *, claim: dict, shuffle=False, noise_scale=1.0, epochs=2, batch_size=16, gradient_canaries=0,
          canaries=8, **tiny):
    """A user's Opacus loop (make_private), wrapped; returns the run directory."""
    from dpaudit import accounting

    model, tokenizer, rows, collate, heldout = _tiny(**tiny)
    loader = DataLoader(rows, batch_size=batch_size, collate_fn=collate, shuffle=shuffle, drop_last=shuffle)
    q, steps = batch_size / len(rows), epochs * (len(rows) // batch_size)
    sigma = accounting.noise_multiplier(target_epsilon=EPSILON, sample_rate=q, steps=steps, delta=DELTA)
    model, optimizer, loader = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), data_loader=loader,
        noise_multiplier=sigma * noise_scale, max_grad_norm=1.0, poisson_sampling=not shuffle)
    audit = dpaudit.Audit(claim=claim, out=out, tokenizer=tokenizer, heldout=heldout, canaries=canaries,
                          gradient_canaries=gradient_canaries)
    loader, optimizer = audit.wrap_loader(loader), audit.wrap_optimizer(optimizer)
    for _ in range(epochs):
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return audit.finish(model, tokenizer)


def _verdict(run: Path) -> dict:
    from dpaudit.stages import attack_run
    from dpaudit.stages.report import build_report

    attack_run(run, attacks=["loss"], extract=False)
    return _model_report(build_report(run))


def test_shuffled_loader_is_flagged(tmp_path):
    """Fixed-size shuffled batches accounted as Poisson: the variance test of Binomial(N, q) fails."""
    run = _loop(tmp_path / "run", claim=dict(epsilon=EPSILON, delta=DELTA), shuffle=True, epochs=8, batch_size=12,
                num_patients=90, max_length=16)
    checks = json.loads((run / "models/loop/train_checks.json").read_text())
    assert checks["batch_size"]["consistent"] is False and checks["ok"] is False
    assert checks["sampler"] != "poisson"
    model = _verdict(run)
    assert model["verdict"]["status"] == "violated" and "batch_size" in model["verdict"]["reason"]


def test_step_count_that_disagrees_with_the_claim_is_flagged(tmp_path):
    run = _loop(tmp_path / "run", claim=dict(epsilon=EPSILON, delta=DELTA, steps=50))
    checks = json.loads((run / "models/loop/train_checks.json").read_text())
    assert checks["batch_size"]["steps"] != 50
    model = _verdict(run)
    assert model["verdict"]["status"] == "violated" and "50 steps" in model["verdict"]["reason"]


def test_noise_scaled_down_is_violated_by_the_white_box_rung(tmp_path, monkeypatch):
    """Soundness's other side: a tenth of the noise, claimed as the full epsilon. The gradient
    canaries go through the optimizer's own add_noise, so the white-box rung's bound exceeds
    the claim (the correct loop's stays below it: the Opacus loop's test)."""
    run = _loop(tmp_path / "run", claim=dict(epsilon=EPSILON, delta=DELTA), noise_scale=0.1, gradient_canaries=2000)
    checks = json.loads((run / "models/loop/train_checks.json").read_text())
    assert checks["noise"]["enough"] is False  # the optimizer's noise multiplier says it too
    _preregistered(monkeypatch)
    model = _verdict(run)
    rungs = {r["rung"]: r for r in model["rungs"]}
    assert rungs["white_box"]["epsilon"] > EPSILON
    assert model["verdict"]["status"] == "violated"


def test_a_loop_without_noise_is_flagged(tmp_path):
    """A plain torch optimizer under a DP claim: no noise added, said by the noise check."""
    model, tokenizer, rows, collate, heldout = _tiny()
    audit = dpaudit.Audit(claim=dict(epsilon=EPSILON, delta=DELTA, sample_rate=0.25), out=tmp_path / "run",
                          tokenizer=tokenizer, heldout=heldout, canaries=8)
    loader = audit.wrap_loader(DataLoader(rows, batch_size=16, collate_fn=collate))
    optimizer = audit.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    run = audit.finish(model)
    checks = json.loads((run / "models/loop/train_checks.json").read_text())
    assert checks["noise"]["optimizer_noise_multiplier"] == 0 and not checks["noise"]["consistent"]
    assert not checks["ok"]
    verdict = _verdict(run)["verdict"]
    assert verdict["status"] == "violated" and "noise)" in verdict["reason"]


def test_a_plain_hf_trainer_is_tapped_and_flagged(tmp_path):
    """A Trainer's own loader (accelerate's DataLoaderShard) and AdamW, no DP: the callback taps
    both (every batch seen, one per step), and the noise check says no noise was added."""
    from transformers import Trainer, TrainingArguments

    model, tokenizer, rows, collate, heldout = _tiny()
    audit = dpaudit.Audit(claim=dict(epsilon=EPSILON, delta=DELTA), out=tmp_path / "run", tokenizer=tokenizer,
                          heldout=heldout, canaries=8)
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), num_train_epochs=1, per_device_train_batch_size=8,
                             report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=[dict(r) for r in rows], data_collator=collate,
            callbacks=[audit.callback()]).train()
    run = audit.finish(model)
    checks = json.loads((run / "models/loop/train_checks.json").read_text())
    assert checks["steps"]["loader_batches"] == checks["steps"]["optimizer_steps"] > 0
    assert checks["noise"]["optimizer_noise_multiplier"] == 0 and not checks["ok"]


def _seen(batches, canary_rows) -> tuple[int, set[tuple[int, ...]]]:
    """The canary rows in ``batches`` and their other rows (each row's tokens under its mask)."""
    canaries = {tuple(r.tolist()) for r in canary_rows}
    rows = [tuple(ids[mask.bool()].tolist()) for b in batches for ids, mask in zip(b["input_ids"], b["attention_mask"])]
    return sum(r in canaries for r in rows), {r for r in rows if r not in canaries}


def _counted_as_trained(audit, trained, steps):
    """The audit counts the batches trained on, their canary draws and rows, and no batch drawn after."""
    from dpaudit.audit.assess import accounting_mismatch

    obs = audit._observer
    record = obs.training_record()
    canaries, rows = _seen(trained, obs.canary_rows)
    assert audit.observed["batches"] == audit.observed["steps"] == steps == len(trained)
    assert record.checks["steps"]["consistent"] and record.dp.steps == record.checks["batch_size"]["steps"] == steps
    assert accounting_mismatch(record.dp, record.checks) is None
    assert obs.sizes == [int(b["input_ids"].shape[0]) for b in trained]
    assert record.checks["canary_rows"]["draws"] == canaries
    assert {tuple(r.tolist()) for r in obs.member_rows()} <= rows
    return record


def test_a_loop_stopped_mid_epoch_counts_the_batches_it_trained_on(tmp_path):
    """A loop that draws one batch more than it trains on (it breaks after T steps): the
    batch drawn after the last step is neither a step of the sampler nor a source of canary
    draws or members, and the correct loop is not ruled violated."""
    from dpaudit import accounting

    model, tokenizer, rows, collate, heldout = _tiny()
    q, steps = 16 / len(rows), 3
    sigma = accounting.noise_multiplier(target_epsilon=EPSILON, sample_rate=q, steps=steps, delta=DELTA)
    model, optimizer, loader = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(rows, batch_size=16, collate_fn=collate), noise_multiplier=sigma, max_grad_norm=1.0)
    audit = dpaudit.Audit(claim=dict(epsilon=EPSILON, delta=DELTA), out=tmp_path / "run", tokenizer=tokenizer,
                          heldout=heldout, canaries=8)
    loader, optimizer = audit.wrap_loader(loader), audit.wrap_optimizer(optimizer)
    trained = []
    for i, batch in enumerate(loader):
        if i >= steps:
            break
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        trained.append(batch)
    record = _counted_as_trained(audit, trained, steps)
    assert record.checks["ok"], record.checks


def test_a_trainer_stopped_by_max_steps_counts_the_batches_it_trained_on(tmp_path):
    """accelerate's DataLoaderShard collates one batch ahead of the one it yields: a Trainer
    stopped by max_steps mid-epoch has drawn one batch more than it trained on."""
    from transformers import Trainer, TrainingArguments

    model, tokenizer, rows, collate, heldout = _tiny()
    audit = dpaudit.Audit(claim=dict(epsilon=EPSILON, delta=DELTA), out=tmp_path / "run", tokenizer=tokenizer,
                          heldout=heldout, canaries=8)
    trained = []

    class Recording(Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            trained.append({k: v.detach().clone() for k, v in inputs.items()})
            return super().training_step(model, inputs, *args, **kwargs)

    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=3, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0)
    Recording(model=model, args=args, train_dataset=[dict(r) for r in rows], data_collator=collate,
              callbacks=[audit.callback()]).train()
    _counted_as_trained(audit, trained, 3)


def test_bad_input_is_one_clear_value_error(tmp_path):
    from transformers import PreTrainedTokenizerFast  # noqa: F401

    _, tokenizer, *_ = _tiny(num_patients=10)
    cases = [(dict(claim=dict(epsilon=4)), "delta"), (dict(claim=dict(epsilon=-1, delta=1e-5)), "epsilon"),
             (dict(claim=dict(epsilon=4, delta=1e-5, unit="user")), "unit"),
             (dict(claim=dict(epsilon=4, delta=1e-5), canary_set="new_token"), "new_token"),
             (dict(claim=dict(epsilon=4, delta=1e-5), canaries=0), "canaries")]
    for kwargs, needle in cases:
        with pytest.raises(ValueError, match=needle):
            dpaudit.Audit(out=tmp_path / "run", tokenizer=tokenizer, **kwargs)
    with pytest.raises(TypeError):
        dpaudit.Audit(dict(epsilon=4, delta=1e-5), tmp_path / "run")  # keyword-only
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(InputError, match="force=True"):
        dpaudit.Audit(claim=dict(epsilon=4, delta=1e-5), out=tmp_path / "full", tokenizer=tokenizer)
    audit = dpaudit.Audit(claim=dict(epsilon=4, delta=1e-5), out=tmp_path / "run", tokenizer=tokenizer)
    with pytest.raises(InputError, match="wrap_loader"):
        audit.finish(_tiny(num_patients=10)[0])


# --------------------------------------------------------------------------- --json


def test_json_stdout_holds_one_object_when_a_plugin_prints(tmp_path, monkeypatch, capsys):
    """The documented step plug-in (docs/examples/my_step.py), which prints."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    code = main(["validate", "--step", "my_step:step", "--noise-multiplier", "1.0", "--max-grad-norm", "1.0",
                 "--expected-batch-size", "4", "--repetitions", "8", "--out", str(tmp_path / "run"), "--json"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["verdict"] in ("consistent", "inconclusive") and code in (0, 3)
    assert "DP-SGD step" in captured.err and "DP-SGD step" not in captured.out
    assert RunDir(tmp_path / "run").root.is_dir()


def test_the_guide_shows_each_example_as_it_is_tested():
    guide = (EXAMPLES.parent / "your-training-loop.md").read_text()
    for name in ("my_step.py", "opacus_loop.py", "hf_trainer.py"):
        assert (EXAMPLES / name).read_text().strip() in guide, f"docs/your-training-loop.md lacks {name} as it is"
