"""`dpaudit train --config tiny` end to end on the CPU."""

import json

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from dpaudit.cli import main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    assert main(["train", "--config", "tiny", "--out", str(out), "--set", "train.epochs=1"]) == 0
    return out


def test_run_directory_is_complete(tiny_run):
    for name in ("config.resolved.yaml", "manifest.json", "canaries.json", "data_split.json",
                 "train_log.jsonl", "candidates.jsonl", "model"):
        assert (tiny_run / name).exists(), name
    resolved = yaml.safe_load((tiny_run / "config.resolved.yaml").read_text())
    assert resolved["train"]["epochs"] == 1
    manifest = json.loads((tiny_run / "manifest.json").read_text())
    assert manifest["seeds"]["run"] == 0 and manifest["packages"]["torch"]
    canaries = json.loads((tiny_run / "canaries.json").read_text())["canaries"]
    assert len(canaries) == 16 and {c["included"] for c in canaries} == {True, False}
    log = [json.loads(line) for line in (tiny_run / "train_log.jsonl").read_text().splitlines()]
    assert any("heldout_perplexity" in row for row in log)


def test_saved_model_loads_with_plain_transformers_and_generates(tiny_run):
    model = AutoModelForCausalLM.from_pretrained(tiny_run / "model")
    tokenizer = AutoTokenizer.from_pretrained(tiny_run / "model")
    inputs = tokenizer("Patient presented with", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > inputs["input_ids"].shape[1]
    assert isinstance(tokenizer.decode(out[0]), str)


def test_existing_run_directory_is_refused(tiny_run, capsys):
    assert main(["train", "--config", "tiny", "--out", str(tiny_run)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_base_model_from_a_local_directory_with_lora(tmp_path):
    """A local causal LM (here a saved tiny GPT-2 with its tokenizer) is fine-tuned with LoRA;
    the merged result loads with plain transformers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from dpaudit.data.tokenizer import train_tokenizer

    base = tmp_path / "base"
    tokenizer = train_tokenizer([f"note {i}: patient seen, plan follow up in {i % 7} days" for i in range(300)],
                                vocab_size=300)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=64)
                    ).save_pretrained(base)
    tokenizer.save_pretrained(base)
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="new-token canaries"):
        code = main(["train", "--config", "tiny", "--out", str(out), "--set", f"model.base_model={base}",
                     "--set", "model.lora.enabled=true", "--set", "train.steps=3"])
    assert code == 0
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    tuned = AutoTokenizer.from_pretrained(out / "model")
    assert len(tuned) > len(tokenizer)  # new-token canaries were added ...
    assert model.get_input_embeddings().weight.shape[0] >= len(tuned)  # ... and the embedding grew
    checks = json.loads((out / "train_checks.json").read_text())
    assert checks["ok"]
