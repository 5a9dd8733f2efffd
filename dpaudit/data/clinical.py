"""A built-in synthetic clinical-notes corpus, generated deterministically from a seed.

The corpus imitates the kind of data a hospital would want to protect: discharge summaries
and progress notes that carry a patient's name, medical record number (MRN), phone number,
diagnoses and medications, with several notes per patient. Every person, number and date
is synthetic (names from ``faker``, numbers and dates from NumPy generators); nothing is
drawn from real records.

The protected unit can be a note or a patient: each row carries ``unit_id`` (the patient,
e.g. ``"patient-00012"``) and ``note_id`` (unique per row), so
``load_corpus(source="clinical", unit_column="note_id")`` gives note-level privacy and the
default gives patient-level privacy.

Variety is built in so that a model trained on the corpus learns language rather than one
template: about forty diagnoses with fitting symptoms, medications, doses, labs, hospital
courses and plans; several phrasings for every sentence; optional sections (vitals, labs,
allergies, social history, contact) whose presence and order are random; several heading,
date and layout styles.

Vocabulary: every word list and phrasing lives in YAML files shipped inside the package,
``dpaudit/data/clinical_vocab/`` (read with ``importlib.resources``):

* ``diagnoses.yaml``: the diagnoses, each with symptoms, treatments, discharge
  medications, labs, hospital course, plan, specialty and exam findings;
* ``patients.yaml``: comorbidities with home medications, allergies, relations, jobs,
  social-history sentences and discharge dispositions;
* ``phrasing.yaml``: the sentence templates (``str.format`` strings), headings, months,
  pronouns and the smaller word lists.

They are read and validated once, on first use, by :mod:`dpaudit.data.clinical_vocabulary`
(a malformed file raises :class:`ClinicalVocabularyError` naming the file and the key); this
module keeps only the generation logic. The order of every list in them is part of the corpus: the generator
picks by index, so an edit there changes the generated notes.

Determinism: patient ``i`` depends only on ``(seed, i)``, so the same seed gives an
identical data set in any process, and a larger ``num_patients`` extends a smaller one
(the first patients are the same).
"""

from __future__ import annotations

import datetime as _dt
import zlib
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from dpaudit.data.clinical_vocabulary import (
    HOSPITALS,
    VOCAB_DIR,
    VOCAB_FILES,
    ClinicalVocabularyError,
    Diagnosis,
    load_vocabulary,
)
from dpaudit.data.clinical_vocabulary import vocabulary as _vocab
from dpaudit.errors import InputError

__all__ = [
    "DIAGNOSES",
    "COMORBIDITIES",
    "NOTE_TYPES",
    "Diagnosis",
    "ClinicalVocabularyError",
    "generate_clinical_notes",
    "HOSPITALS",
    "COMMON",
    "RARE",
    "MINORITY_FRACTION",
    "random_patient_fields",
    "format_mrn",
    "format_phone",
    "load_vocabulary",
    "VOCAB_DIR",
    "VOCAB_FILES",
]

NOTE_TYPES = ("discharge_summary", "progress_note")

# A fixed, documented salt so that the corpus seed stream never coincides with another
# stream derived from the same run seed (canaries, splits) by accident.
_CORPUS_SALT = 0xC11A1C
_RARE_SALT = 0x5A4E  # the stream that decides who has a rare condition

#: The groups of the corpus: patients admitted with one of their hospital's common
#: conditions, and the minority admitted with a rare one (``rare_diagnoses``).
COMMON, RARE = "common", "rare"
#: The share of a hospital's patients with a rare condition, by default.
MINORITY_FRACTION = 0.05
_COLUMNS = ("text", "unit_id", "note_id", "note_type", "hospital", "group")

