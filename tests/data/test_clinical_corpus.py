"""The built-in synthetic clinical-notes corpus: deterministic, varied, well formed."""

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter
from importlib import resources

import numpy as np
import pytest

from dpaudit.data import clinical
from dpaudit.data.clinical import (
    COMORBIDITIES,
    DIAGNOSES,
    ClinicalVocabularyError,
    Diagnosis,
    generate_clinical_notes,
    load_vocabulary,
)
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
    assert notes.column_names == ["text", "unit_id", "note_id", "note_type", "hospital", "group"]
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


# --------------------------------------------------------------------------------------
# The vocabulary lives in dpaudit/data/clinical_vocab/*.yaml
# --------------------------------------------------------------------------------------

# sha256 (as _digest) of generate_clinical_notes(num_patients=20, seed=0). It changes when
# the vocabulary files or the generator change; update it only for an intended change of
# the corpus (the corpus seeds the runs, so earlier results would no longer reproduce).
# Changed on purpose for issue 29: the columns hospital and group, and the rare-condition
# minority (its patients only; every other note is unchanged).
PINNED_20_SEED0 = "f5e30dc13f189713dd9fed5910f650a345c3057506faf38422cb3ecba92d6879"


def test_a_labelled_minority_with_its_own_vocabulary(notes):
    """About 5% of the patients have a rare condition (group "rare"), with drugs and labs no
    common patient's notes have; every other patient is, note for note, the patient of a
    corpus without a minority (issue 29)."""
    groups = dict(zip(notes["unit_id"], notes["group"]))
    rare = {u for u, g in groups.items() if g == "rare"}
    assert set(groups.values()) == {"common", "rare"}
    assert 0.02 <= len(rare) / len(groups) <= 0.09
    vocab = clinical._vocab()
    rare_names = {d.name for d in vocab.rare_diagnoses}
    named = {u for u, t in zip(notes["unit_id"], notes["text"]) if any(n in t for n in rare_names)}
    assert named == rare  # a rare condition is named in some note of each rare patient, and only there
    own = ("pyridostigmine", "fludrocortisone", "mycophenolate", "plasmapheresis", "cosyntropin", "CSF protein")
    common_text = " ".join(t for t, g in zip(notes["text"], notes["group"]) if g == "common")
    assert not any(w in common_text for w in own)  # the rarer vocabulary is the minority's own
    rare_text = " ".join(t for t, g in zip(notes["text"], notes["group"]) if g == "rare")
    assert sum(w in rare_text for w in own) >= 3
    plain = generate_clinical_notes(num_patients=200, seed=7, minority_fraction=0.0)
    assert set(plain["group"]) == {"common"}
    same = [(a, b) for a, b, u in zip(notes["text"], plain["text"], notes["unit_id"]) if u not in rare]
    assert len(same) == sum(u not in rare for u in plain["unit_id"]) and all(a == b for a, b in same)


def test_small_corpus_hash_is_pinned():
    assert _digest(generate_clinical_notes(num_patients=20, seed=0)) == PINNED_20_SEED0


def test_vocabulary_comes_from_the_package_data():
    vocab_dir = resources.files("dpaudit.data").joinpath(clinical.VOCAB_DIR)
    assert all(vocab_dir.joinpath(name).is_file() for name in clinical.VOCAB_FILES)
    assert isinstance(DIAGNOSES, tuple) and len(DIAGNOSES) >= 30
    assert all(isinstance(d, Diagnosis) and isinstance(d.symptoms, tuple) for d in DIAGNOSES)
    assert DIAGNOSES[0].name == "community-acquired pneumonia"
    assert DIAGNOSES[0].labs[0] == ("WBC", 12.5, 19.8, "K/uL", 1)
    assert COMORBIDITIES[0] == ("hypertension", ("lisinopril 20 mg PO daily", "amlodipine 5 mg PO daily",
                                                 "losartan 50 mg PO daily"))
    assert ("obesity", ()) in COMORBIDITIES
    # read once per process; a fresh read of the same files gives the same vocabulary
    assert clinical._vocab() is clinical._vocab()
    assert load_vocabulary(vocab_dir).diagnoses == DIAGNOSES


