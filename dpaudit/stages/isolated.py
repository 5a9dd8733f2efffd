"""The isolated audit design (``docs/ceilings.md``), shared by ``dpaudit validate`` and the
ladder's twin runs: canaries whose gradients lie on rows of their own, a linear optimizer,
and the full-batch size of a run."""

from __future__ import annotations

from pathlib import Path

from dpaudit.config import Config
from dpaudit.rundir import RunDir

# The audit design (``docs/ceilings.md``): isolated canaries (two new tokens each, no token in
# two canaries) and only the input embedding training, so that each canary's gradient lies
# mostly on rows of its own and the canaries do not drown each other.
ISOLATED_CANARIES, ISOLATED_TRAINABLE = "new_token_bare", "input_embeddings"
ISOLATED = (f"canaries.set={ISOLATED_CANARIES}", f"model.trainable={ISOLATED_TRAINABLE}")
# With a base model to calibrate by: plain SGD without momentum at a small learning rate, so
# that on a canary's rows the final model minus the base is the sum of the noisy clipped
# gradients, the linear statistic the DP-SGD family describes. AdamW's per-coordinate
# normalisation of the same sums cost a third of the bound. Without a base, each canary's rows
# start at a random point and only large updates stand out, so the preset's optimizer stays.
LINEAR_TRAIN = {"optimizer": "sgd", "momentum": 0.0, "lr": 0.01}
LINEAR = tuple(f"train.{k}={v}" for k, v in LINEAR_TRAIN.items())

def full_batch_size(config: Config) -> int:
    """The number of protected units a model of a run of ``config`` trains on (the members and
    the included canaries; patients at ``unit: user``): the expected batch size of q = 1. The
    data are prepared in a scratch directory (preparation is seeded, so the run's are the same)."""
    import tempfile

    from dpaudit.stages.prepare import derive_seeds, load_prepared, prepare
    from dpaudit.train.units import group_units

    with tempfile.TemporaryDirectory(prefix="dpaudit-count-") as scratch:
        rundir, seeds = RunDir(Path(scratch) / "run"), derive_seeds(config.seed)
        prepare(rundir, config, seeds)
        return len(group_units(load_prepared(rundir, config, seeds).train_set, config.train.dp.unit))
