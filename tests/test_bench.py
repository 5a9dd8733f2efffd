"""``dpaudit bench``: the timed rows run, every --json key is there, a row that cannot be
measured is null with a reason."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import time

import pytest
import torch

from dpaudit import bench
from dpaudit.bench.timing import run_row
from dpaudit.cli import main
from dpaudit.progress import Progress


def test_engines_are_timed_side_by_side():
    factories, missing = bench.engine_factories(opacus=False)
    assert {"nonprivate", "dpsgd", "dpsgd_vmap"} <= set(factories)
    assert set(missing) == {"opacus", "opacus_ghost"}
    model = bench.build_model("tiny")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    units = bench.random_units(3, length=10)
    errors = {"dpsgd_vmap": "skipped"}
    calls = []

    def run(name):
        calls.append(name)
        return bench.time_steps(factories[name], model, units, batch=3, microbatch=2, device=torch.device("cpu"),
                                private=name != "nonprivate", steps=1)

    median = bench.interleaved(["nonprivate", "dpsgd", "dpsgd_vmap"], run, rounds=2,
                               bar=Progress(total=4, desc="test"), errors=errors)
    assert calls == ["nonprivate", "dpsgd", "nonprivate", "dpsgd"]  # interleaved, the failed one left out
    assert set(median) == {"nonprivate", "dpsgd"} and all(len(t) == 2 and min(t) > 0 for t in median.values())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # every engine starts from the same model


@pytest.mark.parametrize("name", ["nonprivate", "dpsgd", "opacus", "opacus_ghost"])
def test_every_engine_steps_in_bf16_autocast_on_cpu(name):
    """The GPU bench's path (bf16 autocast, ``--device cuda``) on CPU: every timed engine,
    Opacus' included, runs its forward pass in bf16, so no row compares precisions."""
    pytest.importorskip("opacus")
    factories, _ = bench.engine_factories()
    model = bench.build_model("tiny", tied=name != "opacus_ghost")
    seen = []
    model.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    times = bench.time_steps(factories[name], model, bench.random_units(3, length=10), batch=3, microbatch=2,
                             device=torch.device("cpu"), private=name != "nonprivate", steps=1,
                             autocast_dtype=torch.bfloat16)
    assert len(times) == 1 and times[0] > 0
    assert seen and set(seen) == {torch.bfloat16}


def test_a_failing_engine_is_a_reason_not_a_crash():
    errors = {}

    def run(name):
        if name == "broken":
            raise NotImplementedError("Parameter tying is not supported")
        return [1.0]

    median = bench.interleaved(["ok", "broken"], run, rounds=2, bar=Progress(total=4, desc="test"), errors=errors)
    assert median == {"ok": [1.0, 1.0]}
    assert errors == {"broken": "NotImplementedError: Parameter tying is not supported"}
    assert bench.paired_ratio(median, "broken", "ok") is None


def test_ratios_are_paired_by_round():
    """A slow spell of the machine in one round hits both sides of that round's ratio."""
    times = {"a": [1.1, 2.2, 1.1], "b": [1.0, 2.0, 1.0]}
    assert bench.paired_ratio(times, "a", "b") == pytest.approx(1.1)
    assert bench.medians(times) == {"a": 1.1, "b": 1.0}


def test_summary_names_every_row():
    result = {key: None for key in bench.KEYS}
    result.update(model="gpt2-tiny", batch_size=2, threads=1, device="cpu", precision="fp32", clock="process CPU time",
                  dp_step_over_nonprivate=1.1, reasons={"dp_step_over_opacus": "Opacus is not installed"},
                  details={"seconds_per_step": {"nonprivate": 0.1}, "nonprivate_over_opacus": 0.61})
    text = bench.summary(result)
    assert "floor of dp_step_over_opacus (the non-private step over Opacus' hooks): 0.610" in text
    assert any(line.split()[:2] == ["dp_step_over_nonprivate", "1.100"] for line in text.splitlines())
    assert "n/a (Opacus is not installed)" in text
    assert all(key in text for key in bench.KEYS if key.startswith(("dp_", "signals", "validate")))


