"""Canary sets: shipped YAML, generation, seeded inclusion, new tokens, insertion."""

import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpaudit import canaries as C
from dpaudit.data.clinical import generate_clinical_notes
from dpaudit.data.corpus import load_corpus, split_by_unit
from dpaudit.data.tokenizer import train_tokenizer
from dpaudit.errors import InputError

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "canaries"


def _pattern_regex(pattern: str) -> str:
    return "".join("[0-9]" if c == "#" else "[A-Z]" if c == "?" else re.escape(c) for c in pattern)


def test_shipped_sets_listed_and_documented():
    names = C.list_canary_sets()
    assert {"random_secret", "pii", "new_token"} <= set(names)
    for name in names:
        text = (SHIPPED_DIR / f"{name}.yaml").read_text()
        assert text.lstrip().startswith("#"), f"{name}.yaml must document itself in comments"
        spec = C.load_canary_spec(name)
        assert spec["name"] == name and spec["kind"] in C.KINDS


def test_shipped_sets_are_package_data():
    """The sets are read through importlib.resources from the package dpaudit.canary_sets."""
    try:
        pkg = resources.files("dpaudit.canary_sets")
    except ModuleNotFoundError:
        pytest.skip("dpaudit.canary_sets is not importable in this install (see pyproject packaging)")
    assert {p.name for p in pkg.iterdir() if p.name.endswith(".yaml")} >= {
        "random_secret.yaml", "pii.yaml", "new_token.yaml"}


@pytest.mark.parametrize("name", ["random_secret", "random_phone", "pii", "new_token"])
def test_canaries_well_formed(name):
    spec = C.load_canary_spec(name)
    cs = C.make_canaries(spec=name, num_canaries=40, seed=11, repetitions=3)
    assert len(cs) == 40
    assert [c.id for c in cs] == [f"canary-{name}-{i:04d}" for i in range(40)]
    assert len({c.secret for c in cs}) == 40
    for c in cs:
        assert c.kind == spec["kind"] and c.repetitions == 3
        assert c.text == c.prefix + c.secret and c.prefix
        d = c.to_dict()
        assert d["id"] == c.id and d["included"] == c.included
        if spec["kind"] != "new_token":
            assert re.fullmatch(_pattern_regex(spec["secret"]["pattern"]), c.secret)
    assert len({c.prefix for c in cs}) > 1  # several templates / fields


def test_inclusion_reproducible_from_seed():
    a = C.make_canaries(spec="random_secret", num_canaries=1000, seed=5)
    b = C.make_canaries(spec="random_secret", num_canaries=1000, seed=5)
    assert a == b
    inc = np.array([c.included for c in a])
    assert abs(inc.mean() - 0.5) < 0.05  # each in with probability 1/2
    c = C.make_canaries(spec="random_secret", num_canaries=1000, seed=6)
    assert [x.included for x in c] != list(inc)
    # inclusion does not depend on repetitions, and a prefix of canaries is stable
    d = C.make_canaries(spec="random_secret", num_canaries=100, seed=5, repetitions=4)
    assert [x.included for x in d] == list(inc[:100])
    assert [x.secret for x in d] == [x.secret for x in a[:100]]
    # different sets with the same seed draw independently
    e = C.make_canaries(spec="pii", num_canaries=300, seed=5)
    assert [x.included for x in e] != list(inc[:300])
    assert not {x.secret for x in e} & {x.secret for x in a}
    assert all(not x.included for x in C.make_canaries(spec="pii", num_canaries=20, seed=5, inclusion_prob=0.0))


