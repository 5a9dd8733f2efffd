"""Training with a record, written as the train stage writes it (for tests that read the files)."""

from __future__ import annotations


def train_recorded(trainer, run_dir, *args, **kwargs):
    """``trainer(*args, **kwargs)`` with a TrainingRecord, written into ``run_dir`` as the train
    stage writes it (train_log.jsonl, dp_event.json, train_checks.json, checkpoints/); returns
    the model."""
    from dpaudit.stages.artifacts import write_training
    from dpaudit.stages.train import save_checkpoint
    from dpaudit.train import TrainingRecord

    record = TrainingRecord(checkpoint=lambda step, model, tok: save_checkpoint(
        model, tok, run_dir / "checkpoints" / f"step-{step}"))
    model = trainer(*args, record=record, **kwargs)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_training(run_dir, record)
    return model
