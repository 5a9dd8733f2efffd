"""Corpora: load any text data set, split it into members and held-out records by
protected unit, and tokenize it.

Every corpus comes out in one shape, a ``datasets.Dataset`` with two string columns:

* ``text``    - one training record;
* ``unit_id`` - the protected unit the record belongs to (a patient, a user, a note...);

and, when a group column is named (``group_column``), a third:

* ``group``   - the group of people the record's unit belongs to (a cohort, a minority): the
  report says per group what the privacy costs and who pays (Bagdasaryan et al. 2019, arXiv
  1905.12101). A record belongs to one group, and a unit's group is its records' group: a
  unit whose records name different groups is an ``InputError``.

Differential privacy protects *units*: all records of one unit are members together or
held out together (``split_by_unit``), and DP-SGD samples and clips per unit. With
``unit_column=None`` every row is its own unit (example-level privacy).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.errors import InputError

__all__ = [
    "SPLIT_SCHEMA_VERSION",
    "load_corpus",
    "unit_groups",
    "split_by_unit",
    "apply_split",
    "check_split",
    "tokenize_dataset",
]

SPLIT_SCHEMA_VERSION = 1

# File extension -> `datasets` packaged builder.
_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "text",
    ".parquet": "parquet",
}


def _looks_like_path(source: str) -> bool:
    s = source.strip()
    return s.startswith(("/", "./", "../", "~", ".\\")) or os.path.splitext(s)[1].lower() in _BUILDERS


def _one_line(exc: BaseException, *, innermost: bool = False) -> str:
    # `datasets` wraps parser errors ("An error occurred while generating the dataset");
    # for local files the innermost cause says what is wrong with the file.
    seen = 0
    while innermost and (exc.__cause__ or exc.__context__) is not None and seen < 10:
        exc = exc.__cause__ or exc.__context__
        seen += 1
    msg = " ".join(str(exc).split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _local_files(path: Path) -> tuple[str, list[str]]:
    """The builder name and data files for a local file or directory."""
    if path.is_file():
        ext = path.suffix.lower()
        if ext not in _BUILDERS:
            raise InputError(
                f"unsupported file type '{ext or path.name}' for {path}; use one of {', '.join(sorted(_BUILDERS))}"
            )
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _BUILDERS
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise InputError(f"no data files ({', '.join(sorted(_BUILDERS))}) found in directory {path}")
        builders = sorted({_BUILDERS[p.suffix.lower()] for p in files})
        if len(builders) > 1:
            raise InputError(f"directory {path} mixes data file types ({', '.join(builders)}); keep one type")
    if all(p.stat().st_size == 0 for p in files):
        raise InputError(f"the data set is empty: {path} holds no records")
    return _BUILDERS[files[0].suffix.lower()], [str(p) for p in files]


def _load_local(path: Path):
    import datasets

    builder, files = _local_files(path)
    kwargs: dict[str, Any] = {}
    if files[0].lower().endswith(".tsv"):
        kwargs["delimiter"] = "\t"
    library_log = logging.getLogger("datasets")
    level = library_log.level
    library_log.setLevel(logging.CRITICAL)  # it logs a parser error, then raises it: the InputError below says it once
    try:
        return datasets.load_dataset(builder, data_files=files, split="train", **kwargs)
    except Exception as exc:  # a local file that `datasets` cannot parse is the user's input
        if "corresponds to no data" in str(exc):
            raise InputError(f"the data set is empty: {path} holds no records") from None
        raise InputError(f"could not read {path} as {builder}: {_one_line(exc, innermost=True)}") from None
    finally:
        library_log.setLevel(level)


def _load_hub(name: str, *, split: str, trust_remote_code: bool):
    """Load a data set by hub name (needs a network, or a warm local cache)."""
    import inspect

    import datasets

    kwargs: dict[str, Any] = {}
    if trust_remote_code:
        if "trust_remote_code" in inspect.signature(datasets.load_dataset).parameters:
            kwargs["trust_remote_code"] = True
        else:
            warnings.warn(
                "trust_remote_code=True has no effect: this `datasets` version runs no data set scripts",
                stacklevel=3,
            )
    try:
        ds = datasets.load_dataset(name, split=split, **kwargs)
    except ConnectionError as exc:
        raise InputError(f"'{name}' is no local path and the hub could not be reached ({_one_line(exc)}); "
                         "give a local file or directory") from None
    except FileNotFoundError as exc:  # includes DatasetNotFoundError
        raise InputError(f"no local file and no hub data set named '{name}' ({_one_line(exc)})") from None
    except ValueError as exc:  # unknown split and similar
        raise InputError(f"could not load split '{split}' of '{name}': {_one_line(exc)}") from None
    if not isinstance(ds, datasets.Dataset):
        raise InputError(f"'{name}' with split '{split}' did not give a single data set; pass a split name")
    return ds


def _is_string_feature(feature) -> bool:
    dtype = getattr(feature, "dtype", None)
    return dtype in ("string", "large_string")


def load_corpus(
    *,
    source: str,
    text_column: str = "text",
    unit_column: str | None = "unit_id",
    split: str = "train",
    num_patients: int = 500,
    seed: int = 0,
    trust_remote_code: bool = False,
    group_column: str | None = None,
    hospital: str = "general",
    minority_fraction: float | None = None,
):
    """Load a corpus and normalise it to string columns ``text`` and ``unit_id`` (and
    ``group`` with a ``group_column``).

    Parameters (keyword-only):
        source: ``"clinical"`` for the built-in synthetic clinical notes
            (:func:`dpaudit.data.clinical.generate_clinical_notes`); a local file
            (``.json``, ``.jsonl``, ``.csv``, ``.tsv``, ``.txt``, ``.parquet``, read with
            the matching ``datasets`` builder) or a directory of such files (all of one
            type); anything else is a hub data set name for ``datasets.load_dataset(name,
            split=split)``, which needs a network.
        text_column: the column that holds the text (``.txt`` files give ``"text"``).
        unit_column: the column naming the protected unit; ``None`` makes every row its
            own unit (``unit_id`` = the row index, as a string). For the clinical corpus,
            ``"unit_id"`` protects patients and ``"note_id"`` protects single notes.
        split: the hub split to load (local files always give their single ``train`` split).
        num_patients, seed, hospital, minority_fraction: size, seed, hospital and share of
            patients with a rare condition of the clinical corpus (ignored otherwise; None:
            the generator's default); its group column is ``"group"``.
        trust_remote_code: passed to ``datasets`` for hub data sets only when the
            installed version still supports data set scripts.
        group_column: the column naming each record's group (None: no groups); its values
            become strings. See :func:`unit_groups`.

    Rows whose text is missing or blank are dropped. Raises ``InputError`` for a missing
    file, an empty data set, a text, unit or group column that does not exist, a record
    without a group, or a unit whose records name different groups.
    """
    import datasets

    if not isinstance(source, str) or not source.strip():
        raise InputError("source must be 'clinical', a path to a data file or directory, or a hub data set name")
    if not isinstance(text_column, str) or not text_column:
        raise InputError(f"text_column must be a column name, got {text_column!r}")
    if unit_column is not None and (not isinstance(unit_column, str) or not unit_column):
        raise InputError(f"unit_column must be a column name or None, got {unit_column!r}")
    if group_column is not None and (not isinstance(group_column, str) or not group_column):
        raise InputError(f"group_column must be a column name or None, got {group_column!r}")

    ds, origin = _load_source(source, split=split, num_patients=num_patients, seed=seed, hospital=hospital,
                              minority_fraction=minority_fraction, trust_remote_code=trust_remote_code)
    if len(ds) == 0:
        raise InputError(f"the data set is empty: {origin} holds no records")
    columns = list(ds.column_names)
    if text_column not in columns:
        raise InputError(
            f"text column '{text_column}' not found in {origin}; available columns: {', '.join(columns)}"
        )
    if not _is_string_feature(ds.features[text_column]):
        raise InputError(f"text column '{text_column}' in {origin} does not hold strings ({ds.features[text_column]})")
    if unit_column is not None and unit_column not in columns:
        raise InputError(
            f"unit column '{unit_column}' not found in {origin}; available columns: {', '.join(columns)} "
            "(use unit_column=None to make every row its own unit)"
        )

    if group_column is not None and group_column not in columns:
        raise InputError(
            f"group column '{group_column}' not found in {origin}; available columns: {', '.join(columns)}"
        )

    texts = ds[text_column][:]  # a list (a lazy Column in datasets >= 4; slicing is fast)
    units = ds[unit_column][:] if unit_column is not None else [str(i) for i in range(len(ds))]
    missing_units = sum(u is None for u in units)
    if missing_units:
        raise InputError(f"unit column '{unit_column}' in {origin} has {missing_units} missing values")
    keep = [i for i, t in enumerate(texts) if t is not None and t.strip()]
    if not keep:
        raise InputError(f"the data set is empty: column '{text_column}' in {origin} holds no non-blank text")
    columns_out = {"text": [texts[i] for i in keep], "unit_id": [str(units[i]) for i in keep]}
    if group_column is not None:
        groups = ds[group_column][:]
        missing = sum(groups[i] is None or str(groups[i]).strip() == "" for i in keep)
        if missing:
            raise InputError(f"group column '{group_column}' in {origin} has {missing} missing values: "
                             "every record belongs to a group")
        columns_out["group"] = [str(groups[i]) for i in keep]
        unit_groups(columns_out["unit_id"], columns_out["group"], origin=f"group column '{group_column}' in {origin}")
    features = datasets.Features({k: datasets.Value("string") for k in columns_out})
    return datasets.Dataset.from_dict(columns_out, features=features)


def _load_source(source: str, *, split: str, num_patients: int, seed: int, hospital: str,
                 minority_fraction: float | None, trust_remote_code: bool):
    """The raw data set of :func:`load_corpus`'s ``source`` and how to name it in errors."""
    if source == "clinical":
        from dpaudit.data.clinical import generate_clinical_notes

        extra = {} if minority_fraction is None else {"minority_fraction": minority_fraction}
        ds = generate_clinical_notes(num_patients=num_patients, seed=seed, hospital=hospital, **extra)
        return ds, f"the clinical corpus ({hospital} hospital)"
    path = Path(source).expanduser()
    if path.exists():
        return _load_local(path), str(path)
    if _looks_like_path(source):
        raise InputError(f"data file not found: {source}")
    return _load_hub(source, split=split, trust_remote_code=trust_remote_code), source


def unit_groups(units: Sequence[str], groups: Sequence[str], *, origin: str = "the data") -> dict[str, str]:
    """The group of each unit: ``{unit: group}`` from the records' ``units`` and ``groups``
    (one of each per record). A unit's group is its records' group; a unit whose records
    name different groups is an :class:`InputError` that names it and the groups."""
    if len(units) != len(groups):
        raise InputError(f"{origin}: {len(units)} units but {len(groups)} groups")
    out: dict[str, str] = {}
    for unit, group in zip(units, groups):
        first = out.setdefault(unit, group)
        if first != group:
            raise InputError(f"{origin}: unit {unit!r} has records in group {first!r} and in group {group!r}; "
                             "a unit belongs to one group")
    return out


def _check_unit_column(dataset) -> None:
    if "unit_id" not in dataset.column_names:
        raise InputError(f"the data set has no 'unit_id' column (columns: {', '.join(dataset.column_names)})")


def split_by_unit(dataset, *, holdout_fraction: float = 0.5, seed: int):
    """Split a corpus into members and held-out records by protected unit.

    The distinct ``unit_id`` values are sorted, permuted with a NumPy Generator seeded by
    ``numpy.random.SeedSequence(seed)``, and the first ``round(holdout_fraction * units)``
    go to the held-out side. All rows of one unit land on the same side, so the split is
    the same whatever the row order.

    Returns ``(members, held_out, split)`` where ``split`` is a JSON-ready dict
    ``{"schema_version", "seed", "holdout_fraction", "member_units", "heldout_units"}``
    (unit lists sorted) that the prepare stage writes and :func:`apply_split` replays.
    """
    _check_unit_column(dataset)
    try:
        frac = float(holdout_fraction)
    except (TypeError, ValueError):
        raise InputError(f"holdout_fraction must be a number in (0, 1), got {holdout_fraction!r}") from None
    if not 0.0 < frac < 1.0:
        raise InputError(f"holdout_fraction must be in (0, 1), got {holdout_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    units = sorted(set(dataset["unit_id"][:]))
    n = len(units)
    if n < 2:
        raise InputError(f"need at least 2 protected units to split members from held-out records, found {n}")
    n_held = min(max(int(round(frac * n)), 1), n - 1)
    rng = np.random.default_rng(np.random.SeedSequence(int(seed)))
    perm = rng.permutation(n)
    held = sorted(units[i] for i in perm[:n_held])
    members = sorted(units[i] for i in perm[n_held:])
    split = {
        "schema_version": SPLIT_SCHEMA_VERSION,
        "seed": int(seed),
        "holdout_fraction": frac,
        "member_units": members,
        "heldout_units": held,
    }
    member_ds, held_ds = apply_split(dataset, split)
    return member_ds, held_ds, split


def apply_split(dataset, split: dict):
    """Replay a saved split on a corpus: ``(members, held_out)``. Rows whose unit is in
    neither list raise ``InputError`` (the corpus is not the one that was split)."""
    _check_unit_column(dataset)
    try:
        member_set = set(split["member_units"])
        held_set = set(split["heldout_units"])
    except (KeyError, TypeError):
        raise InputError("split must hold 'member_units' and 'heldout_units' lists") from None
    unit_ids = dataset["unit_id"][:]
    is_member = np.fromiter((u in member_set for u in unit_ids), dtype=bool, count=len(unit_ids))
    is_held = np.fromiter((u in held_set for u in unit_ids), dtype=bool, count=len(unit_ids))
    if np.any(is_member & is_held):
        raise InputError("split lists a unit both as member and as held-out")
    unknown = int(np.sum(~(is_member | is_held)))
    if unknown:
        raise InputError(f"{unknown} rows belong to units that the split does not list; was it made for this corpus?")
    return dataset.select(np.flatnonzero(is_member)), dataset.select(np.flatnonzero(is_held))


def check_split(split: Any, *, origin: str = "split file") -> dict:
    """A split as :func:`split_by_unit` returns it (with its ``schema_version``), checked; an
    :class:`InputError` names ``origin`` when it is not one."""
    found = split.get("schema_version") if isinstance(split, dict) else None
    if found != SPLIT_SCHEMA_VERSION:
        raise InputError(f"{origin} has schema_version {found!r}, expected {SPLIT_SCHEMA_VERSION}")
    for key in ("seed", "holdout_fraction", "member_units", "heldout_units"):
        if key not in split:
            raise InputError(f"{origin} lacks '{key}'")
    return split


def _tokenizer_fingerprint(tokenizer, max_length: int, base: str | None) -> str | None:
    """A cheap, exact cache fingerprint for fast tokenizers (hashing the tokenizer object
    with dill is slow and sometimes fails)."""
    import hashlib

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or base is None:
        return None
    h = hashlib.sha256()
    h.update(base.encode())
    h.update(backend.to_str().encode())
    h.update(repr((type(tokenizer).__name__, max_length, getattr(tokenizer, "add_bos_token", None),
                   getattr(tokenizer, "add_eos_token", None))).encode())
    return "dpaudit-tok-" + h.hexdigest()[:32]


def tokenize_dataset(dataset, tokenizer, *, max_length: int):
    """Add ``input_ids`` and ``attention_mask`` columns: truncated to ``max_length`` tokens,
    not padded (padding happens at collation). Other columns are kept."""
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise InputError(f"max_length must be a positive integer, got {max_length!r}")
    if "text" not in dataset.column_names:
        raise InputError(f"the data set has no 'text' column (columns: {', '.join(dataset.column_names)})")
    max_length = int(max_length)

    def encode(batch):
        enc = tokenizer(batch["text"], truncation=True, max_length=max_length, padding=False)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    fingerprint = _tokenizer_fingerprint(tokenizer, max_length, getattr(dataset, "_fingerprint", None))
    kwargs = {"new_fingerprint": fingerprint} if fingerprint else {}
    return dataset.map(encode, batched=True, batch_size=256, desc="tokenize", **kwargs)
