"""Per-token signals: log-probabilities of many texts under one or many causal LMs.

Every membership attack in :mod:`dpaudit.attacks` and the exposure measure in
:mod:`dpaudit.extraction` start from the same numbers: for each text and each position,
the log-probability the model gives to the *next* token (shifted labels), plus two
statistics of the model's whole next-token distribution that Min-K%++ (Zhang et al.
2025, "Min-K%++: Improved Baseline for Detecting Pre-Training Data from Large Language
Models") needs:

    mean_t = sum_z p(z) log p(z)              (minus the entropy)
    std_t  = sqrt(sum_z p(z) (log p(z) - mean_t)^2)

These are computed once, batched (:mod:`~dpaudit.signals.compute`, torch), and held in a
:class:`~dpaudit.signals.tokens.TokenSignals` (NumPy only, so that the attacks import without
torch); the attack stage caches them in the run directory as ``signals/<name>.npz``.

Tokenisation uses the tokenizer's own defaults (``add_special_tokens=True``): a tokenizer
that prepends a BOS token (Llama) lets the first real token be scored; one that does not
(GPT-2) scores tokens 2..T. Column ``t`` of every array is the prediction of token
``t + 1`` from tokens ``0..t``. A text of fewer than two tokens has no scored token (its
mask row is all False).
"""

from dpaudit.signals.tokens import FORMAT_VERSION, TokenSignals

__all__ = ["FORMAT_VERSION", "TokenSignals", "check_texts", "compute_signals", "compute_signals_many"]

_COMPUTE = ("check_texts", "compute_signals", "compute_signals_many")


def __getattr__(name: str):
    """The computing functions (:mod:`dpaudit.signals.compute`), imported on first use: they
    pull in torch, which the attacks do not need."""
    if name in _COMPUTE:
        from dpaudit.signals import compute

        return getattr(compute, name)
    raise AttributeError(f"module 'dpaudit.signals' has no attribute {name!r}")