def __getattr__(name: str):
    # DIAGNOSES and COMORBIDITIES are read from the data files on first access, so that
    # importing this module stays cheap.
    if name == "DIAGNOSES":
        return _vocab().diagnoses
    if name == "COMORBIDITIES":
        return _vocab().patient.comorbidities
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "DIAGNOSES", "COMORBIDITIES"])


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _subset(rng: np.random.Generator, seq, lo: int, hi: int) -> list:
    """A random subset of ``seq`` of size in [lo, hi] (clipped), keeping the original order."""
    hi = min(hi, len(seq))
    lo = min(lo, hi)
    k = int(rng.integers(lo, hi + 1))
    idx = np.sort(rng.choice(len(seq), size=k, replace=False))
    return [seq[i] for i in idx]


def _join(items: list[str]) -> str:
    if not items:
        return ""
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def format_mrn(value: int) -> str:
    """MRNs in this corpus are 8 digits (leading zeros kept)."""
    return f"{value:08d}"


def format_phone(area: int, exchange: int, line: int) -> str:
    return f"({area:03d}) {exchange:03d}-{line:04d}"


def _random_phone(rng: np.random.Generator) -> str:
    return format_phone(int(rng.integers(201, 990)), int(rng.integers(200, 1000)), int(rng.integers(0, 10000)))


_DATE_STYLES = 3  # ISO, MM/DD/YYYY, "Month D, YYYY"


def _fmt_date(d: _dt.date, style: int, months) -> str:
    if style == 0:
        return d.isoformat()
    if style == 1:
        return f"{d.month:02d}/{d.day:02d}/{d.year}"
    return f"{months[d.month - 1]} {d.day}, {d.year}"


def _lab_value(rng: np.random.Generator, lab: tuple[str, float, float, str, int]) -> str:
    name, lo, hi, unit, dec = lab
    v = float(rng.uniform(lo, hi))
    num = f"{v:.{dec}f}" if dec else f"{int(round(v))}"
    return f"{name} {num} {unit}".rstrip()


_BASE_DATE = _dt.date(2014, 1, 1)


@dataclass
class _Patient:
    v: SimpleNamespace  # the vocabulary of the patient's hospital
    pid: str
    first: str
    last: str
    sex: str  # "F" | "M"
    age: int
    dob: _dt.date
    mrn: str
    phone: str
    dx: Diagnosis
    comorbid: list[tuple[str, tuple[str, ...]]]
    home_meds: list[str]
    allergies: list[str]
    attending: str
    pcp: str
    city: str
    social: str
    admit: _dt.date
    rare: bool = False  # the admitting diagnosis is one of the hospital's rare ones


    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


def _make_patient(pid: str, rng: np.random.Generator, fake, *, v: SimpleNamespace | None = None,
                  rare: bool = False) -> _Patient:
    v = v if v is not None else _vocab()
    bg = v.patient
    sex = "F" if rng.random() < 0.5 else "M"
    first = fake.first_name_female() if sex == "F" else fake.first_name_male()
    last = fake.last_name()
    attending = fake.last_name()
    pcp = fake.last_name()
    city = fake.city()
    age = int(np.clip(rng.normal(62, 17), 18, 97))
    admit = _BASE_DATE + _dt.timedelta(days=int(rng.integers(0, 3650)))
    dob = _dt.date(admit.year - age, int(rng.integers(1, 13)), int(rng.integers(1, 29)))
    mrn = format_mrn(int(rng.integers(0, 10**8)))
    phone = _random_phone(rng)
    # who is rare is drawn apart (generate_clinical_notes), so every other patient is the
    # patient of a corpus without a minority, draw for draw
    rare = bool(rare) and bool(v.rare_diagnoses)
    dx = _pick(rng, v.rare_diagnoses if rare else v.diagnoses)
    comorbid = _subset(rng, bg.comorbidities, 0, 3)
    home_meds = [_pick(rng, meds) for _, meds in comorbid if meds]
    allergies = _subset(rng, bg.allergies, 0, 2) if rng.random() < 0.45 else []
    rel = _pick(rng, bg.relations)
    rel = bg.relation_for_sex[sex].get(rel, rel)
    template = _pick(rng, bg.social_history)
    social = template.format(relation=rel, city=city, job=_pick(rng, bg.jobs), years=int(rng.integers(2, 30)))
    return _Patient(v, pid, first, last, sex, age, dob, mrn, phone, dx, comorbid, home_meds, allergies,
                    attending, pcp, city, social, admit, rare)


