"""Audit a Hugging Face Trainer that trains with Opacus, through dpaudit.Audit's callback.

Run it, then ``dpaudit attack runs/hf-trainer`` and ``dpaudit report runs/hf-trainer``.
Tiny and offline, as opacus_loop.py. Set OUT to write elsewhere.
"""

import os
import tempfile

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import dpaudit
from dpaudit.data.corpus import load_corpus
from dpaudit.data.tokenizer import train_tokenizer

OUT = os.environ.get("OUT", "runs/hf-trainer")
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
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    return batch


# Opacus as its documentation shows: a Poisson-sampled DPDataLoader and a DPOptimizer
model, optimizer, loader = PrivacyEngine().make_private_with_epsilon(
    module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
    data_loader=DataLoader(rows, batch_size=16, collate_fn=collate), target_epsilon=EPSILON, target_delta=DELTA,
    epochs=EPOCHS, max_grad_norm=1.0, poisson_sampling=True)


class DPTrainer(Trainer):
    def get_train_dataloader(self):
        return loader  # the DPDataLoader, as make_private made it

    def training_step(self, *args, **kwargs):
        optimizer.zero_grad()  # Opacus's per-sample and summed gradients of the last step (the Trainer clears p.grad only)
        return super().training_step(*args, **kwargs)


# --- dpaudit: the claim, and where the run directory goes
audit = dpaudit.Audit(claim=dict(epsilon=EPSILON, delta=DELTA, unit="example"), out=OUT, tokenizer=tokenizer,
                      heldout=heldout_texts, canaries=32, force=True)

args = TrainingArguments(output_dir=tempfile.mkdtemp(), num_train_epochs=EPOCHS, lr_scheduler_type="constant",
                         save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                         logging_strategy="no", disable_tqdm=True)
trainer = DPTrainer(model=model, args=args, optimizers=(optimizer, None),
                    callbacks=[audit.callback()])  # --- dpaudit: taps the Trainer's loader and optimizer
trainer.train()

print("run directory:", audit.finish(model, tokenizer))  # --- dpaudit: writes the run
