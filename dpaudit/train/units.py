"""A training set as the loop sees it: token sequences and the rows of each protected unit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpaudit.errors import InputError


@dataclass
class TrainingData:
    """Token sequences (padding stripped) and the rows of each protected unit."""

    sequences: list[torch.Tensor]
    units: list[list[int]]
    unit: str  # "example" | "user"
    # the ``unit_id`` of each unit's first row (None: the data set has no unit_id column)
    unit_ids: list[str] | None = None

    @property
    def num_units(self) -> int:
        return len(self.units)


def prepare_sequences(dataset, *, max_length: int, pad_id: int, what: str = "dataset") -> list[torch.Tensor]:
    """1-D token tensors from ``input_ids`` (and ``attention_mask`` when present: tokens
    whose mask is 0 are padding and dropped), truncated to ``max_length``. An empty row
    becomes one padding token, which predicts nothing (zero loss, zero gradient)."""
    columns = set(dataset.column_names)
    if "input_ids" not in columns:
        raise InputError(f"the {what} has no input_ids column (columns: {', '.join(sorted(columns))})")
    plain = dataset.with_format(None)  # python lists whatever format the caller set
    ids_column = plain["input_ids"][:]
    masks = plain["attention_mask"][:] if "attention_mask" in columns else [None] * len(ids_column)
    sequences = []
    for ids, mask in zip(ids_column, masks):
        if mask is not None:
            ids = [t for t, m in zip(ids, mask) if m]
        ids = list(ids)[:max_length] or [pad_id]
        sequences.append(torch.tensor(ids, dtype=torch.long))
    return sequences


def group_units(dataset, unit: str) -> list[list[int]]:
    """Rows of each protected unit, in order of first appearance: one row per unit for
    ``"example"``, all rows sharing a ``unit_id`` for ``"user"``."""
    if unit == "example":
        return [[i] for i in range(len(dataset))]
    if unit != "user":
        raise InputError(f"train.dp.unit must be example or user, got {unit!r}")
    if "unit_id" not in dataset.column_names:
        raise InputError("train.dp.unit is user but the dataset has no unit_id column")
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(dataset.with_format(None)["unit_id"][:]):
        if uid is None:
            raise InputError(f"row {row} has no unit_id (train.dp.unit is user)")
        groups.setdefault(uid, []).append(row)
    return list(groups.values())


def load_data(dataset, *, unit: str, max_length: int, pad_id: int) -> TrainingData:
    if len(dataset) == 0:
        raise InputError("the training dataset is empty")
    sequences = prepare_sequences(dataset, max_length=max_length, pad_id=pad_id)
    units = group_units(dataset, unit)
    ids = None
    if "unit_id" in dataset.column_names:
        column = dataset.with_format(None)["unit_id"][:]
        ids = [str(column[rows[0]]) for rows in units]
    return TrainingData(sequences=sequences, units=units, unit=unit, unit_ids=ids)
