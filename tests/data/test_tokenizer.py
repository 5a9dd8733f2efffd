"""Byte-level BPE training, padding without vocabulary growth, save/reload."""

import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from dpaudit.data.clinical import generate_clinical_notes
from dpaudit.data.tokenizer import ENDOFTEXT, load_tokenizer, prepare_tokenizer, train_tokenizer
from dpaudit.errors import InputError


@pytest.fixture(scope="module")
def texts():
    return generate_clinical_notes(num_patients=60, seed=2)["text"][:]


@pytest.fixture(scope="module")
def tok(texts):
    return train_tokenizer(texts, vocab_size=800, seed=0)


def test_trained_tokenizer_shape(tok, texts):
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) == 800
    assert tok.eos_token == tok.bos_token == tok.unk_token == tok.pad_token == ENDOFTEXT
    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids(ENDOFTEXT)
    assert tok.padding_side == "right"
    # byte level: any text round-trips, including characters never seen in training
    for s in (texts[0], "Zoë – 温度 38.5 °C 🙂"):
        assert tok.decode(tok(s)["input_ids"]) == s
    # BPE learned real merges: far fewer tokens than bytes
    assert len(tok(texts[0])["input_ids"]) < 0.5 * len(texts[0].encode())


def test_padding_does_not_grow_vocab(tok, texts):
    n = len(tok)
    batch = tok(texts[:4], padding=True, return_tensors="pt")
    assert len(tok) == n
    mask = batch["attention_mask"]
    assert mask.shape[0] == 4 and mask[:, 0].all()  # right padding
    lengths = mask.sum(1)
    assert lengths.min() < mask.shape[1]
    row = int(lengths.argmin())
    assert (batch["input_ids"][row, int(lengths[row]):] == tok.pad_token_id).all()


def test_deterministic_training(tok, texts):
    again = train_tokenizer(texts, vocab_size=800)
    assert again.get_vocab() == tok.get_vocab()


def test_save_and_reload_identical(tok, texts, tmp_path):
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(texts[:20])["input_ids"] == tok(texts[:20])["input_ids"]
    assert len(reloaded) == len(tok) and reloaded.pad_token == tok.pad_token
    via_helper = load_tokenizer(tmp_path)
    assert via_helper(texts[:5])["input_ids"] == tok(texts[:5])["input_ids"]
    assert via_helper.padding_side == "right"


def test_prepare_base_model_tokenizer_without_pad(tok, tmp_path):
    """A base model's tokenizer that ships without a pad token (GPT-2 style)."""
    tok.save_pretrained(tmp_path)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("pad_token", None)
    cfg["padding_side"] = "left"
    cfg_path.write_text(json.dumps(cfg))
    raw = AutoTokenizer.from_pretrained(tmp_path)
    assert raw.pad_token is None
    n = len(raw)
    ready = prepare_tokenizer(raw)
    assert ready is raw and len(ready) == n
    assert ready.pad_token == ready.eos_token and ready.padding_side == "right"


def test_bad_input(texts, tmp_path):
    with pytest.raises(InputError, match="vocab_size"):
        train_tokenizer(texts, vocab_size=100)
    with pytest.raises(InputError, match="empty"):
        train_tokenizer(["", ""], vocab_size=300)
    with pytest.raises(InputError, match="not found"):
        load_tokenizer(tmp_path / "no-such-dir")
    with pytest.raises(TypeError):
        train_tokenizer(texts, 300)  # keyword-only


def test_prepare_without_any_special_token(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("pad_token", "eos_token", "bos_token", "unk_token"):
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg))
    raw = AutoTokenizer.from_pretrained(tmp_path)
    n = len(raw)
    ready = prepare_tokenizer(raw)
    assert len(ready) == n and ready.pad_token_id == 0
