"""Extract stage: can the secrets be recovered from a model? ``models/NAME/extraction.json``.

Each measure comes from batched passes of :mod:`dpaudit.extraction`:

* Secret canaries (``canaries.secrets``; Carlini et al. 2019, "The Secret Sharer", arXiv
  1802.08232): Secret Sharer canaries inserted 1, 2, 4, 8... times beside the new-token
  canaries, half of each group inserted and half kept out as controls. For each: its
  exposure ``log2 |R| - log2 rank`` (``canaries``, ``space_bits``), exact by ranking every
  candidate secret while ``|R| <= canaries.secrets.enumerate_limit``, else estimated by the
  skew-normal fit to ``canaries.secrets.sample_size`` sampled candidates; whether greedy
  decoding from its prefix emits the secret; and how many of ``extract.samples`` samples
  from the prefix do (``by_repetitions`` summarises them per repetition count, the controls
  as 0). Repeated canaries are groups of units at note level; they never enter an epsilon
  bound (the attack stage scores only the main canary set).

* New-token canaries: greedy decoding from each canary's prefix (k-extractability, Carlini
  et al. 2023, arXiv 2202.07646), reported for included and excluded canaries
  (``included_extracted``..., ``new_token_canaries``).

* PII (``pii``): from each member note's text up to a PII field (MRN, phone), whether greedy
  decoding emits the field; the same from held-out notes, whose values the model never saw,
  is the baseline a model that memorized nothing reaches.

* ``k_extractable`` (Carlini et al. 2023): the fraction of at most ``extract.max_records``
  member and held-out records whose first ``extract.k`` tokens make greedy decoding emit the
  next ``extract.suffix_length``.

* Patient secrets (``patient_secrets``), for corpora whose notes carry an MRN (the built-in
  clinical corpus, where each patient's 2-5 notes share one MRN): for each candidate note,
  the mean per-token log-probability of the MRN given the note's text up to it, and
  whether greedy decoding from there reproduces it exactly; grouped by the patient's
  number of notes, member patients beside held-out ones. Note-level DP-SGD protects one
  note, so a member patient with ``k`` notes is a group of ``k`` protected units carrying
  the same secret; patient-level DP protects them together. Held-out patients, whose MRN
  the model never saw, are what a model that memorised nothing reaches.

  A patient is the set of one role's candidate notes that carry one MRN (whatever
  ``data.unit_column`` is); held-out notes whose MRN also occurs in a member note are left
  out (the model saw that MRN), as are notes whose MRN lies beyond the first
  ``data.max_length`` tokens (training truncated it away). At most
  :data:`~dpaudit.extraction.MAX_NOTES_PER_GROUP` notes per group and role are scored: a
  larger group is a seeded sample of whole patients (seed
  :data:`~dpaudit.extraction.SAMPLE_SEED`), which bounds the time on corpora larger than
  the demo's (where no group reaches the cap).

The measures are :mod:`dpaudit.extraction`'s (:func:`dpaudit.extraction.extraction_results`);
this stage reads their inputs from the run directory and writes their result.
"""

from __future__ import annotations

from dpaudit.rundir import ModelDir, RunDir
from dpaudit.stages.artifacts import read_canaries, read_secrets, read_tokenizer

#: The keys of each model in ``dpaudit extract --json`` (the whole file is in extraction.json).
JSON_KEYS = ("space_bits", "secret_set", "exposure_method", "canaries", "by_repetitions", "secrets_left_out", "pii",
             "k_extractable", "included_extracted", "included_total", "excluded_extracted", "excluded_total")


def extract_model(rundir: RunDir, config, md: ModelDir, *, force: bool = False, tokenizer=None) -> dict:
    """Write and return the model's extraction results (skipped when already in place);
    ``tokenizer``: the run's, when the caller has it loaded already."""
    done = None if force else md.read_extraction()
    if done is not None and "k_extractable" in done:  # an older file lacks the later measures
        return done
    from dpaudit.extraction import extraction_results
    from dpaudit.models import load_model

    canaries = read_canaries(rundir)
    secrets, secret_spec = read_secrets(rundir)
    candidates = rundir.read_candidates()
    model, tokenizer = load_model(md.weights), tokenizer or read_tokenizer(rundir)
    md.write_extraction(extraction_results(model, tokenizer, canaries=canaries, secrets=secrets,
                                           secret_spec=secret_spec, candidates=candidates, config=config))
    return md.read_extraction()


def extract_run(rundir: RunDir | str, *, force: bool = False) -> dict[str, dict]:
    """The extract stage for every trained model of a run directory (``dpaudit extract``):
    ``{model: extraction.json}``; ``force`` recomputes results already in place."""
    from dpaudit.progress import label

    rundir = RunDir(rundir) if not isinstance(rundir, RunDir) else rundir
    rundir.check()
    config = rundir.read_config()
    out = {}
    for name in config.model_names():
        md = rundir.model(name)
        if not md.is_trained():
            continue
        with label(name):
            out[name] = extract_model(rundir, config, md, force=force)
    return out
