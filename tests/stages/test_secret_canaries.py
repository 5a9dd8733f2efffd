"""Secret canaries (``canaries.secrets``): generated per repetition count with a seeded half
inserted, planted in the training rows as often as they say, kept out of every attack and
bound, and measured by the extract stage (``dpaudit extract``), exactly on a small space."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpaudit.cli import main
from dpaudit.config import load_config
from dpaudit.errors import InputError
from dpaudit.rundir import RunDir
from dpaudit.stages.artifacts import read_secrets
from dpaudit.stages.attack import attack_texts
from dpaudit.stages.prepare import (
    derive_seeds,
    load_prepared,
    make_secret_canaries,
    prepare,
)

SPACE_YAML = """name: code3
kind: random_secret
templates: ["Patient code {secret}", "Locker {secret}"]
secret: {pattern: "###"}
"""


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config_for(tmp_path, *extra):
    spec = tmp_path / "code3.yaml"
    spec.write_text(SPACE_YAML)
    return load_config("tiny", overrides=["data.num_patients=16", "canaries.num=6", "pretrain.enabled=false",
                                          "data.public_fraction=0", f"canaries.secrets.set={spec}",
                                          "canaries.secrets.num=2", "canaries.secrets.repetitions=[1, 2, 4]",
                                          "canaries.secrets.enumerate_limit=1000", "extract.samples=4",
                                          "extract.k=8", "extract.suffix_length=4", "extract.max_records=10", *extra])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secrets")
    config = config_for(tmp)
    rundir = RunDir(tmp / "run")
    rundir.root.mkdir()
    rundir.write_config(config)
    seeds = derive_seeds(config.seed)
    prepare(rundir, config, seeds)
    return rundir, config, load_prepared(rundir, config, seeds)


def test_groups_of_repetitions_half_inserted(prepared):
    rundir, config, data = prepared
    secrets = data.secrets
    assert [c.repetitions for c in secrets] == [1, 1, 2, 2, 4, 4]
    for r in (1, 2, 4):
        assert sum(c.included for c in secrets if c.repetitions == r) == 1  # one inserted, one control
    assert len({c.secret for c in secrets}) == 6 and all(len(c.secret) == 3 for c in secrets)
    assert not {c.id for c in secrets} & {c.id for c in data.canaries}
    # reproducible from the seed alone
    again, _ = make_secret_canaries(config, seed=derive_seeds(config.seed)["canaries"], main_set="new_token")
    assert again == secrets
    assert read_secrets(rundir)[1]["name"] == "code3"


def test_inserted_as_often_as_they_say_and_never_attacked(prepared):
    _, config, data = prepared
    rows = data.train_set["canary_id"]
    for c in data.secrets:
        assert rows.count(c.id) == (c.repetitions if c.included else 0)
    texts, record_labels, canary_labels = attack_texts(data)
    # the attack stage scores the records and the new-token canaries only: no secret canary
    # reaches a membership split, so none reaches the one-run bound of the per-note claim
    assert len(canary_labels) == config.canaries.num == len(data.canaries)
    assert len(texts) == len(record_labels) + len(canary_labels)
    assert not {c.text for c in data.secrets} & set(texts)


def test_bad_secret_sets_are_input_errors(tmp_path):
    seed = derive_seeds(0)["canaries"]
    with pytest.raises(InputError, match="random_secret or pii"):
        make_secret_canaries(config_for(tmp_path, "canaries.secrets.set=new_token"), seed=seed, main_set="x")
    with pytest.raises(InputError, match="names the set of canaries.set"):
        make_secret_canaries(config_for(tmp_path), seed=seed, main_set="code3")
    with pytest.raises(InputError, match="repetitions"):
        config_for(tmp_path, "canaries.secrets.repetitions=[]")
    with pytest.raises(InputError, match="sample_size"):
        config_for(tmp_path, "canaries.secrets.sample_size=2")
    assert make_secret_canaries(config_for(tmp_path, "canaries.secrets.num=0"), seed=seed, main_set="x") == ([], None)


def test_dpaudit_extract_measures_exposure_exactly(prepared, capsys):
    from dpaudit.extraction import (
        continuation_scores,
        exposure,
        greedy_extracted,
        secret_space,
    )
    from dpaudit.models import build_model

    rundir, config, data = prepared
    tok = data.tokenizer
    model = build_model(size="tiny", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, seed=1)
    model.save_pretrained(rundir.model("nonprivate").weights)
    assert main(["extract", str(rundir.root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = out["models"]["nonprivate"]
    assert got == {k: v for k, v in rundir.model("nonprivate").read_extraction().items() if k in got}
    assert got["space_bits"] == pytest.approx(math.log2(1000)) and got["exposure_method"] == "exact"
    assert got["secrets_left_out"]["num"] == 0  # every secret fits data.max_length
    rows = got["canaries"]
    assert [r["id"] for r in rows] == [c.id for c in data.secrets]
    assert [r["repetitions"] for r in rows] == [c.repetitions if c.included else 0 for c in data.secrets]
    # exact exposure: every candidate scored naively with the prefix, the secret ranked among them
    space = secret_space("###")
    for c, row in zip(data.secrets, rows):
        prefix = c.prefix.rstrip()
        lp = continuation_scores(model, tok, prefixes=[prefix] * len(space), targets=[" " + s for s in space],
                                 device="cpu").sum_logprob()
        i = space.index(c.secret)
        want = exposure(canary_logprob=lp[i], candidate_logprobs=np.delete(lp, i), secret_space_size=1000)
        assert row["exposure"] == pytest.approx(want, abs=1e-6)
        assert row["extracted"] == bool(greedy_extracted(model, tok, prefixes=[prefix], targets=[" " + c.secret],
                                                         device="cpu")[0])
        assert 0 <= row["sampled_hits"] <= row["samples"] == 4
    groups = {g["repetitions"]: g for g in got["by_repetitions"]}
    assert set(groups) == {0, 1, 2, 4} and groups[0]["num"] == 3
    assert groups[0]["mean_exposure"] == pytest.approx(np.mean([r["exposure"] for r in rows if not r["included"]]))
    # the PII baseline and k-extractable records
    assert set(got["pii"]["members"]) <= {"mrn", "phone"} and "mrn" in got["pii"]["members"]
    k = got["k_extractable"]
    assert k["k"] == 8 and k["members"]["num"] <= 10 and k["heldout"]["num"] <= 10

    # beyond the limit the skew-normal estimate; a second run without --force keeps the file
    from dpaudit.extraction import secret_canaries

    config.canaries.secrets.enumerate_limit = 10
    config.canaries.secrets.sample_size = 200
    est = secret_canaries(model, tok, data.secrets, read_secrets(rundir)[1], config=config)
    assert est["exposure_method"] == "skewnorm"
    assert all(r["rank"] is None and 0 <= r["exposure"] <= math.log2(1000) for r in est["canaries"])
    assert main(["extract", str(rundir.root)]) == 0 and "secret canaries x1" in capsys.readouterr().out


def test_prepare_refuses_secret_canaries_that_training_always_truncates(tmp_path):
    # pii canaries put their MRN at the end of a long record: at data.max_length=64 every one
    # is cut in training, so none could measure memorization
    config = config_for(tmp_path, "canaries.secrets.set=pii", "data.max_length=64")
    rundir = RunDir(tmp_path / "run")
    rundir.root.mkdir()
    rundir.write_config(config)
    with pytest.raises(InputError, match=r"data.max_length=64 tokens \(prefix \+ secret: \d+ to \d+ tokens"):
        prepare(rundir, config, derive_seeds(config.seed))
    assert not rundir.data_complete()


def test_secret_canaries_cut_in_training_are_left_out(prepared):
    import dataclasses

    from dpaudit.extraction import secret_canaries
    from dpaudit.models import build_model
    from dpaudit.report.extraction import extraction_summary

    rundir, config, data = prepared
    tok = data.tokenizer
    model = build_model(size="tiny", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, seed=1)
    lengths = [len(tok(c.text)["input_ids"]) for c in data.secrets]  # as training tokenizes them
    limit = max(lengths) - 1
    assert min(lengths) <= limit  # some canaries fit, some do not
    cfg = dataclasses.replace(config, data=dataclasses.replace(config.data, max_length=limit))
    # the left-out canaries are exactly those whose text training truncates at data.max_length
    cut = [c.id for c in data.secrets if tok(c.text, truncation=True, max_length=limit)["input_ids"]
           != tok(c.text)["input_ids"]]
    assert cut
    with pytest.warns(UserWarning, match=rf"{len(cut)} of 6 left out .*data.max_length={limit}"):
        got = secret_canaries(model, tok, data.secrets, read_secrets(rundir)[1], config=cfg)
    assert [r["id"] for r in got["canaries"]] == [c.id for c in data.secrets if c.id not in cut]
    assert got["secrets_left_out"]["num"] == len(cut) and got["secrets_left_out"]["ids"] == cut
    assert "cut the secret away" in got["secrets_left_out"]["reason"]
    assert sum(g["num"] for g in got["by_repetitions"]) == 6 - len(cut)
    # the report's entry says how many its table leaves out, and of what length
    summary, _, _ = extraction_summary("m", got, False, warn=pytest.fail)
    assert summary["secrets"]["left_out"] == len(cut) and summary["secrets"]["left_out_max_tokens"] == limit
    # every one cut: nothing scored, the count still says why
    cfg = dataclasses.replace(config, data=dataclasses.replace(config.data, max_length=min(lengths) - 1))
    with pytest.warns(UserWarning, match="6 of 6 left out"):
        none = secret_canaries(model, tok, data.secrets, read_secrets(rundir)[1], config=cfg)
    assert none["canaries"] == [] and none["by_repetitions"] == [] and none["secrets_left_out"]["num"] == 6