def test_secret_space_and_sampling():
    assert C.secret_space_size("random_secret") == 10**8
    assert C.secret_space_size("random_phone") == 10**10
    assert C.secret_space_size("pii") == 10**8
    spec = C.load_canary_spec("new_token")
    assert C.secret_space_size(spec) == spec["secret"]["pool_size"] ** spec["secret"]["length"]
    rng = np.random.default_rng(0)
    sample = C.sample_secrets("random_phone", num=50, rng=rng)
    assert all(re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", s) for s in sample)
    pool = set(C.new_tokens(spec))
    toks = re.findall(r"<\|canary_\d{4}\|>", C.sample_secrets(spec, num=1, rng=rng)[0])
    assert len(toks) == spec["secret"]["length"] and set(toks) <= pool


def test_user_yaml_and_bad_specs(tmp_path):
    good = {"kind": "random_secret", "templates": ["Code {secret}"], "secret": {"pattern": "??-##"}}
    path = tmp_path / "my_set.yaml"
    path.write_text(yaml.safe_dump(good))
    spec = C.load_canary_spec(str(path))
    assert spec["name"] == "my_set" and C.secret_space_size(spec) == 26**2 * 100
    cs = C.make_canaries(spec=str(path), num_canaries=5, seed=0)
    assert all(re.fullmatch(r"Code [A-Z]{2}-\d{2}", c.text) for c in cs)
    assert C.make_canaries(spec=good, num_canaries=5, seed=0)[0].secret  # dict specs work too

    bad_cases = [
        ({**good, "kind": "nope"}, "kind"),
        ({**good, "colour": 1}, "unknown field"),
        ({**good, "templates": ["{secret} trailing"]}, "at its end"),
        ({**good, "templates": ["{nickname} {secret}"]}, "unknown field"),
        ({**good, "secret": {"pattern": "abc"}}, "pattern"),
        ({**good, "secret": {"pattern": "##", "length": 3}}, "unknown secret field"),
        ({"kind": "new_token", "templates": ["x{secret}"], "secret": {"pool_size": 1, "length": 2}}, "pool_size"),
        ({"kind": "pii", "templates": ["{mrn} {secret}"], "secret": {"pattern": "##", "field": "mrn"}},
         "is the secret"),
    ]
    for raw, msg in bad_cases:
        with pytest.raises(InputError, match=msg):
            C.make_canaries(spec=raw, num_canaries=2, seed=0)
    with pytest.raises(InputError, match="unknown canary set"):
        C.load_canary_spec("no_such_set")
    (tmp_path / "broken.yaml").write_text("kind: [unclosed")
    with pytest.raises(InputError, match="not valid YAML"):
        C.load_canary_spec(str(tmp_path / "broken.yaml"))
    with pytest.raises(InputError, match="possible secrets"):
        C.make_canaries(spec={**good, "secret": {"pattern": "#"}}, num_canaries=11, seed=0)
    assert C.make_canaries(spec="pii", num_canaries=0, seed=0) == []
    for kw in ({"num_canaries": -1}, {"repetitions": 0}, {"inclusion_prob": 1.5}):
        with pytest.raises(InputError):
            C.make_canaries(**{"spec": "pii", "num_canaries": 3, "seed": 0, **kw})


def test_new_token_canaries_are_single_unseen_ids():
    corpus = generate_clinical_notes(num_patients=40, seed=4)["text"][:]
    tok = train_tokenizer(corpus, vocab_size=600)
    spec = C.load_canary_spec("new_token")
    assert C.find_token_collisions(corpus, spec) == []
    n_before = len(tok)
    added = C.add_canary_tokens(tok, spec)
    assert added == spec["secret"]["pool_size"] and len(tok) == n_before + added
    assert C.add_canary_tokens(tok, spec) == 0  # idempotent
    new_ids = set(tok.convert_tokens_to_ids(C.new_tokens(spec)))
    assert min(new_ids) >= n_before
    corpus_ids = {i for ids in tok(corpus)["input_ids"] for i in ids}
    assert not corpus_ids & new_ids
    for c in C.make_canaries(spec=spec, num_canaries=20, seed=1):
        ids = tok(c.text)["input_ids"]
        prefix_ids = tok(c.prefix)["input_ids"]
        secret_ids = ids[len(prefix_ids):]
        assert ids[: len(prefix_ids)] == prefix_ids
        assert len(secret_ids) == spec["secret"]["length"]
        assert set(secret_ids) <= new_ids
        assert tok.convert_ids_to_tokens(secret_ids) == re.findall(r"<\|canary_\d{4}\|>", c.secret)
    assert C.find_token_collisions(["x <|canary_0003|> y"], spec) == ["<|canary_0003|>"]
    assert C.add_canary_tokens(tok, "random_secret") == 0  # other kinds add nothing


def test_distinct_new_token_canaries_share_no_token():
    spec = C.load_canary_spec("new_token")
    spec["secret"] = {**spec["secret"], "pool_size": 400, "length": 4, "distinct": True}
    canaries = C.make_canaries(spec=spec, num_canaries=100, seed=2)
    tokens = [t for c in canaries for t in re.findall(r"<\|canary_\d{4}\|>", c.secret)]
    assert len(tokens) == 400 and len(set(tokens)) == 400  # the whole pool, each token once
    assert [c.secret for c in C.make_canaries(spec=spec, num_canaries=100, seed=2)] == [c.secret for c in canaries]
    shared = C.make_canaries(spec={**spec, "secret": {**spec["secret"], "distinct": False}}, num_canaries=100, seed=2)
    assert len({t for c in shared for t in re.findall(r"<\|canary_\d{4}\|>", c.secret)}) < 400
    assert [c.included for c in shared] == [c.included for c in canaries]  # inclusion does not depend on contents
    with pytest.raises(InputError, match="need a pool of 404 tokens"):
        C.make_canaries(spec=spec, num_canaries=101, seed=2)
    with pytest.raises(InputError, match="secret.distinct must be true or false"):
        C.validate_canary_spec({**spec, "secret": {**spec["secret"], "distinct": "yes"}})


def test_insert_canaries():
    ds = load_corpus(source="clinical", num_patients=30, seed=0)
    members, _, _ = split_by_unit(ds, seed=0)
    cs = C.make_canaries(spec="random_secret", num_canaries=16, seed=3, repetitions=2)
    out = C.insert_canaries(members, cs, seed=9)
    n_in = sum(c.included for c in cs)
    assert 0 < n_in < 16
    assert len(out) == len(members) + 2 * n_in
    assert set(out.column_names) == {"text", "unit_id", "is_canary", "canary_id"}
    canary_rows = out.filter(lambda r: r["is_canary"])
    assert sorted(canary_rows["canary_id"]) == sorted(c.id for c in cs if c.included for _ in range(2))
    assert canary_rows["unit_id"] == canary_rows["canary_id"]
    assert set(out.filter(lambda r: not r["is_canary"])["canary_id"]) == {""}
    assert sorted(out["text"]) == sorted(members["text"][:] + [c.text for c in cs if c.included] * 2)
    # shuffled, deterministically
    assert out["text"][:] != members["text"][:] + [c.text for c in cs if c.included for _ in range(2)]
    assert C.insert_canaries(members, cs, seed=9)["text"] == out["text"]
    assert C.insert_canaries(members, cs, seed=10)["text"] != out["text"]
    with pytest.raises(InputError, match="inserted before"):
        C.insert_canaries(out, cs, seed=0)
    with pytest.raises(InputError, match="not unique"):
        C.insert_canaries(members, cs + cs[:1], seed=0)
    # extra columns survive; canary rows leave them empty
    clinical = generate_clinical_notes(num_patients=5, seed=0)
    mixed = C.insert_canaries(clinical, cs, seed=1)
    assert {"note_type", "note_id"} <= set(mixed.column_names)
    assert all(r["note_type"] is None for r in mixed if r["is_canary"])


def test_save_load_canaries(tmp_path):
    from dpaudit.stages.artifacts import load_canaries, save_canaries

    cs = C.make_canaries(spec="new_token", num_canaries=8, seed=2, repetitions=2)
    path = save_canaries(cs, tmp_path / "canaries.json", spec="new_token")
    loaded, spec = load_canaries(path)
    assert loaded == cs and spec["kind"] == "new_token"
    assert int(__import__("json").loads(path.read_text())["secret_space_size"]) == C.secret_space_size(spec)


def test_which_draws_stay_put_when_the_set_grows():
    # the module docstring: canary i depends only on (seed, set name, i), except the secrets
    # of a distinct new_token set, dealt out of one permutation that depends on the number
    small = C.make_canaries(spec="new_token_pairs", num_canaries=10, seed=3)
    large = C.make_canaries(spec="new_token_pairs", num_canaries=20, seed=3)
    assert [(c.prefix, c.included) for c in small] == [(c.prefix, c.included) for c in large[:10]]
    assert [c.secret for c in small] != [c.secret for c in large[:10]]
    assert "changes with the number of canaries" in " ".join(C.__doc__.split())
    small = C.make_canaries(spec="new_token", num_canaries=10, seed=3)
    assert small == C.make_canaries(spec="new_token", num_canaries=20, seed=3)[:10]
