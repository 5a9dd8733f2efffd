"""Patient secrets, for corpora whose notes carry an MRN (the built-in clinical corpus,
where each patient's 2-5 notes share one MRN): for each candidate note, the mean per-token
log-probability of the MRN given the note's text up to it, and whether greedy decoding
from there reproduces it exactly; grouped by the patient's number of notes, member
patients beside held-out ones. Note-level DP-SGD protects one note, so a member patient
with ``k`` notes is a group of ``k`` protected units carrying the same secret;
patient-level DP protects them together. Held-out patients, whose MRN the model never
saw, are what a model that memorised nothing reaches.

A patient is the set of one role's candidate notes that carry one MRN (whatever
``data.unit_column`` is); held-out notes whose MRN also occurs in a member note are left
out (the model saw that MRN), as are notes whose MRN lies beyond the first
``data.max_length`` tokens (training truncated it away). At most
:data:`MAX_NOTES_PER_GROUP` notes per group and role are scored: a larger group is a
seeded sample of whole patients (seed :data:`SAMPLE_SEED`), which bounds the time on
corpora larger than the demo's (where no group reaches the cap).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from dpaudit.extraction.continuations import encode_continuations, score_continuations, trained_token_limit
from dpaudit.extraction.records import pii_notes

__all__ = ["MAX_NOTES_PER_GROUP", "PATIENT_FIELD", "SAMPLE_SEED", "mrn_notes", "patient_groups", "patient_secrets"]

#: Notes scored per (group, role) at most; beyond it a seeded sample of whole patients.
MAX_NOTES_PER_GROUP = 500
#: Seed of that sample (config-free, so that every model of a run scores the same notes).
SAMPLE_SEED = 20240611

PATIENT_FIELD = "mrn"

_PATIENT_METHOD = (
    "for each candidate note, the mean per-token log-probability (nats) of the patient's MRN given the "
    "note's text up to it, and whether greedy decoding from there reproduces it exactly; notes grouped "
    "by the patient's number of notes, member patients beside held-out patients (whose MRN the model "
    "never saw), log-probabilities averaged over each patient's notes, then over patients"
)


def mrn_notes(candidates: list[dict]) -> list[dict] | None:
    """:func:`pii_notes` of the MRN (``patient`` = the MRN)."""
    return pii_notes(candidates, "mrn")


def _cap(patients: list[tuple[str, list[int]]], limit: int, rng: np.random.Generator) -> list[tuple[str, list[int]]]:
    """Whole patients in a seeded random order while their notes fit in ``limit`` (all of
    them when they do)."""
    if sum(len(ix) for _, ix in patients) <= limit:
        return patients
    kept, used = [], 0
    for j in rng.permutation(len(patients)):
        if used + len(patients[j][1]) <= limit:
            kept.append(patients[j])
            used += len(patients[j][1])
    return sorted(kept)


def patient_groups(notes: list[dict], *, max_notes: int = MAX_NOTES_PER_GROUP,
                   seed: int = SAMPLE_SEED) -> dict[int, dict[str, list[tuple[str, list[int]]]]]:
    """``{k: {role: [(patient, [note indices])]}}``: the patients of each role with ``k``
    notes, capped at ``max_notes`` notes per group and role (a seeded sample of whole
    patients), patients in MRN order."""
    by: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, n in enumerate(notes):
        by[(n["role"], n["patient"])].append(i)
    groups: dict[int, dict[str, list]] = defaultdict(lambda: {"member": [], "heldout": []})
    for (role, patient), ix in sorted(by.items()):
        groups[len(ix)][role].append((patient, ix))
    rng = np.random.default_rng(seed)
    return {k: {role: _cap(groups[k][role], max_notes, rng) for role in ("member", "heldout")}
            for k in sorted(groups)}


def patient_secrets(model, tokenizer, notes: list[dict], *, max_length: int, batch_size: int = 16,
                    device="auto", max_notes: int = MAX_NOTES_PER_GROUP, seed: int = SAMPLE_SEED) -> dict:
    """``{"field", "method", "max_notes_per_group", "groups": [...]}`` of
    :data:`extraction.json <dpaudit.stages.extract>`: per number of notes ``k``, member
    and held-out patients, their mean per-token MRN log-probability (mean over each
    patient's notes, then over patients) and the fraction of their notes whose MRN greedy
    decoding reproduces. Notes whose prefix and MRN exceed ``max_length`` tokens (or the
    model's position table) are left out before grouping."""
    pre, tgt = encode_continuations(tokenizer, prefixes=[n["prefix"] for n in notes],
                                    targets=[n["target"] for n in notes], who="patient_secrets")
    limit = trained_token_limit(model, max_length)
    fits = [i for i in range(len(notes)) if len(pre[i]) + len(tgt[i]) <= limit]
    notes = [notes[i] for i in fits]
    pre, tgt = [pre[i] for i in fits], [tgt[i] for i in fits]
    groups = patient_groups(notes, max_notes=max_notes, seed=seed)
    wanted = sorted(i for g in groups.values() for pats in g.values() for _, ix in pats for i in ix)
    # ``batch_size`` is sized for texts of ``max_length`` tokens; these items are much
    # shorter (a note's header), so a batch holds as many tokens, in more rows: fewer,
    # larger matrix products (which matters most on a busy CPU), no more memory.
    longest = max((len(pre[i]) + len(tgt[i]) for i in wanted), default=1)
    rows = max(batch_size, batch_size * max_length // longest)
    scores = score_continuations(model, [pre[i] for i in wanted], [tgt[i] for i in wanted],
                                 batch_size=rows, device=device)
    mean_lp = dict(zip(wanted, scores.mean_logprob()))
    hit = dict(zip(wanted, scores.extracted))
    rows = []
    for k, g in groups.items():
        row: dict = {"notes": k}
        for role in ("member", "heldout"):
            row[f"{role}_patients"] = len(g[role])
        for role in ("member", "heldout"):  # each patient's notes averaged, then the patients
            per_patient = [np.mean([mean_lp[i] for i in ix]) for _, ix in g[role]]
            row[f"{role}_mean_logprob"] = float(np.mean(per_patient)) if per_patient else None
        for role in ("member", "heldout"):  # a fraction of notes
            flat = [hit[i] for _, ix in g[role] for i in ix]
            row[f"{role}_extracted"] = float(np.mean(flat)) if flat else None
        rows.append(row)
    out = {"field": PATIENT_FIELD, "method": _PATIENT_METHOD, "max_notes_per_group": max_notes, "groups": rows}
    if any("group" in notes[i] for i in wanted):
        out["by_group"] = _by_group(notes, wanted, hit, mean_lp)
    return out


def _by_group(notes: list[dict], wanted: list[int], hit: dict, mean_lp: dict) -> list[dict]:
    """Per group of people (the records' ``group``) and role, over the notes scored: patients,
    notes, notes whose MRN greedy decoding reproduces, and the mean per-token log-probability
    of the MRN (mean over each patient's notes, then over patients): the group's secrets
    (who pays for the privacy, Bagdasaryan et al. 2019, arXiv 1905.12101)."""
    by: dict[str, dict[str, dict[str, list[int]]]] = defaultdict(lambda: {"member": defaultdict(list),
                                                                          "heldout": defaultdict(list)})
    for i in wanted:
        n = notes[i]
        by[str(n.get("group"))][n["role"]][n["patient"]].append(i)
    rows = []
    for group in sorted(by):
        row: dict = {"group": group}
        for role in ("member", "heldout"):
            patients = by[group][role]
            flat = [i for ix in patients.values() for i in ix]
            row[f"{role}_patients"] = len(patients)
            row[f"{role}_notes"] = len(flat)
            row[f"{role}_extracted_notes"] = int(sum(bool(hit[i]) for i in flat))
            per_patient = [np.mean([mean_lp[i] for i in ix]) for ix in patients.values()]
            row[f"{role}_mean_logprob"] = float(np.mean(per_patient)) if per_patient else None
        rows.append(row)
    return rows

