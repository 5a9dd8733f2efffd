"""Canaries: synthetic secrets planted in the training data to measure memorization.

A canary set is a YAML file (shipped ones live in ``canaries/`` and install as the package
``dpaudit.canary_sets``; users may pass a path to their own). Three kinds:

``random_secret``
    Secret Sharer canaries (Carlini et al. 2019, "The Secret Sharer: Evaluating and Testing
    Unintended Memorization in Neural Networks"): a template such as ``"Patient ID {secret}"``
    whose secret is drawn uniformly from a declared format (``"########"`` = 8 digits), so
    the secret space ``R`` is known and exposure ``log2 |R| - log2 rank`` can be computed.
``pii``
    A whole PII-shaped record in the style of the clinical corpus (name, DOB, diagnosis,
    phone ...) whose secret is the MRN or phone part.
``new_token``
    Canaries made of tokens added to the vocabulary that appear nowhere else in the corpus
    (Panda et al., ICLR 2025, "Privacy Auditing of Large Language Models"): a fixed short
    prefix followed by ``n`` tokens sampled from a pool of ``K`` new tokens such as
    ``"<|canary_0137|>"``. Without DP such canaries are detected almost perfectly, which makes
    one-run audits of language models meaningful. Call :func:`add_canary_tokens` on the
    tokenizer before training; the caller must then resize the model's embeddings
    (``model.resize_token_embeddings(len(tokenizer))``).

Every canary's text is ``prefix + secret`` (templates end with ``{secret}``), so the secret
is scored given its prefix. A set of ``m`` canaries is generated with
:func:`make_canaries`; each canary is included in training independently with probability
1/2 (seeded, recorded in ``Canary.included``) and repeated ``r`` times, as the one-run audit
of Steinke, Nasr and Jagielski (2023) requires. :func:`insert_canaries` appends the
included ones to the member set, each as its own protected unit.

Randomness: ``numpy.random.SeedSequence(seed, spawn_key=(crc32(set name),))`` is spawned
into a content stream and an inclusion stream; canary ``i`` depends only on
``(seed, set name, i)``, so the first canaries of a larger set are those of a smaller one.
One exception: a ``new_token`` set with ``secret.distinct`` deals its tokens out of one
permutation of the pool, drawn from the content stream's child ``m`` (the one after the
``m`` canaries' own), so there every canary's secret changes with the number of canaries
``m`` (its template, prefix and inclusion do not). Keying by the set name means two sets
generated with the same run seed (say ``random_secret`` and ``pii``) get independent secrets
and independent inclusion draws, so their canaries can be pooled in one audit.
"""

from __future__ import annotations

import os
import re
import string
import zlib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dpaudit.errors import InputError
from dpaudit.seeds import seed_sequence

__all__ = [
    "KINDS",
    "Canary",
    "list_canary_sets",
    "load_canary_spec",
    "validate_canary_spec",
    "secret_space_size",
    "sample_secrets",
    "make_canaries",
    "new_tokens",
    "add_canary_tokens",
    "find_token_collisions",
    "insert_canaries",
    "canaries_to_dict",
    "canaries_from_dict",
]

KINDS = ("random_secret", "pii", "new_token")
CANARY_SCHEMA_VERSION = 1

_DIGITS = "0123456789"
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PATTERN_ALPHABETS = {"#": _DIGITS, "?": _LETTERS}

# Fields a template may use besides {secret}; filled from a fresh synthetic patient
# (dpaudit.data.clinical.random_patient_fields).
TEMPLATE_FIELDS = ("name", "first_name", "last_name", "mrn", "phone", "dob", "age", "sex", "diagnosis",
                   "medication", "date", "doctor", "city")

_TOP_KEYS = {"name", "kind", "description", "templates", "secret"}
_SECRET_KEYS = {
    "random_secret": {"pattern"},
    "pii": {"pattern", "field"},
    "new_token": {"pool_size", "length", "token_format", "distinct"},
}


@dataclass(frozen=True)
class Canary:
    """One canary. ``text == prefix + secret``; ``included`` says whether it was drawn into
    the training set; ``repetitions`` is how many copies go in when included."""

    id: str
    kind: str
    text: str
    prefix: str
    secret: str
    included: bool
    repetitions: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------


def _sets_dir():
    """The directory of shipped canary sets, as an importlib Traversable."""
    try:
        return resources.files("dpaudit.canary_sets")
    except ModuleNotFoundError:  # source tree whose packaging does not map canaries/ (yet)
        return Path(__file__).resolve().parent.parent / "canaries"


