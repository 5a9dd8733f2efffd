"""`dpaudit train --config tiny` end to end on the CPU: data, base model, every model."""

import json
import logging
import re
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from dpaudit.canaries import canary_token_ids
from dpaudit.cli import main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    assert main(["train", "--config", "tiny", "--out", str(out), "--set", "train.epochs=1"]) == 0
    return out


MODELS = ("nonprivate", "dp-eps2", "dp-eps8")


def test_run_directory_is_complete(tiny_run):
    for name in ("config.resolved.yaml", "manifest.json", "run.log", "data/canaries.json", "data/split.json",
                 "data/candidates.jsonl", "data/public.jsonl", "data/tokenizer", "base/config.json"):
        assert (tiny_run / name).exists(), name
    resolved = yaml.safe_load((tiny_run / "config.resolved.yaml").read_text())
    assert resolved["train"]["epochs"] == 1
    manifest = json.loads((tiny_run / "manifest.json").read_text())
    assert manifest["seeds"]["run"] == 0 and manifest["packages"]["torch"]
    assert manifest["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    if Path("/proc/cpuinfo").exists():  # the CPU model too: results differ in their last bits between models
        cpu, info = manifest["hardware"]["cpu_model"], Path("/proc/cpuinfo").read_text()
        assert re.search(rf"^model\s*: {cpu['model']}$", info, re.M)
        assert re.search(rf"^model name\s*: {re.escape(cpu['model name'])}$", info, re.M)
    canaries = json.loads((tiny_run / "data" / "canaries.json").read_text())["canaries"]
    assert len(canaries) == 16 and {c["included"] for c in canaries} == {True, False}
    assert sorted(p.name for p in (tiny_run / "models").iterdir()) == sorted(MODELS)
    for name in MODELS:
        log = [json.loads(line) for line in (tiny_run / "models" / name / "train_log.jsonl").read_text().splitlines()]
        assert log[0]["step"] == 0 and any("heldout_perplexity" in row for row in log[1:])
        event = json.loads((tiny_run / "models" / name / "dp_event.json").read_text())
        assert (event["epsilon"] is None) == (name == "nonprivate")
    assert "dp-eps2 train: step" in (tiny_run / "run.log").read_text()  # progress reaches the log file


def test_public_data_is_disjoint_from_the_private_data(tiny_run):
    split = json.loads((tiny_run / "data" / "split.json").read_text())
    public = set(split["public_units"])
    assert public and not public & (set(split["member_units"]) | set(split["heldout_units"]))
    public_rows = [json.loads(x) for x in (tiny_run / "data" / "public.jsonl").read_text().splitlines()]
    assert {r["unit_id"] for r in public_rows} == public


def test_saved_model_loads_with_plain_transformers_and_generates(tiny_run):
    model = AutoModelForCausalLM.from_pretrained(tiny_run / "models" / "dp-eps2" / "model")
    tokenizer = AutoTokenizer.from_pretrained(tiny_run / "models" / "dp-eps2" / "model")
    inputs = tokenizer("Patient presented with", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > inputs["input_ids"].shape[1]
    assert isinstance(tokenizer.decode(out[0]), str)


def test_existing_run_directory_with_another_config_is_refused(tiny_run, capsys):
    assert main(["train", "--config", "tiny", "--out", str(tiny_run)]) == 2
    assert "another config" in capsys.readouterr().err


def local_base(tmp_path, *, tied: bool = True):
    """A saved tiny GPT-2 with its tokenizer (which lacks the new-token canaries), and that tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from dpaudit.data.tokenizer import train_tokenizer

    base = tmp_path / "base"
    tokenizer = train_tokenizer([f"note {i}: patient seen, plan follow up in {i % 7} days" for i in range(300)],
                                vocab_size=300)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=64,
                               tie_word_embeddings=tied)).save_pretrained(base)
    tokenizer.save_pretrained(base)
    return base, tokenizer


def test_base_model_from_a_local_directory_with_lora(tmp_path):
    """A local causal LM (here a saved tiny GPT-2 with its tokenizer) is fine-tuned with LoRA;
    the merged result loads with plain transformers."""
    from transformers import GPT2LMHeadModel

    base, tokenizer = local_base(tmp_path)
    out = tmp_path / "run"
    logging.captureWarnings(True)  # as main() does; done inside pytest.warns, it would replace its recorder
    with pytest.warns(UserWarning, match="new-token canaries"):
        code = main(["train", "--config", "tiny", "--out", str(out), "--set", f"model.base_model={base}",
                     "--set", "model.lora.enabled=true", "--set", "train.steps=3", "--set", "models=[{name: lora}]"])
    assert code == 0
    model = AutoModelForCausalLM.from_pretrained(out / "models" / "lora" / "model")
    tuned = AutoTokenizer.from_pretrained(out / "models" / "lora" / "model")
    assert len(tuned) > len(tokenizer)  # new-token canaries were added ...
    assert model.get_input_embeddings().weight.shape[0] >= len(tuned)  # ... and the embedding grew
    # once, in base/ (the user's model in place of the public pretraining), which every model
    # starts from and the reference attack calibrates by: the canaries' rows isolated, one value
    grown = AutoModelForCausalLM.from_pretrained(out / "base").get_input_embeddings().weight.detach()
    pool = torch.tensor(canary_token_ids(tuned, "new_token"))
    assert grown.shape[0] == len(tuned) and torch.allclose(grown[pool], grown[pool[0]].expand(len(pool), -1))
    assert torch.equal(grown[: len(tokenizer)], GPT2LMHeadModel.from_pretrained(base).get_input_embeddings().weight)
    checks = json.loads((out / "models" / "lora" / "train_checks.json").read_text())
    assert checks["ok"]


def test_the_bases_canary_rows_suit_what_the_fine_tune_trains(tiny_run, tmp_path):
    """Every parameter training (the preset): the new-token canaries' rows isolated, one value
    that takes the next-token mass after a canary's prefix. Only the input embedding
    (validate's design): as pretraining left them, each its own."""
    def rows(run):
        model = AutoModelForCausalLM.from_pretrained(run / "base")
        tokenizer = AutoTokenizer.from_pretrained(run / "base")
        canary = json.loads((run / "data" / "canaries.json").read_text())["canaries"][0]["text"]
        ids = torch.tensor([tokenizer(canary)["input_ids"]])
        pool = canary_token_ids(tokenizer, "new_token")
        at = int(torch.isin(ids[0], torch.tensor(pool)).nonzero()[0]) - 1  # the position predicting its first one
        with torch.no_grad():
            mass = float(model(ids).logits[0, at].softmax(-1)[pool].sum())
        weight = model.get_input_embeddings().weight.detach()
        return mass, bool(torch.equal(weight[pool], weight[pool[0]].expand(len(pool), -1)))

    mass, one_value = rows(tiny_run)
    assert one_value and mass > 0.99
    out = tmp_path / "inputs"
    assert main(["train", "--config", "tiny", "--out", str(out), "--set", "model.trainable=input_embeddings",
                 "--set", "models=[{name: v}]", "--set", "train.steps=1"]) == 0
    assert not rows(out)[1]
    # a user's base that lacks the canaries, on the input-embedding design: grown once into
    # base/ with the pool's rows one value that leaves the next-token mass after a canary's
    # prefix to the other tokens (a gradient that comes back through the hidden state). Untied:
    # in this untrained model a tied row that the prediction avoids also sets the hidden states
    # after the canary's new tokens, and they keep 0.93 of the mass (the stage warns)
    base, _ = local_base(tmp_path, tied=False)
    out = tmp_path / "user-inputs"
    assert main(["train", "--config", "tiny", "--out", str(out), "--set", f"model.base_model={base}",
                 "--set", "model.trainable=input_embeddings", "--set", "models=[{name: v}]",
                 "--set", "train.steps=1"]) == 0
    mass, one_value = rows(out)
    assert one_value and mass <= 0.01
