"""The blind baseline of ``audit-model`` (Das et al. 2024): a model-free classifier flags a
shifted member / non-member split and a split of different lengths, and stays at chance on
an exchangeable split (members and non-members drawn at random from one corpus)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpaudit.blind import MARGIN, blind_baseline
from dpaudit.errors import InputError


@pytest.fixture(scope="module")
def notes():
    from dpaudit.data.clinical import generate_clinical_notes

    return [t[:500] for t in generate_clinical_notes(num_patients=40, seed=0)["text"]]


@pytest.fixture(scope="module")
def other_text():
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(0)
    return [fake.paragraph(nb_sentences=8) for _ in range(60)]


def test_shifted_split_is_flagged(notes, other_text):
    got = blind_baseline(members=notes[:60], nonmembers=other_text)
    assert got["shifted"] and got["auc"] > 0.95 and got["auc_ci"][0] > 0.5 + MARGIN
    assert set(got) >= {"auc", "auc_ci", "length_auc", "length_auc_ci", "shifted", "length_differs"}


def test_exchangeable_splits_stay_at_chance(notes):
    flagged = []
    for seed in range(2):
        order = np.random.default_rng(seed).permutation(len(notes))
        half = len(order) // 2
        got = blind_baseline(members=[notes[i] for i in order[:half]], nonmembers=[notes[i] for i in order[half:]],
                             seed=seed)
        assert 0.3 < got["auc"] < 0.7
        flagged.append(got["shifted"] or got["length_differs"])
    assert not any(flagged)


def test_lengths_alone_are_flagged(notes):
    order = np.random.default_rng(0).permutation(len(notes))
    half = len(order) // 2
    short = [notes[i][: len(notes[i]) // 3] for i in order[:half]]
    got = blind_baseline(members=short, nonmembers=[notes[i] for i in order[half:]])
    assert got["length_differs"] and got["length_auc"] < 0.5 - MARGIN
    assert got["mean_length"]["members"] < got["mean_length"]["nonmembers"]


def test_too_few_texts():
    with pytest.raises(InputError, match="at least 5"):
        blind_baseline(members=["a b"] * 4, nonmembers=["c d"] * 10)


@pytest.mark.slow  # notebooks/audit_released_model.ipynb covers the same path in the default suite
def test_audit_model_reports_the_blind_baseline(tmp_path, notes, other_text, capsys):
    """A shifted split in ``audit-model``: the JSON carries ``blind_baseline``, each attack's
    lift over it, and the report's first lines say the AUCs are no evidence of memorization."""
    import torch

    from dpaudit.cli import main
    from dpaudit.data.tokenizer import train_tokenizer
    from dpaudit.models import build_model

    torch.set_num_threads(1)
    tok = train_tokenizer(notes, vocab_size=300)
    model = build_model(size="tiny", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, seed=0)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    members, nonmembers = tmp_path / "members.jsonl", tmp_path / "nonmembers.jsonl"
    members.write_text("".join(json.dumps({"text": t[:300]}) + "\n" for t in notes[:40]))
    nonmembers.write_text("".join(json.dumps({"text": t[:300]}) + "\n" for t in other_text[:40]))
    code = main(["audit-model", str(tmp_path / "model"), "--members", str(members), "--nonmembers", str(nonmembers),
                 "--out", str(tmp_path / "out"), "--attacks", "loss,zlib", "--max-length", "64", "--json"])
    assert code in (0, 3)
    report = json.loads(capsys.readouterr().out)
    blind = report["blind_baseline"]
    assert blind["shifted"] and blind["auc"] > 0.9
    for name in ("loss", "zlib"):
        auc = next(m for m in report["models"])["attacks"][name]["auc"]
        assert blind["lift"][name] == pytest.approx(auc - max(0.5, blind["auc"]))
    html = (tmp_path / "out" / "report.html").read_text()
    summary = html[html.index('<section id="summary">'):]
    assert summary.index("not evidence of memorization on this split") < summary.index("</section>")
    assert "No ε is ever derived from a natural member / non-member split" in html
