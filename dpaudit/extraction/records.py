"""What a model gives away of its training records (the candidate notes, each
``{"text", "unit_id", "role"}`` with role ``member`` or ``heldout``):

* PII fields (:data:`PII_FIELDS`: MRN, phone): from each member note's text up to the field,
  whether greedy decoding emits the field; the same from held-out notes, whose values the
  model never saw, is the baseline a model that memorized nothing reaches.

* k-extractable records (Carlini, Ippolito, Jagielski, Lee, Tramer, Zhang 2023, arXiv
  2202.07646): the fraction of member and held-out records whose first ``k`` tokens make
  greedy decoding emit the next ``suffix_length``.
"""

from __future__ import annotations

import re

import numpy as np

from dpaudit.extraction.continuations import encode_continuations, k_extractable, score_continuations

__all__ = ["PII_FIELDS", "k_extractable_records", "pii_extraction", "pii_notes"]

# "MRN 01234567" / "MRN: 01234567": the prefix ends at "MRN" or "MRN:", the target is the
# whitespace and the 8 digits (the space belongs to the target: a byte-level BPE joins it
# to the first digit).
_MRN = re.compile(r"\bMRN:?(\s+)(\d{8})(?!\d)")
# "(825) 559-0630" after whitespace, in whatever sentence the note puts it
_PHONE = re.compile(r"(\s+)(\(\d{3}\) \d{3}-\d{4})(?!\d)")
PII_FIELDS = {"mrn": _MRN, "phone": _PHONE}


def _sample(indices: list[int], limit: int, rng: np.random.Generator) -> list[int]:
    return indices if len(indices) <= limit else sorted(rng.choice(indices, size=limit, replace=False).tolist())


def pii_extraction(model, tokenizer, candidates: list[dict], *, max_length: int, max_records: int, seed: int,
                   batch_size: int = 16, device="auto") -> dict | None:
    """``{"members": {field: {"num", "extracted", "fraction"}}, "heldout": {...}}``: greedy
    decoding from each note's text up to a PII field (:data:`PII_FIELDS`) emits the field
    exactly; held-out notes whose value also occurs in a member note are left out, as are
    fields beyond ``max_length`` tokens; at most ``max_records`` notes per role and field (a
    seeded sample). None when no field occurs in both roles."""
    out: dict = {"members": {}, "heldout": {}, "method": "greedy decoding from the note's text up to the field"}
    rng = np.random.default_rng(seed)
    for field in PII_FIELDS:
        notes = pii_notes(candidates, field)
        if notes is None:
            continue
        pre, tgt = encode_continuations(tokenizer, prefixes=[n["prefix"] for n in notes],
                                        targets=[n["target"] for n in notes], who="pii")
        for role, key in (("member", "members"), ("heldout", "heldout")):
            ix = [i for i, n in enumerate(notes) if n["role"] == role and len(pre[i]) + len(tgt[i]) <= max_length]
            ix = _sample(ix, max_records, rng)
            hit = score_continuations(model, [pre[i] for i in ix], [tgt[i] for i in ix], batch_size=batch_size,
                                      device=device).extracted if ix else np.zeros(0, bool)
            out[key][field] = {"num": len(ix), "extracted": int(hit.sum()),
                               "fraction": float(hit.mean()) if ix else None}
    return out if out["members"] else None


def k_extractable_records(model, tokenizer, candidates: list[dict], *, config) -> dict:
    """``{"k", "suffix_length", "members": {"num", "extracted", "fraction"}, "heldout": ...}``
    (Carlini et al. 2023, arXiv 2202.07646) over at most ``extract.max_records`` records per
    role with at least ``k + suffix_length`` tokens within ``data.max_length`` (a seeded
    sample); ``num`` 0 when no record is long enough."""
    ex = config.extract
    out: dict = {"k": ex.k, "suffix_length": ex.suffix_length}
    need = ex.k + ex.suffix_length
    rng = np.random.default_rng(config.seed)
    for role, key in (("member", "members"), ("heldout", "heldout")):
        texts = [c["text"] for c in candidates if c["role"] == role]
        lengths = [len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
        ix = [i for i, n in enumerate(lengths) if n >= need] if need <= config.data.max_length else []
        ix = _sample(ix, ex.max_records, rng)
        hit = k_extractable(model, tokenizer, texts=[texts[i] for i in ix], k=ex.k, suffix_length=ex.suffix_length,
                            batch_size=config.attack.batch_size, device=config.train.device) if ix else np.zeros(0, bool)
        out[key] = {"num": len(ix), "extracted": int(hit.sum()), "fraction": float(hit.mean()) if ix else None}
    return out


def pii_notes(candidates: list[dict], field: str) -> list[dict] | None:
    """The candidate notes that carry a PII ``field`` (a key of :data:`PII_FIELDS`), each
    ``{"role", "patient", "prefix", "target"}`` (``patient`` = the field's value, ``target`` =
    the whitespace before it and the value; and the record's ``group`` when it has one), or None when members or held-out records carry
    none; held-out notes whose value also occurs in a member note are left out."""
    regex = PII_FIELDS[field]
    out = []
    for row in candidates:
        m = regex.search(row["text"])
        if m is not None and row["role"] in ("member", "heldout"):
            out.append({"role": row["role"], "patient": m.group(2),
                        "prefix": row["text"][: m.start(1)], "target": row["text"][m.start(1) : m.end(2)],
                        **({"group": row["group"]} if row.get("group") is not None else {})})
    members = {n["patient"] for n in out if n["role"] == "member"}
    out = [n for n in out if n["role"] == "member" or n["patient"] not in members]
    if not members or all(n["role"] == "member" for n in out):
        return None
    return out

