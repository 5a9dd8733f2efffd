"""Training: one loop for non-private training and DP-SGD, plus the plug-in trainers.

Trainer plug-in contract: ``train(dataset, tokenizer, *, seed) -> PreTrainedModel``, where
``dataset`` is a ``datasets.Dataset`` with the columns ``text``, ``input_ids``,
``attention_mask`` and ``unit_id`` and the callable trains on exactly those rows.
``dpaudit train`` picks one with ``train.trainer: MODULE:FUNCTION``. Shipped:

- ``dpaudit.train:nonprivate``: ordinary training (epsilon = infinity);
- ``dpaudit.train:dpsgd``: DP-SGD, this package's own engine (:mod:`dpaudit.train.engine`);
- ``dpaudit.train.opacus:dpsgd``: the same loop with Opacus computing the private
  gradient (optional extra ``dpaudit[opacus]``; imported only when asked for);
- ``dpaudit.train.faulty:*``: deliberately broken DP-SGD variants for validation.

``dpaudit.train:dpsgd_step`` is one DP-SGD update as a step plug-in
(``step(model, batch, *, generator)``, :mod:`dpaudit.train.step`), the unit that
``dpaudit validate --step`` audits.

The toolkit's own trainers also accept the keyword-only ``config``, ``record`` (a
:class:`~dpaudit.train.record.TrainingRecord` they fill: log, DP record, checks) and
``eval_dataset``; see :mod:`dpaudit.train.loop`.
"""

from dpaudit.train.loop import dpsgd, nonprivate
from dpaudit.train.record import TrainingRecord
from dpaudit.train.step import dpsgd_step

__all__ = ["TrainingRecord", "dpsgd", "dpsgd_step", "nonprivate"]
