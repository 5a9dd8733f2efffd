"""The built-in synthetic clinical-notes corpus: deterministic, varied, well formed."""

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from dpaudit.data.clinical import DIAGNOSES, generate_clinical_notes
from dpaudit.errors import InputError


@pytest.fixture(scope="module")
def notes():
    return generate_clinical_notes(num_patients=200, seed=7)


def _digest(ds) -> str:
    h = hashlib.sha256()
    for row in ds:
        h.update(repr(sorted(row.items())).encode())
    return h.hexdigest()


def test_columns_and_types(notes):
    assert notes.column_names == ["text", "unit_id", "note_id", "note_type"]
    for col in notes.column_names:
        assert notes.features[col].dtype == "string"
    assert set(notes["note_type"]) == {"discharge_summary", "progress_note"}
    assert len(set(notes["note_id"])) == len(notes)
    assert all(re.fullmatch(r"patient-\d{5}", u) for u in notes["unit_id"])


def test_same_seed_identical_different_seed_differs(notes):
    again = generate_clinical_notes(num_patients=200, seed=7)
    assert _digest(again) == _digest(notes)
    other = generate_clinical_notes(num_patients=200, seed=8)
    assert other["text"][:] != notes["text"][:]


def test_deterministic_across_processes(notes):
    code = (
        "import hashlib;from dpaudit.data.clinical import generate_clinical_notes as g;"
        "d=g(num_patients=200, seed=7);h=hashlib.sha256()\n"
        "for r in d: h.update(repr(sorted(r.items())).encode())\n"
        "print(h.hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.stdout.strip() == _digest(notes)


def test_prefix_stable(notes):
    small = generate_clinical_notes(num_patients=50, seed=7)
    assert small["text"][:] == notes["text"][: len(small)]


def test_notes_per_patient_range_and_shared_identity(notes):
    counts = Counter(notes["unit_id"])
    assert len(counts) == 200
    assert min(counts.values()) >= 2 and max(counts.values()) <= 5
    assert len(set(counts.values())) > 1
    by_patient = {}
    for row in notes:
        mrns = re.findall(r"\b\d{8}\b", row["text"])
        assert mrns, row["text"]
        by_patient.setdefault(row["unit_id"], set()).add(mrns[0])
    # every note of a patient carries the same MRN; MRNs differ between patients
    assert all(len(v) == 1 for v in by_patient.values())
    assert len({next(iter(v)) for v in by_patient.values()}) == 200
    fixed = generate_clinical_notes(num_patients=20, notes_per_patient=(3, 3), seed=1)
    assert set(Counter(fixed["unit_id"]).values()) == {3}


def test_pii_present_and_shared_name(notes):
    phone = re.compile(r"\(\d{3}\) \d{3}-\d{4}")
    texts = notes["text"][:]
    assert np.mean([bool(phone.search(t)) for t in texts]) > 0.4
    rows = [r for r in notes if r["unit_id"] == "patient-00003"]
    phones = {m for r in rows for m in phone.findall(r["text"])}
    assert len(phones) <= 1
    # the patient's surname appears in every one of their notes
    surnames = [set(re.findall(r"[A-Z][a-z]+", r["text"])) for r in rows]
    assert set.intersection(*surnames)


def test_length_and_variety(notes):
    words = np.array([len(t.split()) for t in notes["text"][:]])
    assert 60 <= np.median(words) <= 200
    assert np.mean((words >= 45) & (words <= 230)) > 0.95
    # not one template: many distinct opening lines and sentence skeletons
    first_lines = {re.sub(r"[\d/:-]+", "#", t.split("\n")[0].split(":")[0])[:25] for t in notes["text"][:]}
    assert len(first_lines) >= 8
    skeletons = Counter(re.sub(r"[A-Z][a-z]+|\d+", "X", t)[:60] for t in notes["text"][:])
    assert len(skeletons) > len(notes) * 0.3
    # many diagnoses represented
    named = sum(any(d.name in t for t in notes["text"][:]) for d in DIAGNOSES)
    assert named >= 25


def test_bad_input():
    with pytest.raises(InputError, match="num_patients"):
        generate_clinical_notes(num_patients=0, seed=0)
    with pytest.raises(InputError, match="notes_per_patient"):
        generate_clinical_notes(num_patients=3, notes_per_patient=(4, 2), seed=0)
    with pytest.raises(InputError, match="seed"):
        generate_clinical_notes(num_patients=3, seed=-1)
    with pytest.raises(TypeError):
        generate_clinical_notes(3, seed=0)  # keyword-only