# --------------------------------------------------------------------------------------
# Sentence generators: the phrasings of every slot are in phrasing.yaml
# --------------------------------------------------------------------------------------


def _sexword(p: _Patient, rng) -> str:
    return _pick(rng, p.v.sex_words[p.sex])


def _pron(p: _Patient) -> dict[str, str]:
    """Template fields he/He (subject) and his/His (possessive) for the patient."""
    he, his = p.v.pronouns[p.sex]
    return {"he": he, "He": he.capitalize(), "his": his, "His": his.capitalize()}


def _history_phrase(p: _Patient) -> str:
    names = [c for c, _ in p.comorbid]
    return _join(names) if names else ""


def _hpi(p: _Patient, rng) -> str:
    hp = p.v.hpi
    syms = _subset(rng, p.dx.symptoms, 2, 3)
    dur = _pick(rng, hp.durations)
    hist = _history_phrase(p)
    sw = _sexword(p, rng)
    history = (hp.history_with if hist else hp.history_without).format(conditions=hist)
    pmh = (hp.pmh_with if hist else hp.pmh_without).format(conditions=hist)
    return _pick(rng, hp.templates).format(
        age=p.age, sex=p.sex, sexword=sw, first=p.first, last=p.last, name=p.name, **_pron(p),
        duration=dur, symptoms=_join(syms), first_symptom=syms[0], other_symptoms=_join(syms[1:]),
        history=history, pmh=pmh,
    )


def _course(p: _Patient, rng) -> str:
    cv = p.v.course
    sents = _subset(rng, p.dx.course, 2, 3)
    tx = _subset(rng, p.dx.inpatient, 1, 2)
    connectors = cv.connectors
    order = rng.permutation(len(connectors))
    body = [_pick(rng, cv.openings).format(treatments=_join(tx), **_pron(p))]
    for s, ci in zip(sents, order):
        c = connectors[ci]
        body.append((c + s) if c else (s[0].upper() + s[1:]))
    return " ".join(x if x.endswith(".") else x + "." for x in body)


def _vitals(p: _Patient, rng) -> str:
    t = rng.uniform(37.9, 39.2) if (p.dx.febrile and rng.random() < 0.6) else rng.uniform(36.2, 37.4)
    hr = int(rng.integers(58, 118))
    sbp = int(rng.integers(98, 172))
    dbp = int(rng.integers(56, 98))
    rr = int(rng.integers(12, 24))
    spo2 = int(rng.integers(89, 100))
    return _pick(rng, p.v.vitals).format(temp=t, hr=hr, sbp=sbp, dbp=dbp, rr=rr, spo2=spo2)


def _labs(p: _Patient, rng) -> str:
    lv = p.v.labs
    vals = [_lab_value(rng, lab) for lab in _subset(rng, p.dx.labs, 1, 3)]
    if rng.random() < 0.5:
        vals.append(_lab_value(rng, _pick(rng, lv.routine)))
    return _pick(rng, lv.templates).format(results="; ".join(vals))


def _meds_section(p: _Patient, rng, heading: str) -> str:
    meds = list(_subset(rng, p.dx.discharge_meds, 1, 3)) + list(_subset(rng, p.home_meds, 0, 3))
    if rng.random() < 0.5:
        return f"{heading}\n" + "\n".join(f"{i + 1}. {m}" for i, m in enumerate(meds))
    if rng.random() < 0.5:
        return f"{heading}\n" + "\n".join(f"- {m}" for m in meds)
    return f"{heading} " + "; ".join(meds) + "."


def _allergy_line(p: _Patient, rng) -> str:
    av = p.v.allergies
    if not p.allergies:
        return _pick(rng, av.none)
    return _pick(rng, av.templates).format(allergies=_join(p.allergies))


def _contact_line(p: _Patient, rng) -> str:
    return _pick(rng, p.v.contact).format(phone=p.phone, **_pron(p))