@pytest.fixture
def vocab_copy(tmp_path):
    src = resources.files("dpaudit.data").joinpath(clinical.VOCAB_DIR)
    for name in clinical.VOCAB_FILES:
        (tmp_path / name).write_text(src.joinpath(name).read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


def _edit(path, old, new):
    text = path.read_text(encoding="utf-8")
    assert text.count(old) >= 1, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_copy_of_vocabulary_loads(vocab_copy):
    assert load_vocabulary(vocab_copy).diagnoses == DIAGNOSES


@pytest.mark.parametrize(
    ("name", "old", "new", "message"),
    [
        # a lab row with a missing bound
        ("diagnoses.yaml", "- [WBC, 12.5, 19.8, K/uL, 1]", "- [WBC, 12.5, K/uL, 1]",
         r"diagnoses\.yaml: diagnoses\[0\]\.labs\[0\]: must be \[name, low, high, unit, decimals\]"),
        # a misspelt key
        ("diagnoses.yaml", "  symptoms:\n  - productive cough", "  symptom:\n  - productive cough",
         r"diagnoses\.yaml: diagnoses\[0\]\.symptoms: missing"),
        # a list that became a string
        ("patients.yaml", "jobs:\n- teacher", "jobs: teacher\nx:\n- teacher",
         r"patients\.yaml: jobs: must be a list, got str"),
        # a template with a field the generator does not supply
        ("phrasing.yaml", "Contact phone: {phone}.", "Contact phone: {telephone}.",
         r"phrasing\.yaml: contact\[0\]: template .* unknown field\(s\) \{telephone\}"),
        # a template that does not parse
        ("phrasing.yaml", "Labs: {results}.", "Labs: {results.",
         r"phrasing\.yaml: labs\.templates\[2\]: bad template"),
        # eleven months
        ("phrasing.yaml", "- December\n", "",
         r"phrasing\.yaml: months: must have exactly 12 items, got 11"),
        # a key the loader does not know
        ("patients.yaml", "relations:\n", "relatives:\n- a cousin\nrelations:\n",
         r"patients\.yaml: \(top level\): unknown key\(s\) relatives"),
        # a plan layout the generator does not have
        ("phrasing.yaml", "plan_layout: bullets", "plan_layout: table",
         r"phrasing\.yaml: progress_note\.sections\[0\]\.plan_layout: must be one of"),
        # YAML that does not parse
        ("patients.yaml", "allergies:\n", "allergies: [\n",
         r"patients\.yaml: not valid YAML"),
    ],
)
def test_malformed_vocabulary_names_file_and_key(vocab_copy, name, old, new, message):
    _edit(vocab_copy / name, old, new)
    with pytest.raises(ClinicalVocabularyError, match=message) as info:
        load_vocabulary(vocab_copy)
    assert str(vocab_copy / name) in str(info.value)
    assert isinstance(info.value, InputError)  # the command line prints it as one line


def test_missing_vocabulary_file(vocab_copy):
    (vocab_copy / "phrasing.yaml").unlink()
    with pytest.raises(ClinicalVocabularyError, match=r"phrasing\.yaml cannot be read"):
        load_vocabulary(vocab_copy)


def test_another_hospital_has_its_own_patients_and_vocabulary():
    """The oncology hospital (a private distribution apart from the general one, issue 29
    point 0): its own unit ids, note templates and conditions; an unknown hospital is refused."""
    onc = generate_clinical_notes(num_patients=30, seed=7, hospital="oncology")
    gen = generate_clinical_notes(num_patients=30, seed=7)
    assert all(u.startswith("oncology-patient-") for u in onc["unit_id"]) and set(onc["hospital"]) == {"oncology"}
    names = {d.name for d in clinical._vocab("oncology").diagnoses}
    assert not names & {d.name for d in clinical._vocab().diagnoses}
    assert not set(onc["text"]) & set(gen["text"])
    with pytest.raises(InputError, match="unknown hospital"):
        generate_clinical_notes(num_patients=3, seed=0, hospital="mars")


def test_public_data_from_another_hospital_is_one_choice():
    from dpaudit.config import load_config, validate

    config = load_config("tiny", overrides=["data.public={hospital: general, num_patients: 20}",
                                            "data.public_fraction=0", "data.hospital=oncology"])
    validate(config)
    assert config.data.has_public() and config.data.public.num_patients == 20
    with pytest.raises(InputError, match="both choose the public data"):
        validate(load_config("tiny", overrides=["data.public={hospital: general}"]))
