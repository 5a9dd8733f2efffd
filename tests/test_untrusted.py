"""Untrusted artifacts: a model's own code does not run without --trust-remote-code, no
pickle anywhere, torch.load only with weights_only=True, YAML only through safe_load. (HTML
escaping of member and canary texts, with a script tag in them, is tested in
tests/report/test_report.py; the pickle-only checkpoint that is refused, in
tests/test_bad_inputs.py.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from dpaudit.cli import main

PACKAGE = Path(__file__).parents[1] / "dpaudit"

EVIL = '''
from pathlib import Path
Path(__file__).with_name("RAN").write_text("the model's own code ran")
from transformers import GPT2Config


class EvilConfig(GPT2Config):
    model_type = "evil"
'''


def test_model_code_does_not_run_without_trust_remote_code(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = tmp_path / "model"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=64)).save_pretrained(model)
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="evil", auto_map={"AutoConfig": "evil.EvilConfig"})
    (model / "config.json").write_text(json.dumps(config))
    (model / "evil.py").write_text(EVIL)
    texts = tmp_path / "texts.txt"
    texts.write_text("one note\nanother note\n")
    code = main(["audit-model", str(model), "--members", str(texts), "--nonmembers", str(texts),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "--trust-remote-code" in err
    assert not (model / "RAN").exists()


def test_report_escapes_what_strangers_wrote(tmp_path, capsys):
    """A model directory named like an HTML tag, member texts with a script tag: the report
    (built with --include-texts) escapes the one it shows and prints no raw tag."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from dpaudit.data.tokenizer import train_tokenizer

    tag = "<img src=x onerror=alert(1)>"
    model = tmp_path / tag
    tokenizer = train_tokenizer([f"word{i} note {i * 7}" for i in range(200)], vocab_size=280)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer),
                               n_positions=64)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    members, nonmembers = tmp_path / "members.jsonl", tmp_path / "nonmembers.txt"
    members.write_text("".join(json.dumps({"text": f"<script>alert({i})</script> note {i}"}) + "\n" for i in range(20)))
    nonmembers.write_text("".join(f"<b>other</b> note {i}\n" for i in range(20)))
    out = tmp_path / "out"
    code = main(["audit-model", str(model), "--members", str(members), "--nonmembers", str(nonmembers),
                 "--attacks", "loss", "--include-texts", "--out", str(out)])
    assert code in (0, 3), capsys.readouterr().err
    html = (out / "report.html").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # the model's name, shown escaped
    assert tag not in html and "<script>alert" not in html and "<b>other" not in html


def unsafe_uses(path: Path) -> list[str]:
    """What in one source file loads pickle, runs a model's code by default, or reads YAML unsafely."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"imports {n}" for n in names if n and n.split(".")[0] in ("pickle", "cPickle", "dill", "joblib")]
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            kwargs = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg}
            if func == "torch.load" and kwargs.get("weights_only") != "True":
                found.append("torch.load without weights_only=True")
            if func in ("np.load", "numpy.load") and kwargs.get("allow_pickle") != "False":
                found.append("np.load without allow_pickle=False")
            if func in ("yaml.load", "yaml.unsafe_load", "yaml.full_load"):
                found.append(func)
            if kwargs.get("trust_remote_code") == "True":
                found.append(f"{func}(trust_remote_code=True)")
            if kwargs.get("safe_serialization") == "False":
                found.append("a pickle checkpoint (safe_serialization=False)")
        elif isinstance(node, ast.arguments):  # a default of True for trust_remote_code
            args = node.posonlyargs + node.args + node.kwonlyargs
            defaults = [None] * (len(node.posonlyargs + node.args) - len(node.defaults)) + node.defaults + node.kw_defaults
            found += ["trust_remote_code defaults to True" for a, d in zip(args, defaults)
                      if a.arg == "trust_remote_code" and isinstance(d, ast.Constant) and d.value is True]
    return found


def test_no_pickle_no_unsafe_loaders_in_the_package():
    bad = {str(p.relative_to(PACKAGE)): found for p in sorted(PACKAGE.rglob("*.py")) if (found := unsafe_uses(p))}
    assert not bad, bad


def test_the_scan_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "bad.py"
    sample.write_text("import pickle\nimport torch, yaml, numpy as np\ntorch.load('x')\nyaml.load(s)\n"
                      "np.load(f)\ndef f(*, trust_remote_code=True): pass\n")
    assert len(unsafe_uses(sample)) == 5