def _diagnosis_line(p: _Patient, rng) -> str:
    dv = p.v.diagnosis_line
    sec = [c for c, _ in p.comorbid]
    fields = {"diagnosis": p.dx.name, "secondary": _join(sec), "secondary_list": ", ".join(sec)}
    if rng.random() < 0.5:
        s = dv.principal.format(**fields)
        if sec:
            s += dv.secondary.format(**fields)
        return s
    return _pick(rng, dv.short).format(**fields) + (dv.short_also if sec else dv.short_end).format(**fields)


def _disposition(p: _Patient, rng, date: str) -> str:
    v = p.v
    dispo = _pick(rng, v.patient.dispositions)
    n_weeks = int(rng.integers(1, 5))
    weeks = v.disposition.one_week if n_weeks == 1 else v.disposition.weeks.format(n=n_weeks)
    plan = _join(_subset(rng, p.dx.plan, 1, 2))
    return _pick(rng, v.disposition.templates).format(
        disposition=dispo, date=date, specialty=p.dx.specialty, weeks=weeks, pcp=p.pcp,
        plan=plan, Plan=plan.capitalize(), **_pron(p),
    )


# --------------------------------------------------------------------------------------
# Notes
# --------------------------------------------------------------------------------------


def _discharge_summary(p: _Patient, rng, admit: _dt.date, discharge: _dt.date) -> str:
    dv = p.v.discharge_summary
    ds = int(rng.integers(_DATE_STYLES))
    a, d, dob = (_fmt_date(x, ds, p.v.months) for x in (admit, discharge, p.dob))
    header = _pick(rng, dv.headers).format(
        name=p.name, first=p.first, last=p.last, mrn=p.mrn, dob=dob, admitted=a, discharged=d,
        attending=p.attending,
    )
    heads = dv.headings[int(rng.integers(len(dv.headings)))]
    core = [_diagnosis_line(p, rng), f"{heads[0]} {_hpi(p, rng)}", f"{heads[1]} {_course(p, rng)}"]
    if rng.random() < 0.3:  # diagnosis after the narrative sometimes
        core = core[1:] + core[:1]
    optional = []
    if rng.random() < 0.35:
        optional.append(_pick(rng, dv.vitals_leads) + _vitals(p, rng))
    if rng.random() < 0.45:
        optional.append(_labs(p, rng))
    if rng.random() < 0.4:
        optional.append(_allergy_line(p, rng))
    if rng.random() < 0.25:
        optional.append(_pick(rng, dv.social_leads) + p.social)
    rng.shuffle(optional)
    # Optional sections go after the first narrative block, in random order.
    body = core[:2] + optional + core[2:]
    tail = [_meds_section(p, rng, heads[2]), _disposition(p, rng, d)]
    if rng.random() < 0.7:
        tail.insert(int(rng.integers(0, 3)), _contact_line(p, rng))
    return "\n".join([header] + body + tail)


