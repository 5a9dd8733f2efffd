"""The wheel carries every subpackage, the presets, the canary sets, the report template and
the clinical corpus vocabulary."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"dpaudit"} | {
        "dpaudit." + p.parent.name for p in (ROOT / "dpaudit").glob("*/__init__.py")
    } | {"dpaudit.canary_sets"}
    assert listed == found


def test_package_data_is_found():
    from importlib import resources

    assert resources.files("dpaudit.presets").joinpath("demo.yaml").is_file()
    assert resources.files("dpaudit.canary_sets").joinpath("new_token.yaml").is_file()
    templates = resources.files("dpaudit.report").joinpath("templates")
    assert templates.joinpath("base.html").is_file() and templates.joinpath("sections/ladder.html").is_file()
    vocab = resources.files("dpaudit.data").joinpath("clinical_vocab")
    for name in ("diagnoses.yaml", "patients.yaml", "phrasing.yaml"):
        assert vocab.joinpath(name).is_file(), name
