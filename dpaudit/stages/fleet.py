"""Fleet stage: the reference models every model of the run is attacked with.

They are trained like the run's own ``train`` section (fine-tuning the base model when
there is one), on random subsets drawn at the target's own rates: records at
``1 - data.holdout_fraction``, canaries at ``canaries.inclusion_prob`` and repeated as
often (Carlini et al. 2022 assume reference models trained like the target).
"""

from __future__ import annotations

import numpy as np

from dpaudit.config import Config
from dpaudit.rundir import RunDir
from dpaudit.stages.prepare import PreparedData
from dpaudit.stages.train import effective_config


def train_reference_fleet(rundir: RunDir, config: Config, data: PreparedData) -> tuple[np.ndarray, list] | None:
    """Train what the fleet still lacks; ``(keep [M, n], model dirs)``, or None without a fleet."""
    if config.fleet.num_models == 0:
        return None
    import datasets

    from dpaudit.data.corpus import tokenize_dataset
    from dpaudit.fleet import train_fleet

    candidates, canaries = data.candidates, data.canaries
    rows = {
        "text": [c["text"] for c in candidates] + [c.text for c in canaries],
        "unit_id": [c["unit_id"] for c in candidates] + [c.id for c in canaries],
        "repetitions": [1] * len(candidates) + [c.repetitions for c in canaries],
    }
    rates = [1.0 - config.data.holdout_fraction] * len(candidates) + [config.canaries.inclusion_prob] * len(canaries)
    dataset = tokenize_dataset(datasets.Dataset.from_dict(rows), data.tokenizer, max_length=config.data.max_length)
    train_fleet(fleet_dir=rundir.fleet_dir, candidates=dataset, tokenizer=data.tokenizer,
                config=effective_config(rundir, config, None), keep_fraction=rates)
    return rundir.read_fleet()