def _progress_note(p: _Patient, rng, date: _dt.date, day: int) -> str:
    pv = p.v.progress_note
    ds = int(rng.integers(_DATE_STYLES))
    dt = _fmt_date(date, ds, p.v.months)
    header = _pick(rng, pv.headers).format(
        day=day, date=dt, name=p.name, first=p.first, last=p.last, mrn=p.mrn, age=p.age, sex=p.sex,
    )
    sym = _pick(rng, p.dx.symptoms)
    activity = _pick(rng, pv.activities)  # drawn whichever phrasing is picked
    subj = _pick(rng, pv.subjective).format(symptom=sym, activity=activity, **_pron(p))
    exam = _pick(rng, p.dx.exam) if p.dx.exam else pv.exam_default
    obj = _vitals(p, rng) + " " + _pick(rng, pv.exam).format(exam=exam)
    if rng.random() < 0.6:
        obj += " " + _labs(p, rng)
    plan_items = [_pick(rng, pv.plan_medication).format(medication=m, day=day)
                  for m in _subset(rng, p.dx.inpatient, 1, 2)]
    plan_items += list(_subset(rng, p.dx.plan, 1, 2))
    if p.home_meds and rng.random() < 0.6:
        plan_items.append(pv.plan_home_medication.format(medication=_pick(rng, p.home_meds)))
    status = _pick(rng, pv.statuses)
    sw = _sexword(p, rng)
    assess = _pick(rng, pv.assessments).format(
        age=p.age, sex=p.sex, sexword=sw, diagnosis=p.dx.name, Diagnosis=p.dx.name.capitalize(), status=status,
    )
    plan_items = [x[0].upper() + x[1:] for x in plan_items]
    sec = pv.sections[int(rng.integers(len(pv.sections)))]
    parts = [f"{sec.subjective} {subj}", f"{sec.objective} {obj}"]
    if sec.plan_layout == "bullets":
        parts += [f"{sec.assessment} {assess}"] + [f"- {x}" for x in plan_items]
    elif sec.plan_layout == "numbered":
        parts += [f"{sec.assessment} {assess} " + " ".join(f"{i + 1}) {x}." for i, x in enumerate(plan_items))]
    else:  # "joined"
        parts += [f"{sec.assessment} {assess}", f"{sec.plan} " + "; ".join(plan_items) + "."]
    extras = []
    if rng.random() < 0.25:
        extras.append(_allergy_line(p, rng))
    if rng.random() < 0.45:
        extras.append(_contact_line(p, rng))
    if rng.random() < 0.2:
        extras.append(pv.disposition.format(plan=_pick(rng, pv.disposition_plans)))
    rng.shuffle(extras)
    for e in extras:  # optional lines land at random places after the header
        parts.insert(int(rng.integers(0, len(parts) + 1)), e)
    return "\n".join([header] + parts)


def _patient_notes(p: _Patient, rng, k: int) -> list[tuple[str, str]]:
    """``k`` chronological notes for one patient: mostly progress notes during a stay, each
    stay ending in a discharge summary; a later readmission starts a new stay."""
    notes: list[tuple[str, str]] = []
    admit = p.admit
    day = 1
    for j in range(k):
        last = j == k - 1
        is_ds = (rng.random() < 0.75) if last else (rng.random() < 0.15)
        if is_ds:
            los = max(day, int(rng.integers(2, 9)))
            notes.append(("discharge_summary", _discharge_summary(p, rng, admit, admit + _dt.timedelta(days=los))))
            admit = admit + _dt.timedelta(days=los + int(rng.integers(14, 400)))
            day = 1
        else:
            notes.append(("progress_note", _progress_note(p, rng, admit + _dt.timedelta(days=day - 1), day)))
            day += int(rng.integers(1, 3))
    return notes