def test_untied_twin_has_its_own_output_layer():
    tied, untied = bench.build_model("tiny"), bench.build_model("tiny", tied=False)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert torch.equal(untied.lm_head.weight, untied.transformer.wte.weight)
    x = torch.randint(1, bench.VOCAB, (2, 8))
    assert torch.equal(tied(x).logits, untied(x).logits)  # the same function, separate parameters


def test_a_budget_cuts_rounds_and_skips_later_rows():
    budget, result, reasons, errors = bench.Budget(0.05), {"steps": None, "later": None}, {}, {}

    def slow(name):
        time.sleep(0.03)
        return [1.0]

    def steps():
        result["steps"] = bench.interleaved(["a", "b"], slow, rounds=5, bar=Progress(total=10, desc="test"),
                                            errors=errors, budget=budget)

    run_row(steps, name="steps", keys=("steps",), result=result, reasons=reasons, budget=budget)
    assert result["steps"] == {"a": [1.0], "b": [1.0]}  # the first round spent the budget: no second
    run_row(lambda: pytest.fail("a row started after the budget"), name="later", keys=("later",), result=result,
            reasons=reasons, budget=budget)
    assert reasons == {"later": reasons["later"]} and reasons["later"].startswith("skipped: ")
    assert budget.record()["skipped"] == ["later"] and budget.record()["rounds_made"] == {"steps": 1}


def test_keep_going_makes_a_failing_row_a_reason():
    result, reasons = {"ok": 1.0, "broken": None}, {}
    run_row(lambda: 1 / 0, name="row", keys=("ok", "broken"), result=result, reasons=reasons, keep_going=True)
    assert reasons == {"broken": "ZeroDivisionError: division by zero"}  # the key it had measured keeps its value
    with pytest.raises(ZeroDivisionError):
        run_row(lambda: 1 / 0, name="row", keys=("broken",), result=result, reasons=reasons)