def list_canary_sets() -> list[str]:
    """Names of the shipped canary sets (the YAML file stems), sorted."""
    return sorted(p.name[: -len(".yaml")] for p in _sets_dir().iterdir() if p.name.endswith(".yaml"))


def load_canary_spec(name_or_path: str | os.PathLike) -> dict:
    """Load a canary set: a shipped set by name (see :func:`list_canary_sets`) or a path to
    a user YAML file. The YAML is read with ``yaml.safe_load`` and validated; returns the
    normalised spec dict. Raises ``InputError`` on an unknown set or a bad field."""
    key = str(name_or_path)
    shipped = list_canary_sets()
    if key in shipped:
        text = (_sets_dir() / f"{key}.yaml").read_text(encoding="utf-8")
        origin, default_name = f"canary set '{key}'", key
    else:
        path = Path(key).expanduser()
        if not path.is_file():
            raise InputError(
                f"unknown canary set '{key}': not a shipped set ({', '.join(shipped)}) nor a YAML file"
            )
        text = path.read_text(encoding="utf-8")
        origin, default_name = str(path), path.stem
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{origin} is not valid YAML: {' '.join(str(exc).split())}") from None
    return validate_canary_spec(raw, origin=origin, default_name=default_name)


def _check_int(value, what: str, *, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise InputError(f"{what} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _template_fields(template: str, origin: str) -> list[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InputError(f"{origin}: bad template {template!r}: {exc}") from None
    fields = []
    for _, field, spec, conv in parsed:
        if field is None:
            continue
        if spec or conv:
            raise InputError(f"{origin}: template {template!r} uses a format spec or conversion on {{{field}}}")
        fields.append(field)
    return fields


def validate_canary_spec(raw: Any, *, origin: str = "canary spec", default_name: str | None = None) -> dict:
    """Validate a canary spec (as loaded from YAML) and return a normalised copy."""
    if not isinstance(raw, dict):
        raise InputError(f"{origin}: a canary spec must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise InputError(f"{origin}: unknown field(s) {', '.join(map(str, unknown))}; "
                         f"allowed: {', '.join(sorted(_TOP_KEYS))}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise InputError(f"{origin}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    name = raw.get("name", default_name or kind)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise InputError(f"{origin}: name must be letters, digits, '_', '.' or '-', got {name!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise InputError(f"{origin}: description must be a string")

    templates = raw.get("templates")
    if not isinstance(templates, list) or not templates or not all(isinstance(t, str) for t in templates):
        raise InputError(f"{origin}: templates must be a non-empty list of strings")
    for t in templates:
        fields = _template_fields(t, origin)
        if fields.count("secret") != 1 or not t.endswith("{secret}"):
            raise InputError(f"{origin}: template {t!r} must contain {{secret}} once, at its end")
        bad = sorted(set(fields) - set(TEMPLATE_FIELDS) - {"secret"})
        if bad:
            raise InputError(f"{origin}: template {t!r} uses unknown field(s) {', '.join(bad)}; "
                             f"allowed: {', '.join(TEMPLATE_FIELDS)}")

    secret = raw.get("secret")
    if not isinstance(secret, dict):
        raise InputError(f"{origin}: secret must be a mapping")
    unknown = sorted(set(secret) - _SECRET_KEYS[kind])
    if unknown:
        raise InputError(f"{origin}: unknown secret field(s) {', '.join(map(str, unknown))} for kind {kind}; "
                         f"allowed: {', '.join(sorted(_SECRET_KEYS[kind]))}")
    if kind == "new_token":
        sec = {
            "pool_size": _check_int(secret.get("pool_size"), f"{origin}: secret.pool_size", lo=2),
            "length": _check_int(secret.get("length"), f"{origin}: secret.length", lo=1),
            "token_format": secret.get("token_format", "<|canary_{index:04d}|>"),
            "distinct": secret.get("distinct", False),
        }
        if not isinstance(sec["distinct"], bool):
            raise InputError(f"{origin}: secret.distinct must be true or false, got {sec['distinct']!r}")
        fmt = sec["token_format"]
        if not isinstance(fmt, str) or "{index" not in fmt:
            raise InputError(f"{origin}: secret.token_format must be a string containing {{index}}, got {fmt!r}")
        try:
            toks = [fmt.format(index=i) for i in range(sec["pool_size"])]
        except (ValueError, KeyError, IndexError) as exc:
            raise InputError(f"{origin}: bad secret.token_format {fmt!r}: {exc}") from None
        if len(set(toks)) != len(toks) or any(not t.strip() or t != t.strip() for t in toks):
            raise InputError(f"{origin}: secret.token_format must give distinct tokens without surrounding spaces")
    else:
        pattern = secret.get("pattern")
        if not isinstance(pattern, str) or not any(c in _PATTERN_ALPHABETS for c in pattern):
            raise InputError(f"{origin}: secret.pattern must be a string with at least one '#' (digit) "
                             f"or '?' (capital letter), got {pattern!r}")
        sec = {"pattern": pattern}
        if kind == "pii":
            field = secret.get("field")
            if field not in ("mrn", "phone"):
                raise InputError(f"{origin}: secret.field must be 'mrn' or 'phone' for pii canaries, got {field!r}")
            sec["field"] = field
            for t in templates:
                if field in _template_fields(t, origin):
                    raise InputError(f"{origin}: template {t!r} shows {{{field}}}, which is the secret")
    return {"name": name, "kind": kind, "description": description, "templates": list(templates), "secret": sec}


def _resolve_spec(spec: dict | str | os.PathLike) -> dict:
    if isinstance(spec, dict):
        return validate_canary_spec(spec)
    if isinstance(spec, (str, os.PathLike)):
        return load_canary_spec(spec)
    raise InputError(f"spec must be a canary set name, a YAML path or a dict, got {type(spec).__name__}")


def secret_space_size(spec: dict | str) -> int:
    """``|R|``, the number of possible secrets (uniformly distributed), for exposure:
    ``10^#digits * 26^#letters`` for patterns, ``pool_size ** length`` for new tokens."""
    spec = _resolve_spec(spec)
    sec = spec["secret"]
    if spec["kind"] == "new_token":
        return int(sec["pool_size"]) ** int(sec["length"])
    size = 1
    for c in sec["pattern"]:
        if c in _PATTERN_ALPHABETS:
            size *= len(_PATTERN_ALPHABETS[c])
    return size


def new_tokens(spec: dict | str) -> list[str]:
    """The pool of ``K`` new token strings declared by a ``new_token`` spec."""
    spec = _resolve_spec(spec)
    if spec["kind"] != "new_token":
        raise InputError(f"canary set '{spec['name']}' is of kind {spec['kind']}, not new_token")
    sec = spec["secret"]
    return [sec["token_format"].format(index=i) for i in range(sec["pool_size"])]


def _draw_secret(spec: dict, rng: np.random.Generator, pool: list[str] | None) -> str:
    sec = spec["secret"]
    if spec["kind"] == "new_token":
        idx = rng.integers(0, len(pool), size=sec["length"])
        return "".join(pool[i] for i in idx)
    out = []
    for c in sec["pattern"]:
        alphabet = _PATTERN_ALPHABETS.get(c)
        out.append(alphabet[int(rng.integers(len(alphabet)))] if alphabet else c)
    return "".join(out)


def sample_secrets(spec: dict | str, *, num: int, rng: np.random.Generator) -> list[str]:
    """``num`` secrets drawn uniformly (with replacement) from the spec's secret space:
    the reference distribution for exposure (Carlini et al. 2019)."""
    spec = _resolve_spec(spec)
    num = _check_int(num, "num", lo=0)
    pool = new_tokens(spec) if spec["kind"] == "new_token" else None
    return [_draw_secret(spec, rng, pool) for _ in range(num)]


# --------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------


def _root_seed_sequence(seed: int, set_name: str) -> np.random.SeedSequence:
    """``SeedSequence(seed)`` keyed by the set name (a stable CRC32), so two sets generated
    with the same seed get independent secrets and inclusion draws."""
    return seed_sequence(seed, zlib.crc32(set_name.encode("utf-8")))


def make_canaries(
    *,
    spec: dict | str,
    num_canaries: int,
    seed: int,
    repetitions: int = 1,
    inclusion_prob: float = 0.5,
) -> list[Canary]:
    """Generate ``num_canaries`` canaries from a spec (a dict, a shipped set name or a path).

    Canary ``i`` gets id ``"canary-<set name>-<i:04d>"``, a template chosen uniformly, the
    template's other fields from a fresh synthetic patient, and a secret drawn uniformly
    from the secret space; secrets are distinct within the set. A ``new_token`` spec with
    ``secret.distinct`` deals its tokens out of one permutation of the pool instead, so no
    token is in two canaries and no canary trains another's token embeddings directly (one
    source of the interference between canaries that Keinan et al. 2025 find limits one-run
    audits; on the demo model it is not the main one, see docs/ceilings.md); that permutation
    depends on ``num_canaries``, so such a set's secrets are not those of a smaller set's
    first canaries (every other draw of canary ``i`` depends only on the seed, the set name
    and ``i``). Inclusion is drawn
    independently per canary with probability ``inclusion_prob`` (1/2 for the one-run audit
    of Steinke et al. 2023) from its own stream, so it is reproducible from ``seed`` (and
    the set name) and independent of the canary contents. ``repetitions`` (r >= 1) is
    recorded on each canary and used by :func:`insert_canaries`. ``num_canaries=0`` gives
    an empty list.
    """
    from faker import Faker

    from dpaudit.data.clinical import random_patient_fields

    spec = _resolve_spec(spec)
    m = _check_int(num_canaries, "num_canaries", lo=0)
    r = _check_int(repetitions, "repetitions", lo=1)
    seed = _check_int(seed, "seed", lo=0)
    try:
        p = float(inclusion_prob)
    except (TypeError, ValueError):
        raise InputError(f"inclusion_prob must be a number in [0, 1], got {inclusion_prob!r}") from None
    if not 0.0 <= p <= 1.0:
        raise InputError(f"inclusion_prob must be in [0, 1], got {inclusion_prob!r}")
    space = secret_space_size(spec)
    if space < m:
        raise InputError(f"canary set '{spec['name']}' has only {space} possible secrets, fewer than {m} canaries")
    distinct = spec["kind"] == "new_token" and spec["secret"]["distinct"]
    n_tokens = spec["secret"].get("length", 0)
    if distinct and spec["secret"]["pool_size"] < m * n_tokens:
        raise InputError(f"canary set '{spec['name']}': {m} canaries of {n_tokens} distinct tokens need a pool of "
                         f"{m * n_tokens} tokens, it has {spec['secret']['pool_size']} (secret.pool_size)")

    content_ss, inclusion_ss = _root_seed_sequence(seed, spec["name"]).spawn(2)
    included = np.random.default_rng(inclusion_ss).random(m) < p
    pool = new_tokens(spec) if spec["kind"] == "new_token" else None
    children = content_ss.spawn(m)
    if distinct:  # one permutation of the pool, dealt out: no token in two canaries
        dealt = np.random.default_rng(content_ss.spawn(1)[0]).permutation(len(pool))[: m * n_tokens]
        dealt = dealt.reshape(m, n_tokens)
    templates = spec["templates"]
    needs_fields = [bool(set(_template_fields(t, "spec")) - {"secret"}) for t in templates]
    fake = Faker("en_US") if any(needs_fields) else None
    seen: set[str] = set()
    out = []
    for i, child in enumerate(children):
        rng = np.random.default_rng(child)
        t_index = int(rng.integers(len(templates)))
        template = templates[t_index]
        fields: dict[str, str] = {}
        if needs_fields[t_index]:
            fake.seed_instance(int(child.generate_state(1, dtype=np.uint32)[0]))
            fields = random_patient_fields(rng=rng, faker=fake)
        if distinct:
            secret = "".join(pool[j] for j in dealt[i])
        else:
            secret = _draw_secret(spec, rng, pool)
        while secret in seen:  # distinct secrets; terminates because space >= m
            secret = _draw_secret(spec, rng, pool)
        seen.add(secret)
        prefix = template[: -len("{secret}")].format(**fields)
        out.append(Canary(
            id=f"canary-{spec['name']}-{i:04d}",
            kind=spec["kind"],
            text=prefix + secret,
            prefix=prefix,
            secret=secret,
            included=bool(included[i]),
            repetitions=r,
        ))
    return out


def add_canary_tokens(tokenizer, spec: dict | str) -> int:
    """Add a ``new_token`` spec's token pool to ``tokenizer`` (``tokenizer.add_tokens``, not
    special tokens) and return how many were newly added (0 if already present, so it is
    idempotent; 0 for the other kinds, which add no tokens). The caller must then resize the model's embeddings, e.g.
    ``model.resize_token_embeddings(len(tokenizer))``, and should check with
    :func:`find_token_collisions` that the corpus never contains these strings."""
    spec = _resolve_spec(spec)
    if spec["kind"] != "new_token":
        return 0  # other kinds use the existing vocabulary
    return int(tokenizer.add_tokens(new_tokens(spec)))


def canary_token_ids(tokenizer, spec: dict | str) -> list[int]:
    """The ids in ``tokenizer`` of a ``new_token`` spec's pool (:func:`add_canary_tokens`);
    none for the other kinds."""
    spec = _resolve_spec(spec)
    return tokenizer.convert_tokens_to_ids(new_tokens(spec)) if spec["kind"] == "new_token" else []


def find_token_collisions(texts, spec: dict | str) -> list[str]:
    """The new-token strings of a ``new_token`` spec that occur in ``texts`` (should be
    none: new-token canaries rely on tokens that appear nowhere else)."""
    tokens = new_tokens(spec)
    pattern = re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))
    found: set[str] = set()
    for t in texts:
        if t:
            found.update(pattern.findall(t))
    return sorted(found)


# --------------------------------------------------------------------------------------
# Insertion and persistence
# --------------------------------------------------------------------------------------


def insert_canaries(members, canaries: list[Canary], *, seed: int):
    """Append the included canaries to the member set and shuffle.

    Each included canary is repeated ``canary.repetitions`` times as rows with
    ``unit_id = canary.id``, so a canary is its own protected unit under both example- and
    user-level privacy. Every row gets ``is_canary`` (bool) and ``canary_id`` (``""`` for
    corpus rows). Columns of ``members`` other than ``text`` and ``unit_id`` are left empty
    (None) on canary rows. Rows are permuted with a NumPy Generator seeded by
    ``numpy.random.SeedSequence(seed)``.
    """
    import datasets

    seed = _check_int(seed, "seed", lo=0)
    cols = list(members.column_names)
    for required in ("text", "unit_id"):
        if required not in cols:
            raise InputError(f"members lack a '{required}' column (columns: {', '.join(cols)})")
    if "is_canary" in cols or "canary_id" in cols:
        raise InputError("members already hold canary columns; canaries were inserted before")
    ids = [c.id for c in canaries]
    if len(set(ids)) != len(ids):
        raise InputError("canary ids are not unique; give each canary set a distinct name")
    clash = set(ids) & set(members.unique("unit_id"))
    if clash:
        raise InputError(f"canary id {sorted(clash)[0]} collides with a unit_id of the corpus")

    rows = [c for c in canaries if c.included for _ in range(c.repetitions)]
    n = len(members)
    base = members.add_column("is_canary", [False] * n).add_column("canary_id", [""] * n)
    if rows:
        extra = {col: [None] * len(rows) for col in cols}
        extra["text"] = [c.text for c in rows]
        extra["unit_id"] = [c.id for c in rows]
        extra["is_canary"] = [True] * len(rows)
        extra["canary_id"] = [c.id for c in rows]
        canary_ds = datasets.Dataset.from_dict(extra, features=base.features)
        combined = datasets.concatenate_datasets([base, canary_ds])
    else:
        combined = base
    perm = np.random.default_rng(np.random.SeedSequence(seed)).permutation(len(combined))
    return combined.select(perm).flatten_indices()


def canaries_to_dict(canaries: list[Canary], *, spec: dict | str | None = None) -> dict[str, Any]:
    """The content of a canary file: the canaries (and optionally their spec and secret-space
    size); :func:`canaries_from_dict` reads it back."""
    payload: dict[str, Any] = {"schema_version": CANARY_SCHEMA_VERSION}
    if spec is not None:
        spec = _resolve_spec(spec)
        payload["spec"] = spec
        payload["secret_space_size"] = str(secret_space_size(spec))  # may exceed 2^53
    payload["canaries"] = [c.to_dict() for c in canaries]
    return payload


def canaries_from_dict(payload: Any, *, origin: str = "canary file") -> tuple[list[Canary], dict | None]:
    """``(canaries, spec or None)`` from :func:`canaries_to_dict`'s content; an
    :class:`InputError` names ``origin`` when it is malformed."""
    if not isinstance(payload, dict) or payload.get("schema_version") != CANARY_SCHEMA_VERSION:
        found = payload.get("schema_version") if isinstance(payload, dict) else None
        raise InputError(f"{origin} has schema_version {found!r}, expected {CANARY_SCHEMA_VERSION}")
    try:
        canaries = [Canary(**c) for c in payload["canaries"]]
    except (KeyError, TypeError) as exc:
        raise InputError(f"{origin} has malformed canaries: {exc}") from None
    return canaries, payload.get("spec")
