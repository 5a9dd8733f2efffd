"""Extract stage: can the secrets be recovered from a model? ``models/NAME/extraction.json``.

Greedy decoding from each canary's prefix (k-extractability, Carlini et al. 2023, arXiv
2202.07646), reported for included and excluded canaries.
"""

from __future__ import annotations

import numpy as np

from dpaudit.rundir import ModelDir, RunDir


def extract_model(rundir: RunDir, config, md: ModelDir) -> dict:
    """Write and return the model's extraction results (skipped when already in place)."""
    done = md.read_extraction()
    if done is not None:
        return done
    from dpaudit.extraction import greedy_extracted
    from dpaudit.models import load_model

    canaries = rundir.read_canaries()
    extracted = np.zeros(len(canaries), dtype=bool)
    if canaries:
        extracted = greedy_extracted(load_model(md.weights), rundir.read_tokenizer(),
                                     prefixes=[c.prefix for c in canaries], targets=[c.secret for c in canaries],
                                     batch_size=config.attack.batch_size, device=config.train.device)
    included = np.array([c.included for c in canaries], dtype=bool)
    result = {
        "method": "greedy decoding from the canary prefix",
        "included_extracted": int(extracted[included].sum()),
        "included_total": int(included.sum()),
        "excluded_extracted": int(extracted[~included].sum()),
        "excluded_total": int((~included).sum()),
        "canaries": {c.id: {"extracted": bool(e)} for c, e in zip(canaries, extracted)},
    }
    md.write_extraction(result)
    return md.read_extraction()