def test_gpu_suite_rehearses_on_cpu(tmp_path, monkeypatch, capsys):
    """``dpaudit bench --suite gpu`` at tiny size on the CPU (about 10 s): one JSON file with
    every key, each figure measured (positive and finite) or null with a reason."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    threads, out = torch.get_num_threads(), tmp_path / "gpu_check.json"
    try:
        assert main(["bench", "--suite", "gpu", "--size", "tiny", "--batch", "2", "--rounds", "1",
                     "--device", "cpu", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    assert set(bench.GPU_KEYS) <= set(result) and set(bench.KEYS) <= set(result["bench"])
    assert result["suite"] == "gpu" and result["model"] == "gpt2-tiny" and result["length"] == 128

    def measured(value, key, reasons):
        return value is None and key in reasons or math.isfinite(value) and value > 0

    for key in bench.gpu.MEASURED:
        assert measured(result[key], key, result["reasons"]), key
    for key in bench.KEYS[:7]:
        assert measured(result["bench"][key], key, result["bench"]["reasons"]), key
    # on a CPU every figure but the GPU's memory is measured; the share is the draw over the secure
    # DP step, which includes a draw, but both are timed: under load (two test processes on two
    # cores) the ratio of their medians read 1.04 once, where it reads about 0.3 alone
    assert [key for key in bench.gpu.MEASURED if result[key] is None] == ["nonprivate_peak_gpu_bytes",
                                                                          "dp_peak_gpu_bytes"]
    details = result["details"]
    assert result["secure_noise_share"] == details["secure_noise_s"] / details["seconds_per_step"]["dp"]
    assert details["secure_noise_path"] == {"path": "torch", "triton_error": None}  # Triton: CUDA only
    assert result["hardware"]["torch"] == torch.__version__ and result["hardware"]["date"]
    installed = importlib.util.find_spec("triton") is not None
    assert result["hardware"]["triton"] == (importlib.import_module("triton").__version__ if installed else None)
    assert result["budget"]["skipped"] == [] and result["wall_s"] < result["budget"]["seconds"]
    assert "secure noise share of a DP step" in capsys.readouterr().out


def test_validate_is_timed_against_train_of_the_same_run():
    from dpaudit.config import load_config
    from dpaudit.stages.validate import validate_config, validate_overrides

    import dataclasses

    sets = validate_overrides(trainer="dpaudit.train:nonprivate", config="tiny")
    validated = validate_config(trainer="dpaudit.train:nonprivate", canaries=None, config="tiny", overrides=[])
    # the same run up to the attacks, which validate chooses for the scoring alone
    assert load_config("tiny", overrides=sets) == dataclasses.replace(validated, attack=load_config("tiny").attack)


def test_bad_input_is_exit_2(capsys):
    assert main(["bench", "--size", "huge"]) == 2
    assert "--size must be one of" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_json_has_every_key(monkeypatch, capsys):
    monkeypatch.setattr(bench.workload, "LENGTH", 16)
    monkeypatch.setattr(bench.audit_cost, "validate_vs_training",
                        lambda rounds: (2.0, {"validate_s": 2.0, "train_s": 1.0, "training_loop_s": 0.5}))
    assert main(["bench", "--json", "--size", "tiny", "--batch", "2", "--rounds", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(bench.KEYS) <= set(result)
    for key in bench.KEYS[:7]:
        assert result[key] is None and key in result["reasons"] or result[key] > 0, key
    assert result["model"] == "gpt2-tiny" and result["batch_size"] == 2 and result["threads"] == 1
    floor = result["details"]["nonprivate_over_opacus"]
    assert floor is None if result["dp_step_over_opacus"] is None else floor > 0
    torch.set_num_threads(1)


def _profile_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_dp_step.py"
    spec = importlib.util.spec_from_file_location("profile_dp_step", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_dp_step_floor_records_and_times_the_per_example_work():
    """benchmarks/profile_dp_step.py --floor: it records the DP step's per-example products (one
    per use of a dense weight: 4 per block and the output layer) and noise, and times each
    design's work on them."""
    ms = _profile_script().floor(size="tiny", batch=2, rounds=1)
    model = bench.build_model("tiny")
    dense = [m.weight for m in model.modules() if type(m).__name__ == "Conv1D"] + [model.lm_head.weight]
    assert len(dense) == 2 * 4 + 1
    assert ms["per-example MB"] == pytest.approx(2 * sum(w.numel() for w in dense) * 4 / 1e6)
    assert all(ms[part] > 0 for part in ("non-private step", "DP step", "products", "weight gradients", "norms",
                                         "clipped sum", "Gram matrices", "noise"))
    designs = [ms[key] for key in ms if key.startswith("floor, ")]
    assert len(designs) == 4 and ms["floor"] == min(designs) <= ms["floor, materialized"]
    assert ms["floor, ghost norms"] == pytest.approx(1 + (ms["Gram matrices"] + ms["noise"]) / ms["non-private step"])


def test_dp_step_stages_time_every_stage_and_restore_the_engines():
    """benchmarks/profile_dp_step.py --stages: every stage timed, each nested one within the one
    that calls it, and the engines' methods as they were afterwards."""
    script = _profile_script()
    before = {(cls, method): vars(cls)[method] for cls, method in script.STAGES.values()}
    ms = script.stages(size="tiny", batch=2, rounds=1, steps=1)
    assert all(ms[stage] > 0 for stage in script.STAGES)
    assert ms["micro-batch"] >= ms["forward and backward"] + ms["per-example gradients and norms"]
    assert ms["per-example gradients and norms"] >= ms["per-example products"] + ms["LayerNorm closed form"]
    assert ms["dpsgd step"] >= ms["micro-batch"] + ms["noise"]
    assert ms["nonprivate step"] >= ms["non-private forward and backward"]
    assert ms["ratio"] == pytest.approx(ms["dpsgd step"] / ms["nonprivate step"])
    assert all(vars(cls)[method] is function for (cls, method), function in before.items())
