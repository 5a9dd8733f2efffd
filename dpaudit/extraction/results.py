"""Every extraction measure of one model, together: the content of ``extraction.json``
(:mod:`dpaudit.stages.extract` reads the inputs from the run directory and writes it)."""

from __future__ import annotations

from dpaudit.extraction.canaries import canary_extraction
from dpaudit.extraction.patients import mrn_notes, patient_secrets
from dpaudit.extraction.records import k_extractable_records, pii_extraction
from dpaudit.extraction.secrets import secret_canaries

__all__ = ["extraction_results"]


def extraction_results(model, tokenizer, *, canaries: list, secrets: list, secret_spec: dict | None,
                       candidates: list[dict], config) -> dict:
    """The secret canaries' exposure (:func:`secret_canaries`), the main canaries' greedy
    extraction (:func:`canary_extraction`), the PII fields (:func:`pii_extraction`),
    k-extractable records (:func:`k_extractable_records`) and, for notes that carry an MRN,
    the patient secrets (:func:`patient_secrets`; None otherwise) of ``model``. ``config``:
    the run's :class:`dpaudit.config.Config` (``attack.batch_size``, ``train.device``,
    ``data.max_length``, ``extract``, ``canaries.secrets`` and ``seed`` are read)."""
    notes = mrn_notes(candidates)
    kw = {"batch_size": config.attack.batch_size, "device": config.train.device}
    new_token = canary_extraction(model, tokenizer, canaries, **kw)
    return {
        **secret_canaries(model, tokenizer, secrets, secret_spec, config=config),
        **new_token,
        "pii": pii_extraction(model, tokenizer, candidates, max_length=config.data.max_length,
                              max_records=config.extract.max_records, seed=config.seed, **kw),
        "k_extractable": k_extractable_records(model, tokenizer, candidates, config=config),
        "patient_secrets": None if notes is None else patient_secrets(
            model, tokenizer, notes, max_length=config.data.max_length, **kw),
    }
