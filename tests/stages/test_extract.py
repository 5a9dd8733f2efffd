"""Extract stage: extraction.json, its canary fields and its patient secrets (MRNs by the
patient's number of notes), checked against a naive per-note loop on a tiny model."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpaudit.extraction import MAX_NOTES_PER_GROUP, mrn_notes, patient_groups
from dpaudit.rundir import RunDir
from dpaudit.stages.extract import extract_model

GROUP_KEYS = ["notes", "member_patients", "heldout_patients", "member_mean_logprob", "heldout_mean_logprob",
              "member_extracted", "heldout_extracted"]
CONFIG = SimpleNamespace(attack=SimpleNamespace(batch_size=8), train=SimpleNamespace(device="cpu"),
                         data=SimpleNamespace(max_length=128), seed=0,
                         extract=SimpleNamespace(samples=4, temperature=1.0, k=8, suffix_length=4, max_records=1000),
                         canaries=SimpleNamespace(secrets=SimpleNamespace(enumerate_limit=1000, sample_size=100)))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_run(root, candidates, *, train_steps=0):
    """A run directory with just what the extract stage reads: candidates, canaries, the
    tokenizer and one model (a tiny GPT-2, trained ``train_steps`` steps on the members'
    note headers so that it learns some of their MRNs)."""
    from dpaudit.canaries import make_canaries
    from dpaudit.stages.artifacts import save_canaries
    from dpaudit.data.tokenizer import train_tokenizer
    from dpaudit.models import build_model
    from dpaudit.rundir import write_jsonl_atomic

    rundir = RunDir(root)
    tok = train_tokenizer([c["text"] for c in candidates], vocab_size=400)
    canaries = make_canaries(spec="random_secret", num_canaries=4, seed=0)
    rundir.data_dir.mkdir(parents=True)
    write_jsonl_atomic(rundir.data_dir / "candidates.jsonl", candidates)
    save_canaries(canaries, rundir.data_dir / "canaries.json", spec="random_secret")
    tok.save_pretrained(rundir.tokenizer_dir)
    model = build_model(size="tiny", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, seed=0)
    if train_steps:
        heads = [c["text"][:80] for c in candidates if c["role"] == "member"]
        batch = tok(heads, padding=True, return_tensors="pt")
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for _ in range(train_steps):
                loss = model(**batch, labels=labels).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
    model.eval().save_pretrained(rundir.model("m").weights)
    return rundir, model, tok, canaries


@pytest.fixture(scope="module")
def clinical_candidates():
    from dpaudit.data.clinical import generate_clinical_notes

    ds = generate_clinical_notes(num_patients=12, seed=0)
    patients = sorted(set(ds["unit_id"]))
    members = set(patients[::2])
    return [{"text": t, "unit_id": u, "role": "member" if u in members else "heldout",
             "group": "a" if patients.index(u) % 3 == 0 else "b"}  # groups of people (issue 29)
            for t, u in zip(ds["text"], ds["unit_id"])]


def naive_note(model, tok, text):
    """(mean per-token log-prob of the MRN, greedy reproduces it): one note, unbatched,
    one forward pass per MRN token."""
    m = re.search(r"MRN:? (\d{8})", text)
    prefix, target = text[: m.start(1) - 1], text[m.start(1) - 1 : m.end(1)]
    p = tok(prefix, add_special_tokens=False)["input_ids"]
    full = tok(prefix + target, add_special_tokens=False)["input_ids"]
    assert full[: len(p)] == p
    t = full[len(p):]
    lps, ids, gen = [], list(p), list(p)
    with torch.no_grad():
        for tk in t:
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            lps.append(float(torch.log_softmax(logits, -1)[tk]))
            ids.append(tk)
            gen.append(int(model(torch.tensor([gen])).logits[0, -1].argmax()))
    return float(np.mean(lps)), gen[len(p):] == t


def test_patient_secrets_agree_with_a_naive_loop(tmp_path, clinical_candidates):
    rundir, model, tok, canaries = make_run(tmp_path / "run", clinical_candidates, train_steps=60)
    md = rundir.model("m")
    result = extract_model(rundir, CONFIG, md)
    assert json.loads(md.extraction_path.read_text()) == result

    # the canary fields, as before
    from dpaudit.extraction import greedy_extracted

    hit = greedy_extracted(model, tok, prefixes=[c.prefix for c in canaries], targets=[c.secret for c in canaries],
                           device="cpu")
    inc = np.array([c.included for c in canaries])
    assert result["method"].startswith("greedy decoding from the canary prefix")
    assert result["included_extracted"] == int(hit[inc].sum()) and result["included_total"] == int(inc.sum())
    assert result["excluded_extracted"] == int(hit[~inc].sum()) and result["excluded_total"] == int((~inc).sum())
    assert result["new_token_canaries"] == {c.id: {"extracted": bool(h)} for c, h in zip(canaries, hit)}

    # PII fields and k-extractable records against the library calls, note by note
    from dpaudit.extraction import k_extractable, pii_notes

    for field in ("mrn", "phone"):
        notes = pii_notes(clinical_candidates, field)
        for role, key in (("member", "members"), ("heldout", "heldout")):
            mine = [n for n in notes if n["role"] == role
                    and len(tok(n["prefix"] + n["target"], add_special_tokens=False)["input_ids"]) <= 128]
            hits = greedy_extracted(model, tok, prefixes=[n["prefix"] for n in mine],
                                    targets=[n["target"] for n in mine], device="cpu") if mine else []
            assert result["pii"][key][field] == {"num": len(mine), "extracted": int(np.sum(hits)),
                                                 "fraction": float(np.mean(hits)) if mine else None}
    for role, key in (("member", "members"), ("heldout", "heldout")):
        texts = [c["text"] for c in clinical_candidates if c["role"] == role]
        hit = k_extractable(model, tok, texts=texts, k=8, suffix_length=4, device="cpu")
        assert result["k_extractable"][key] == {"num": len(texts), "extracted": int(hit.sum()),
                                                "fraction": float(hit.mean())}
    assert result["pii"]["members"]["mrn"]["extracted"] > result["pii"]["heldout"]["mrn"]["extracted"]

    # patient secrets: schema
    ps = result["patient_secrets"]
    assert ps["field"] == "mrn" and isinstance(ps["method"], str) and ps["method"]
    assert ps["max_notes_per_group"] == MAX_NOTES_PER_GROUP
    assert [g["notes"] for g in ps["groups"]] == sorted(g["notes"] for g in ps["groups"])
    for g in ps["groups"]:
        assert list(g) == GROUP_KEYS

    # ... and values: one note at a time, grouped by the patient (unit_id) by hand
    per_patient = defaultdict(list)
    for c in clinical_candidates:
        per_patient[(c["role"], c["unit_id"])].append(naive_note(model, tok, c["text"]))
    expected = defaultdict(lambda: {"member": [], "heldout": []})
    for (role, _), scores in per_patient.items():
        expected[len(scores)][role].append(scores)
    assert [g["notes"] for g in ps["groups"]] == sorted(expected)
    for g in ps["groups"]:
        for role in ("member", "heldout"):
            pats = expected[g["notes"]][role]
            assert g[f"{role}_patients"] == len(pats)
            if not pats:
                assert g[f"{role}_mean_logprob"] is None and g[f"{role}_extracted"] is None
                continue
            assert g[f"{role}_mean_logprob"] == pytest.approx(np.mean([np.mean([s[0] for s in p]) for p in pats]),
                                                              abs=1e-4)
            assert g[f"{role}_extracted"] == pytest.approx(np.mean([s[1] for p in pats for s in p]))
    # ... and per group of people (issue 29): the same notes, split by their patient's group
    group_of = {c["unit_id"]: c["group"] for c in clinical_candidates}
    assert [r["group"] for r in ps["by_group"]] == ["a", "b"]
    for row in ps["by_group"]:
        for role in ("member", "heldout"):
            pats = [v for (r, u), v in per_patient.items() if r == role and group_of[u] == row["group"]]
            assert row[f"{role}_patients"] == len(pats)
            assert row[f"{role}_notes"] == sum(len(p) for p in pats)
            assert row[f"{role}_extracted_notes"] == sum(s[1] for p in pats for s in p)
            assert row[f"{role}_mean_logprob"] == pytest.approx(np.mean([np.mean([s[0] for s in p]) for p in pats]),
                                                                abs=1e-4)
    # the model was trained on the members' headers: their MRNs are likelier than held-out ones
    lp = lambda role: np.mean([g[f"{role}_mean_logprob"] for g in ps["groups"] if g[f"{role}_patients"]])
    assert lp("member") > lp("heldout")

    # in place: not recomputed
    md.extraction_path.write_text(json.dumps({**result, "marker": 1}))
    assert extract_model(rundir, CONFIG, md)["marker"] == 1


def test_corpus_without_mrns_has_no_patient_secrets(tmp_path):
    cands = [{"text": f"note {i} about the weather today, it is {i} degrees", "unit_id": f"u{i // 2}",
              "role": "member" if i % 4 < 2 else "heldout"} for i in range(8)]
    rundir, *_ = make_run(tmp_path / "run", cands)
    result = extract_model(rundir, CONFIG, rundir.model("m"))
    assert result["patient_secrets"] is None
    assert result["included_total"] + result["excluded_total"] == 4


def test_mrn_notes_and_grouping():
    def note(role, unit, mrn, sep=": "):
        return {"text": f"Name: X\nMRN{sep}{mrn}\nrest", "unit_id": unit, "role": role}

    cands = ([note("member", "a", "00000001")] * 2 + [note("member", "b", "00000002", " ")] * 3
             + [note("heldout", "c", "00000003")] * 2 + [note("heldout", "d", "00000001")]  # d shares a's MRN
             + [{"text": "no number here", "unit_id": "e", "role": "heldout"}])
    notes = mrn_notes(cands)
    assert len(notes) == 7  # d's note (an MRN the model saw) and the note without one are out
    assert notes[0] == {"role": "member", "patient": "00000001", "prefix": "Name: X\nMRN:", "target": " 00000001"}
    assert notes[2]["prefix"].endswith("MRN") and notes[2]["target"] == " 00000002"
    groups = patient_groups(notes)
    assert sorted(groups) == [2, 3]
    assert [p for p, _ in groups[2]["member"]] == ["00000001"] and groups[2]["member"][0][1] == [0, 1]
    assert [p for p, _ in groups[2]["heldout"]] == ["00000003"] and groups[3]["heldout"] == []
    assert mrn_notes([c for c in cands if c["role"] == "member"]) is None  # no held-out baseline
    assert mrn_notes([{"text": "plain", "unit_id": "u", "role": "member"}]) is None


def test_grouping_caps_whole_patients_with_a_seeded_sample():
    notes = [{"role": "member", "patient": f"{p:08d}", "prefix": "MRN", "target": " 1"}
             for p in range(40) for _ in range(3)]
    full = patient_groups(notes)[3]["member"]
    assert len(full) == 40
    capped = patient_groups(notes, max_notes=31)[3]["member"]
    assert len(capped) == 10  # 10 whole patients of 3 notes fit in 31
    assert all(len(ix) == 3 for _, ix in capped)
    assert capped == patient_groups(notes, max_notes=31)[3]["member"]  # seeded
    assert capped != patient_groups(notes, max_notes=31, seed=1)[3]["member"]
    assert {p for p, _ in capped} <= {p for p, _ in full}


def test_canaries_without_prefix_are_extracted_from_their_first_token():
    """``new_token_bare`` canaries have no prefix; greedy extraction starts from their first
    token (a byte-level BPE adds no BOS to prompt with). Prefixed canaries keep their own."""
    from dpaudit.canaries import add_canary_tokens, make_canaries
    from dpaudit.data.tokenizer import train_tokenizer
    from dpaudit.extraction import greedy_extracted
    from dpaudit.models import build_model
    from dpaudit.extraction.canaries import _split_canary

    tok = train_tokenizer(["Canary record: some text", "Audit code: other text"] * 20, vocab_size=300)
    add_canary_tokens(tok, "new_token_bare")
    add_canary_tokens(tok, "new_token")
    bare = make_canaries(spec="new_token_bare", num_canaries=3, seed=0)
    prefixed = make_canaries(spec="new_token", num_canaries=2, seed=0)
    split = [_split_canary(c, tok) for c in bare + prefixed]
    for c, (prefix, target) in zip(bare, split):
        ids = tok(c.text, add_special_tokens=False)["input_ids"]
        assert prefix + target == c.text and tok(prefix, add_special_tokens=False)["input_ids"] == ids[:1]
    assert split[3:] == [(c.prefix, c.secret) for c in prefixed]
    model = build_model(size="tiny", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, seed=0)
    out = greedy_extracted(model, tok, prefixes=[p for p, _ in split], targets=[t for _, t in split],
                           batch_size=4, device="cpu")
    assert out.shape == (5,) and not out.any()  # an untrained model extracts nothing
