"""load_corpus on local files, split_by_unit, tokenize_dataset, and their bad inputs."""

import csv
import json

import numpy as np
import pytest

from dpaudit.data.corpus import (
    apply_split,
    load_corpus,
    split_by_unit,
    tokenize_dataset,
    unit_groups,
)
from dpaudit.errors import InputError

ROWS = [
    {"body": "Alice visited the clinic on Monday.", "user": "u1", "n": 1},
    {"body": "Alice returned with a cough.", "user": "u1", "n": 2},
    {"body": "   ", "user": "u2", "n": 3},
    {"body": "Bob called about his prescription.", "user": "u2", "n": 4},
    {"body": "Carol's blood pressure was normal.", "user": "u3", "n": 5},
    {"body": "Dan asked for a referral.", "user": "u4", "n": 6},
]


def _write(tmp_path, fmt):
    path = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif fmt == "json":
        path.write_text(json.dumps(ROWS))
    elif fmt == "csv":
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["body", "user", "n"])
            w.writeheader()
            w.writerows(ROWS)
    elif fmt == "parquet":
        import datasets

        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    elif fmt == "txt":
        path.write_text("".join(r["body"] + "\n" for r in ROWS))
    return path


def test_group_column(tmp_path):
    """data.group_column: a record's group; a unit's group is its records' group (issue 29)."""
    rows = [{**r, "cohort": "a" if r["user"] in ("u1", "u3") else "b"} for r in ROWS]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load_corpus(source=str(path), text_column="body", unit_column="user", group_column="cohort")
    assert ds.column_names == ["text", "unit_id", "group"]
    assert ds["group"] == ["a", "a", "b", "a", "b"]
    # the naive loop: every unit's records name one group, and that is the unit's
    naive = {}
    for r in rows:
        if r["body"].strip():
            naive.setdefault(r["user"], set()).add(r["cohort"])
    assert unit_groups(ds["unit_id"], ds["group"]) == {u: g.pop() for u, g in naive.items()}
    rows[1]["cohort"] = "b"  # u1's two records now disagree
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match="unit 'u1' has records in group 'a' and in group 'b'"):
        load_corpus(source=str(path), text_column="body", unit_column="user", group_column="cohort")
    with pytest.raises(InputError, match="group column 'ward' not found"):
        load_corpus(source=str(path), text_column="body", unit_column="user", group_column="ward")
    rows[1]["cohort"] = None
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match="every record belongs to a group"):
        load_corpus(source=str(path), text_column="body", unit_column="user", group_column="cohort")


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_load_local_formats(tmp_path, fmt):
    path = _write(tmp_path, fmt)
    ds = load_corpus(source=str(path), text_column="body", unit_column="user")
    assert ds.column_names == ["text", "unit_id"]
    assert ds["text"][0] == ROWS[0]["body"]
    assert len(ds) == 5  # the blank text is dropped
    assert ds["unit_id"] == ["u1", "u1", "u2", "u3", "u4"]
    # a non-string unit column is stringified; None makes every row its own unit
    by_n = load_corpus(source=str(path), text_column="body", unit_column="n")
    assert by_n["unit_id"] == ["1", "2", "4", "5", "6"]
    per_row = load_corpus(source=str(path), text_column="body", unit_column=None)
    assert per_row["unit_id"] == ["0", "1", "3", "4", "5"]


