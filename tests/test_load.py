"""Load: `dpaudit audit-model` on 100,000 synthetic texts (generated here, not committed)
stays within a stated memory budget. The model's logits are reduced batch by batch to three
float32 numbers per token (the log-prob of the next token, the mean and the standard
deviation of log p for Min-K%++), so memory grows with the number of tokens, not with
tokens x vocabulary. Budget: 1.5 GiB peak resident memory for 100,000 texts of up to 40
tokens with the attacks that need only the target model."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.slow

NUM_TEXTS = 100_000
BUDGET_BYTES = 1.5 * 2**30
WORDS = ["patient", "admitted", "with", "fever", "cough", "chest", "pain", "asthma", "allergy", "amoxicillin",
         "follow", "up", "weeks", "blood", "pressure", "normal", "heart", "rate", "elevated", "discharged", "stable"]


def test_audit_model_on_100k_texts_stays_within_its_memory_budget(own_tmp):
    from transformers import GPT2Config, GPT2LMHeadModel

    from dpaudit.data.tokenizer import train_tokenizer

    rng = np.random.default_rng(0)

    def texts(n):
        return [" ".join(rng.choice(WORDS, size=rng.integers(4, 20))) for _ in range(n)]

    tokenizer = train_tokenizer(texts(2000), vocab_size=400)
    model = own_tmp / "model"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=len(tokenizer),
                               n_positions=64)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    for name in ("members", "nonmembers"):
        (own_tmp / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(NUM_TEXTS // 2)))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dpaudit", "audit-model", str(model),
                           "--members", str(own_tmp / "members.jsonl"), "--nonmembers", str(own_tmp / "nonmembers.jsonl"),
                           "--attacks", "loss,zlib,min_k,min_k_pp", "--batch-size", "128", "--max-length", "40",
                           "--out", str(own_tmp / "out"), "--json"], capture_output=True, text=True, timeout=3000, check=False)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kilobytes on Linux
    print(f"audit-model on {NUM_TEXTS} texts: {seconds:.0f} s, peak RSS {peak / 2**20:.0f} MiB")
    assert done.returncode in (0, 3), done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["models"][0]["attacks"]["loss"]["num_in"] == NUM_TEXTS // 2
    assert peak < BUDGET_BYTES, f"peak RSS {peak / 2**20:.0f} MiB over the budget of {BUDGET_BYTES / 2**20:.0f} MiB"
