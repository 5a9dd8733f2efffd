"""The vocabulary of the built-in clinical corpus: its YAML files, read and validated.

Every word list and phrasing of :mod:`dpaudit.data.clinical` lives in YAML files shipped
inside the package, ``dpaudit/data/clinical_vocab/`` (read with ``importlib.resources``):
``diagnoses.yaml``, ``patients.yaml`` and ``phrasing.yaml``: the general hospital's in the
directory itself, each other hospital's (:data:`HOSPITALS`) in a subdirectory of its name with
the same three files. They are read and validated once, on first use (:func:`vocabulary`); a
malformed file raises :class:`ClinicalVocabularyError` naming the file and the key.
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass
from importlib import resources
from types import SimpleNamespace
from typing import Any

from dpaudit.errors import InputError

# The vocabulary files, in the package data of ``dpaudit.data``.
VOCAB_DIR = "clinical_vocab"
VOCAB_FILES = ("diagnoses.yaml", "patients.yaml", "phrasing.yaml")
# The hospitals of the corpus: name -> the vocabulary's directory under VOCAB_DIR ("" for the
# general hospital, whose files are VOCAB_DIR's own).
HOSPITALS = {"general": "", "oncology": "oncology"}


@dataclass(frozen=True)
class Diagnosis:
    """One admitting diagnosis with what tends to be written about it."""

    name: str
    symptoms: tuple[str, ...]
    inpatient: tuple[str, ...]  # treatments given in hospital, with doses
    discharge_meds: tuple[str, ...]  # "drug dose route frequency"
    labs: tuple[tuple[str, float, float, str, int], ...]  # (name, low, high, unit, decimals)
    course: tuple[str, ...]  # hospital-course sentences (complete, no trailing period)
    plan: tuple[str, ...]  # plan items
    specialty: str
    febrile: bool = False
    exam: tuple[str, ...] = ()


class ClinicalVocabularyError(InputError):
    """A vocabulary file of the clinical corpus is missing or malformed. The message names
    the file and the key (e.g. ``.../diagnoses.yaml: diagnoses[3].labs[0]: ...``)."""


_MISSING = object()
_SEXES = ("F", "M")
_PLAN_LAYOUTS = ("bullets", "numbered", "joined")


def _fields(*names: str, **samples: Any) -> dict[str, Any]:
    """Allowed template fields with a sample value each (used to try the template)."""
    return {**{n: "x" for n in names}, **samples}


_PRONOUNS = ("he", "He", "his", "His")
_WHO = ("age", "sex", "sexword", "first", "last", "name")


class _Reader:
    """Validates one mapping of a parsed vocabulary file; every error names the file and
    the key path. ``done()`` rejects keys that were not read (typos)."""

    def __init__(self, raw: Any, origin: str, path: str = ""):
        self.origin, self.path = origin, path
        if not isinstance(raw, dict):
            raise self._fail(None, f"must be a mapping, got {type(raw).__name__}")
        self.raw = raw
        self.known: list[str] = []  # every key asked for, present or not

    def _where(self, key) -> str:
        if key is None:
            return self.path or "(top level)"
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else str(key)

    def _fail(self, key, msg: str) -> ClinicalVocabularyError:
        return ClinicalVocabularyError(f"clinical vocabulary {self.origin}: {self._where(key)}: {msg}")

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key not in self.known:
            self.known.append(key)
        if key not in self.raw:
            if default is _MISSING:
                raise self._fail(key, "missing")
            return default
        return self.raw[key]

    def done(self) -> None:
        unknown = [str(k) for k in self.raw if k not in self.known]
        if unknown:
            raise self._fail(None, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(self.known)}")

    # -- typed reads ------------------------------------------------------------------

    def section(self, key: str) -> _Reader:
        return _Reader(self.get(key), self.origin, self._where(key))

    def sections(self, key: str, *, min_len: int = 1) -> list[_Reader]:
        items = self._list(key, min_len)
        return [_Reader(x, self.origin, f"{self._where(key)}[{i}]") for i, x in enumerate(items)]

    def _list(self, key: str, min_len: int, *, exact: int | None = None) -> list:
        value = self.get(key)
        if not isinstance(value, list):
            raise self._fail(key, f"must be a list, got {type(value).__name__}")
        if exact is not None and len(value) != exact:
            raise self._fail(key, f"must have exactly {exact} items, got {len(value)}")
        if len(value) < min_len:
            raise self._fail(key, f"must have at least {min_len} item(s), got {len(value)}")
        return value

    def string(self, key: str, *, nonempty: bool = True) -> str:
        value = self.get(key)
        if not isinstance(value, str) or (nonempty and not value.strip()):
            raise self._fail(key, f"must be a {'non-empty ' if nonempty else ''}string, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, f"must be true or false, got {value!r}")
        return value

    def strings(self, key: str, *, min_len: int = 1, exact: int | None = None,
                nonempty: bool = True) -> tuple[str, ...]:
        items = self._list(key, min_len, exact=exact)
        for i, s in enumerate(items):
            if not isinstance(s, str) or (nonempty and not s.strip()):
                raise self._fail(key, f"item {i} must be a {'non-empty ' if nonempty else ''}string, got {s!r}")
        return tuple(items)

    def _check_template(self, key, index: int | None, template: Any, fields: dict[str, Any]) -> str:
        where = key if index is None else f"{key}[{index}]"
        if not isinstance(template, str) or not template.strip():
            raise self._fail(where, f"must be a non-empty template string, got {template!r}")
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as exc:
            raise self._fail(where, f"bad template {template!r}: {exc}") from None
        bad = sorted(names - set(fields))
        if bad:
            raise self._fail(where, f"template {template!r} uses unknown field(s) "
                                    f"{', '.join('{' + b + '}' for b in bad)}; "
                                    f"allowed: {', '.join('{' + f + '}' for f in sorted(fields))}")
        try:
            template.format(**fields)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise self._fail(where, f"bad template {template!r}: {exc}") from None
        return template

    def template(self, key: str, fields: dict[str, Any]) -> str:
        return self._check_template(key, None, self.get(key), fields)

    def templates(self, key: str, fields: dict[str, Any], *, min_len: int = 1) -> tuple[str, ...]:
        return tuple(self._check_template(key, i, t, fields) for i, t in enumerate(self._list(key, min_len)))

    def labs(self, key: str) -> tuple[tuple[str, float, float, str, int], ...]:
        rows = []
        for i, row in enumerate(self._list(key, 1)):
            where = f"{key}[{i}]"
            ok = isinstance(row, list) and len(row) == 5
            if ok:
                name, lo, hi, unit, dec = row
                num = [isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)]
                ok = (isinstance(name, str) and bool(name.strip()) and all(num) and lo <= hi
                      and isinstance(unit, str) and isinstance(dec, int) and not isinstance(dec, bool)
                      and 0 <= dec <= 6)
            if not ok:
                raise self._fail(where, "must be [name, low, high, unit, decimals] with numbers "
                                        f"low <= high and decimals an integer 0..6, got {row!r}")
            rows.append(tuple(row))
        return tuple(rows)

    def by_sex(self, key: str, read) -> dict[str, Any]:
        """A mapping F -> ..., M -> ...; ``read(reader, sex)`` reads each value."""
        sub = self.section(key)
        out = {s: read(sub, s) for s in _SEXES}
        sub.done()
        return out


def _read_diagnoses(r: _Reader) -> tuple[tuple[Diagnosis, ...], tuple[Diagnosis, ...]]:
    """(diagnoses, rare_diagnoses); the second may be absent (empty)."""
    common = _read_diagnosis_list(r, "diagnoses", min_len=1)
    rare = _read_diagnosis_list(r, "rare_diagnoses", min_len=0) if r.get("rare_diagnoses", None) is not None else ()
    names = [x.name for x in common + rare]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise r._fail("diagnoses", f"duplicate name(s) {', '.join(dup)}")
    r.done()
    return common, rare


def _read_diagnosis_list(r: _Reader, key: str, *, min_len: int) -> tuple[Diagnosis, ...]:
    out = []
    for d in r.sections(key, min_len=min_len):
        out.append(Diagnosis(
            name=d.string("name"),
            symptoms=d.strings("symptoms", min_len=2),
            inpatient=d.strings("inpatient"),
            discharge_meds=d.strings("discharge_meds"),
            labs=d.labs("labs"),
            course=d.strings("course"),
            plan=d.strings("plan"),
            specialty=d.string("specialty"),
            febrile=d.boolean("febrile", False),
            exam=d.strings("exam", min_len=0) if d.get("exam", None) is not None else (),
        ))
        d.done()
    return tuple(out)


def _read_patients(r: _Reader) -> SimpleNamespace:
    comorbid = []
    for c in r.sections("comorbidities"):
        comorbid.append((c.string("condition"), c.strings("home_meds", min_len=0)))
        c.done()

    def swaps(sub: _Reader, sex: str) -> dict[str, str]:
        m = sub.get(sex)
        if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
            raise sub._fail(sex, f"must be a mapping of relation -> relation, got {m!r}")
        return dict(m)

    out = SimpleNamespace(
        comorbidities=tuple(comorbid),
        allergies=r.strings("allergies", min_len=2),
        relations=r.strings("relations"),
        relation_for_sex=r.by_sex("relation_for_sex", swaps),
        jobs=r.strings("jobs"),
        social_history=r.templates("social_history", _fields("relation", "city", "job", years=5)),
        dispositions=r.strings("dispositions"),
    )
    r.done()
    return out


def _read_phrasing(r: _Reader) -> SimpleNamespace:
    who = _fields(*_WHO, *_PRONOUNS, age=62)
    v = SimpleNamespace()
    v.months = r.strings("months", exact=12)
    v.pronouns = r.by_sex("pronouns", lambda sub, s: sub.strings(s, exact=2))
    v.sex_words = r.by_sex("sex_words", lambda sub, s: sub.strings(s))

    s = r.section("hpi")
    cond = _fields("conditions")
    v.hpi = SimpleNamespace(
        durations=s.strings("durations"),
        history_with=s.template("history_with", cond),
        history_without=s.template("history_without", cond),
        pmh_with=s.template("pmh_with", cond),
        pmh_without=s.template("pmh_without", cond),
        templates=s.templates("templates", {**who, **_fields(
            "duration", "symptoms", "first_symptom", "other_symptoms", "history", "pmh")}),
    )
    s.done()

    s = r.section("course")
    v.course = SimpleNamespace(
        openings=s.templates("openings", _fields(*_PRONOUNS, "treatments")),
        connectors=s.strings("connectors", nonempty=False),
    )
    s.done()

    v.vitals = r.templates("vitals", _fields("hr", "sbp", "dbp", "rr", "spo2", temp=37.0))

    s = r.section("labs")
    v.labs = SimpleNamespace(routine=s.labs("routine"), templates=s.templates("templates", _fields("results")))
    s.done()

    s = r.section("allergies")
    v.allergies = SimpleNamespace(none=s.templates("none", {}),
                                  templates=s.templates("templates", _fields("allergies")))
    s.done()

    v.contact = r.templates("contact", _fields("phone", *_PRONOUNS))

    s = r.section("diagnosis_line")
    dx = _fields("diagnosis", "secondary", "secondary_list")
    v.diagnosis_line = SimpleNamespace(
        principal=s.template("principal", dx), secondary=s.template("secondary", dx),
        short=s.templates("short", dx), short_also=s.template("short_also", dx),
        short_end=s.template("short_end", dx),
    )
    s.done()

    s = r.section("disposition")
    v.disposition = SimpleNamespace(
        one_week=s.template("one_week", {}),
        weeks=s.template("weeks", _fields(n=2)),
        templates=s.templates("templates", _fields(
            *_PRONOUNS, "disposition", "date", "specialty", "weeks", "pcp", "plan", "Plan")),
    )
    s.done()

    v.discharge_summary = _read_discharge_summary(r.section("discharge_summary"))
    v.progress_note = _read_progress_note(r.section("progress_note"))
    r.done()
    return v


def _read_discharge_summary(s: _Reader) -> SimpleNamespace:
    headings = []
    for i, h in enumerate(s._list("headings", 1)):
        if not (isinstance(h, list) and len(h) == 3 and all(isinstance(x, str) and x.strip() for x in h)):
            raise s._fail(f"headings[{i}]", f"must be [history, course, medications] headings, got {h!r}")
        headings.append(tuple(h))
    out = SimpleNamespace(
        headers=s.templates("headers", _fields(
            "name", "first", "last", "mrn", "dob", "admitted", "discharged", "attending")),
        headings=tuple(headings),
        vitals_leads=s.strings("vitals_leads", nonempty=False),
        social_leads=s.strings("social_leads", nonempty=False),
    )
    s.done()
    return out


def _read_progress_note(s: _Reader) -> SimpleNamespace:
    sections = []
    for sec in s.sections("sections"):
        layout = sec.get("plan_layout")
        if layout not in _PLAN_LAYOUTS:
            raise sec._fail("plan_layout", f"must be one of {', '.join(_PLAN_LAYOUTS)}, got {layout!r}")
        sections.append(SimpleNamespace(
            subjective=sec.string("subjective"), objective=sec.string("objective"),
            assessment=sec.string("assessment"), plan_layout=layout,
            plan=sec.string("plan") if layout == "joined" else None,
        ))
        sec.done()
    out = SimpleNamespace(
        headers=s.templates("headers", _fields("day", "date", "name", "first", "last", "mrn", "age", "sex")),
        activities=s.strings("activities"),
        subjective=s.templates("subjective", _fields(*_PRONOUNS, "symptom", "activity")),
        exam_default=s.string("exam_default"),
        exam=s.templates("exam", _fields("exam")),
        plan_medication=s.templates("plan_medication", _fields("medication", "day")),
        plan_home_medication=s.template("plan_home_medication", _fields("medication")),
        statuses=s.strings("statuses"),
        assessments=s.templates("assessments", _fields(
            "age", "sex", "sexword", "diagnosis", "Diagnosis", "status")),
        sections=tuple(sections),
        disposition_plans=s.strings("disposition_plans"),
        disposition=s.template("disposition", _fields("plan")),
    )
    s.done()
    return out


def _read_file(directory, name: str) -> _Reader:
    import yaml

    path = directory.joinpath(name)
    origin = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClinicalVocabularyError(f"clinical vocabulary file {origin} cannot be read: {exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClinicalVocabularyError(
            f"clinical vocabulary {origin}: not valid YAML: {' '.join(str(exc).split())}") from None
    return _Reader(raw, origin)


def hospital_directory(hospital: str = "general"):
    """The shipped vocabulary directory of ``hospital`` (a key of :data:`HOSPITALS`)."""
    if hospital not in HOSPITALS:
        raise InputError(f"unknown hospital {hospital!r} of the clinical corpus: known are {', '.join(HOSPITALS)}")
    directory = resources.files("dpaudit.data").joinpath(VOCAB_DIR)
    return directory.joinpath(HOSPITALS[hospital]) if HOSPITALS[hospital] else directory


def load_vocabulary(directory=None) -> SimpleNamespace:
    """Read and validate the vocabulary files in ``directory`` (a path or an importlib
    Traversable; default: the general hospital's files shipped in ``dpaudit.data``). Raises
    :class:`ClinicalVocabularyError` naming the file and key when one is malformed.
    Uncached; the generator uses the shipped files through :func:`vocabulary`. ``diagnoses``
    are the common conditions, ``rare_diagnoses`` (possibly empty) the rare ones."""
    if directory is None:
        directory = hospital_directory()
    diagnoses, patients, phrasing = (_read_file(directory, n) for n in VOCAB_FILES)
    vocab = _read_phrasing(phrasing)
    vocab.diagnoses, vocab.rare_diagnoses = _read_diagnoses(diagnoses)
    vocab.patient = _read_patients(patients)
    return vocab


@functools.cache
def vocabulary(hospital: str = "general") -> SimpleNamespace:
    """The shipped vocabulary of ``hospital``, read and validated once per process."""
    return load_vocabulary(hospital_directory(hospital))
