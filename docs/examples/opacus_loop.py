"""Audit a plain PyTorch loop over Opacus's make_private objects, with dpaudit.Audit.

Run it, then ``dpaudit attack runs/opacus-loop`` and ``dpaudit report runs/opacus-loop``.
Tiny and offline: a 2-layer GPT-2 built from a config, a tokenizer trained on the toolkit's
synthetic clinical notes. Set OUT to write elsewhere.
"""

import os

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

import dpaudit
from dpaudit.data.corpus import load_corpus
from dpaudit.data.tokenizer import train_tokenizer

OUT = os.environ.get("OUT", "runs/opacus-loop")
EPSILON, DELTA, EPOCHS = 4.0, 1e-5, 2

notes = load_corpus(source="clinical", num_patients=24, seed=0)["text"]
train_texts, heldout_texts = notes[: len(notes) // 2], notes[len(notes) // 2 :]
tokenizer = train_tokenizer(notes, vocab_size=300)
model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_layer=2, n_embd=64, n_head=2, n_positions=128,
                                   bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
rows = [tokenizer(t, truncation=True, max_length=64) for t in train_texts]


def collate(batch):
    batch = tokenizer.pad(batch, return_tensors="pt")
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    # GPT-2 broadcasts (1, L) position ids; Opacus's per-sample gradients need them per row
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    return batch


# --- dpaudit: the claim, and where the run directory goes
audit = dpaudit.Audit(claim=dict(epsilon=EPSILON, delta=DELTA, unit="example"), out=OUT, tokenizer=tokenizer,
                      heldout=heldout_texts, canaries=32, force=True)

loader = DataLoader(rows, batch_size=16, collate_fn=collate)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model, optimizer, loader = PrivacyEngine().make_private_with_epsilon(
    module=model, optimizer=optimizer, data_loader=loader, target_epsilon=EPSILON, target_delta=DELTA,
    epochs=EPOCHS, max_grad_norm=1.0, poisson_sampling=True)

loader = audit.wrap_loader(loader)           # --- dpaudit: input canaries in the batches
optimizer = audit.wrap_optimizer(optimizer)  # --- dpaudit: gradient canaries before the noise

model.train()
for epoch in range(EPOCHS):
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

print("run directory:", audit.finish(model, tokenizer))  # --- dpaudit: writes the run