def generate_clinical_notes(*, num_patients: int, notes_per_patient: tuple[int, int] = (2, 5), seed: int,
                            hospital: str = "general", minority_fraction: float = MINORITY_FRACTION):
    """Generate the synthetic clinical-notes corpus of one hospital.

    Parameters (keyword-only):
        num_patients: number of synthetic patients (>= 1).
        notes_per_patient: inclusive range ``(low, high)``; each patient gets a uniform
            number of notes in it.
        seed: the corpus seed. Patient ``i`` of the general hospital is generated from
            ``numpy.random.SeedSequence([salt, seed, i])`` (of another hospital from
            ``[salt, seed, i, crc32(hospital)]``) and a ``faker`` instance seeded from the
            same sequence, so the result is identical across processes.
        hospital: a key of :data:`HOSPITALS`: ``"general"`` (a general medicine ward) or
            ``"oncology"`` (an inpatient cancer center: other conditions, drugs, labs, note
            templates and headings than the general hospital's).
        minority_fraction: in a hospital with rare conditions (``rare_diagnoses`` of its
            vocabulary: the oncology hospital's), the probability that a patient has one;
            such patients form the labelled minority (group ``"rare"``). The fraction decides
            only who is rare: every other patient, and every other field, stays the same.

    Returns:
        ``datasets.Dataset`` with columns ``text``, ``unit_id`` (the patient, e.g.
        ``"patient-00012"``; ``"oncology-patient-00012"`` in the oncology hospital),
        ``note_id`` (unique per row, e.g. ``"patient-00012-note-01"``), ``note_type``
        (``"discharge_summary"`` or ``"progress_note"``), ``hospital`` and ``group``
        (``"common"``, or ``"rare"`` for a patient admitted with a rare condition). Notes of
        one patient share the patient's name, MRN, phone, diagnoses and group.
    """
    import datasets

    if isinstance(num_patients, bool) or not isinstance(num_patients, (int, np.integer)) or num_patients < 1:
        raise InputError(f"num_patients must be a positive integer, got {num_patients!r}")
    try:
        lo, hi = (int(x) for x in notes_per_patient)
    except (TypeError, ValueError):
        raise InputError(f"notes_per_patient must be a pair (low, high), got {notes_per_patient!r}") from None
    if lo < 1 or hi < lo:
        raise InputError(f"notes_per_patient must satisfy 1 <= low <= high, got {notes_per_patient!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(minority_fraction, bool) or not isinstance(minority_fraction, (int, float)) \
            or not 0 <= minority_fraction <= 1:
        raise InputError(f"minority_fraction must be a number in [0, 1], got {minority_fraction!r}")
    vocab = _vocab(hospital)  # an InputError for an unknown hospital

    width = max(5, len(str(int(num_patients) - 1)))
    from faker import Faker

    fake = Faker("en_US")
    prefix = "patient-" if hospital == "general" else f"{hospital}-patient-"
    tail = [] if hospital == "general" else [zlib.crc32(hospital.encode())]
    rows: dict[str, list[str]] = {k: [] for k in _COLUMNS}
    for i in range(int(num_patients)):
        ss = np.random.SeedSequence([_CORPUS_SALT, int(seed), i, *tail])
        rng = np.random.default_rng(ss)
        fake.seed_instance(int(ss.generate_state(1, dtype=np.uint32)[0]))
        pid = f"{prefix}{i:0{width}d}"
        # the minority is drawn from a stream of its own: a patient outside it is, field for
        # field, the patient of the same seed in a corpus without one
        rare = np.random.default_rng(np.random.SeedSequence([_CORPUS_SALT, int(seed), i, *tail, _RARE_SALT]))
        p = _make_patient(pid, rng, fake, v=vocab, rare=bool(rare.random() < minority_fraction))
        k = int(rng.integers(lo, hi + 1))
        for j, (ntype, text) in enumerate(_patient_notes(p, rng, k)):
            for key, value in zip(_COLUMNS, (text, pid, f"{pid}-note-{j + 1:02d}", ntype, hospital,
                                             RARE if p.rare else COMMON)):
                rows[key].append(value)
    features = datasets.Features({k: datasets.Value("string") for k in _COLUMNS})
    return datasets.Dataset.from_dict(rows, features=features)


def random_patient_fields(*, rng: np.random.Generator, faker) -> dict[str, str]:
    """Fields of one fresh synthetic patient in the corpus's style, for PII-shaped canaries.

    Returns strings for ``name``, ``first_name``, ``last_name``, ``mrn``, ``phone``, ``dob``,
    ``age``, ``sex``, ``diagnosis``, ``medication``, ``date``, ``doctor`` and ``city``.
    ``faker`` must be a seeded ``faker.Faker`` instance; ``rng`` a NumPy Generator.
    """
    p = _make_patient("canary", rng, faker)
    meds = list(p.dx.discharge_meds) + p.home_meds
    ds = int(rng.integers(_DATE_STYLES))
    return {
        "name": p.name,
        "first_name": p.first,
        "last_name": p.last,
        "mrn": p.mrn,
        "phone": p.phone,
        "dob": _fmt_date(p.dob, ds, p.v.months),
        "age": str(p.age),
        "sex": "female" if p.sex == "F" else "male",
        "diagnosis": p.dx.name,
        "medication": _pick(rng, meds),
        "date": _fmt_date(p.admit, ds, p.v.months),
        "doctor": f"Dr. {p.attending}",
        "city": p.city,
    }
