"""Extraction measures: can the secrets a model was trained on be recovered from it?

Each module does one job; they take a model, a tokenizer and plain objects and return
arrays or dicts (reading and writing the run directory is :mod:`dpaudit.stages.extract`'s):

* :mod:`~dpaudit.extraction.exposure_metric`: exposure ``log2 |R| - log2 rank`` of an inserted
  secret from log-likelihoods (Carlini et al. 2019, "The Secret Sharer", arXiv 1802.08232),
  by rank or by a skew-normal fit.
* :mod:`~dpaudit.extraction.continuations`: one teacher-forced pass over ``prefix + target``
  gives the target's per-token log-probabilities and whether greedy decoding from the prefix
  emits it; k-extractability (Carlini et al. 2023, "Quantifying Memorization Across Neural
  Language Models", arXiv 2202.07646).
* :mod:`~dpaudit.extraction.candidates`: the secret space ``R`` of a canary pattern, the
  log-probability of every candidate after a shared prefix (a prefix tree over a KV cache
  computed once), and the exact or estimated exposure they give.
* :mod:`~dpaudit.extraction.sampling`: continuations sampled from a prefix (the sampling
  attack of Carlini et al. 2021, arXiv 2012.07805).
* :mod:`~dpaudit.extraction.secrets`, :mod:`~dpaudit.extraction.canaries`,
  :mod:`~dpaudit.extraction.records`, :mod:`~dpaudit.extraction.patients`: the measures of
  one model over a run's secret canaries, its main canaries, PII fields and k-extractable
  records of its notes, and its patients' MRNs; :mod:`~dpaudit.extraction.results` puts
  them together as ``extraction.json`` holds them.
"""

from __future__ import annotations

from dpaudit.extraction.candidates import (
    SecretExposure,
    candidate_logprobs,
    enumerated_exposure,
    padded_tokens,
    sampled_exposure,
    secret_space,
)
from dpaudit.extraction.canaries import canary_extraction
from dpaudit.extraction.continuations import (
    ContinuationScores,
    continuation_scores,
    encode_continuations,
    greedy_extracted,
    k_extractable,
    score_continuations,
)
from dpaudit.extraction.exposure_metric import exposure
from dpaudit.extraction.patients import (
    MAX_NOTES_PER_GROUP,
    PATIENT_FIELD,
    SAMPLE_SEED,
    mrn_notes,
    patient_groups,
    patient_secrets,
)
from dpaudit.extraction.records import PII_FIELDS, k_extractable_records, pii_extraction, pii_notes
from dpaudit.extraction.results import extraction_results
from dpaudit.extraction.sampling import sample_continuations
from dpaudit.extraction.secrets import by_repetitions, secret_canaries

__all__ = [
    "MAX_NOTES_PER_GROUP",
    "PATIENT_FIELD",
    "PII_FIELDS",
    "SAMPLE_SEED",
    "ContinuationScores",
    "SecretExposure",
    "by_repetitions",
    "canary_extraction",
    "candidate_logprobs",
    "continuation_scores",
    "encode_continuations",
    "enumerated_exposure",
    "exposure",
    "extraction_results",
    "greedy_extracted",
    "k_extractable",
    "k_extractable_records",
    "mrn_notes",
    "padded_tokens",
    "patient_groups",
    "patient_secrets",
    "pii_extraction",
    "pii_notes",
    "sample_continuations",
    "sampled_exposure",
    "score_continuations",
    "secret_canaries",
    "secret_space",
]