def test_load_txt_and_directory(tmp_path):
    path = _write(tmp_path, "txt")
    ds = load_corpus(source=str(path), unit_column=None)
    assert len(ds) == 5 and ds["text"][1] == "Alice returned with a cough."
    d = tmp_path / "shards"
    d.mkdir()
    for i, chunk in enumerate([ROWS[:3], ROWS[3:]]):
        (d / f"part-{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chunk))
    ds = load_corpus(source=str(d), text_column="body", unit_column="user")
    assert len(ds) == 5


def test_clinical_source_and_unit_choice():
    patients = load_corpus(source="clinical", num_patients=30, seed=3)
    notes = load_corpus(source="clinical", num_patients=30, seed=3, unit_column="note_id")
    assert patients["text"] == notes["text"]
    assert len(set(patients["unit_id"])) == 30
    assert len(set(notes["unit_id"])) == len(notes)


def test_bad_inputs(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_corpus(source=str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="not found"):
        load_corpus(source="./nowhere/data")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match="empty"):
        load_corpus(source=str(empty))
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,unit_id\n")
    with pytest.raises(InputError, match="empty"):
        load_corpus(source=str(header_only))
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": " ", "unit_id": "a"}\n{"text": "", "unit_id": "b"}\n')
    with pytest.raises(InputError, match="empty"):
        load_corpus(source=str(blank))
    path = _write(tmp_path, "jsonl")
    with pytest.raises(InputError, match=r"text column 'text' not found.*available columns: body, user, n") as exc:
        load_corpus(source=str(path))
    assert "\n" not in str(exc.value)
    with pytest.raises(InputError, match="unit column 'unit_id' not found"):
        load_corpus(source=str(path), text_column="body")
    with pytest.raises(InputError, match="does not hold strings"):
        load_corpus(source=str(path), text_column="n", unit_column=None)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="could not read"):
        load_corpus(source=str(bad))
    with pytest.raises(InputError, match="unsupported file type"):
        (tmp_path / "x.xml").write_text("<a/>")
        load_corpus(source=str(tmp_path / "x.xml"))


def test_split_by_unit_keeps_units_together_and_is_seeded():
    ds = load_corpus(source="clinical", num_patients=40, seed=0)
    members, held, split = split_by_unit(ds, holdout_fraction=0.25, seed=5)
    assert len(members) + len(held) == len(ds)
    assert set(members["unit_id"]).isdisjoint(held["unit_id"])
    assert len(split["heldout_units"]) == 10 and len(split["member_units"]) == 30
    assert set(split["member_units"]) == set(members["unit_id"])
    json.dumps(split)  # JSON-ready
    again = split_by_unit(ds, holdout_fraction=0.25, seed=5)[2]
    assert again == split
    # the split does not depend on row order
    shuffled = ds.shuffle(seed=1)
    assert split_by_unit(shuffled, holdout_fraction=0.25, seed=5)[2] == split
    other = split_by_unit(ds, holdout_fraction=0.25, seed=6)[2]
    assert other["heldout_units"] != split["heldout_units"]


def test_split_save_load_apply(tmp_path):
    ds = load_corpus(source="clinical", num_patients=12, seed=0)
    members, held, split = split_by_unit(ds, seed=1)
    from dpaudit.stages.artifacts import load_split, save_split

    path = save_split(split, tmp_path / "run" / "split.json")
    loaded = load_split(path)
    m2, h2 = apply_split(ds, loaded)
    assert m2["text"] == members["text"] and h2["text"] == held["text"]
    with pytest.raises(InputError, match="does not list"):
        apply_split(load_corpus(source="clinical", num_patients=20, seed=0), loaded)


def test_split_bad_input():
    ds = load_corpus(source="clinical", num_patients=5, seed=0)
    for frac in (0, 1, 1.5, "x"):
        with pytest.raises(InputError, match="holdout_fraction"):
            split_by_unit(ds, holdout_fraction=frac, seed=0)
    one = ds.filter(lambda r: r["unit_id"] == "patient-00000")
    with pytest.raises(InputError, match="at least 2"):
        split_by_unit(one, seed=0)


def test_tokenize_dataset_truncates_without_padding():
    from dpaudit.data.tokenizer import train_tokenizer

    ds = load_corpus(source="clinical", num_patients=20, seed=0)
    texts = ds["text"][:]
    tok = train_tokenizer(texts, vocab_size=400)
    out = tokenize_dataset(ds, tok, max_length=32)
    assert {"text", "unit_id", "input_ids", "attention_mask"} <= set(out.column_names)
    lengths = [len(x) for x in out["input_ids"]]
    assert max(lengths) == 32
    assert min(lengths) > 0
    assert all(len(a) == len(i) and all(a) for a, i in zip(out["attention_mask"], out["input_ids"]))
    short = tokenize_dataset(ds.select(range(3)), tok, max_length=4096)
    assert [len(x) for x in short["input_ids"]] == [len(tok(t)["input_ids"]) for t in texts[:3]]
    assert len({len(x) for x in short["input_ids"]}) > 1  # not padded to a common length
    with pytest.raises(InputError, match="max_length"):
        tokenize_dataset(ds, tok, max_length=0)
    np.testing.assert_equal(out["input_ids"][0], tok(texts[0])["input_ids"][:32])
