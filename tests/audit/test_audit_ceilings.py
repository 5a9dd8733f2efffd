"""The ceilings table: reproducible, consistent with the bounds, and in sync with the docs."""

from pathlib import Path

import pytest

from dpaudit.audit import ceiling_table, epsilon_one_run, format_ceiling_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "ceilings.md"


@pytest.fixture(scope="module")
def rows():
    return ceiling_table(ms=(100, 1000, 10_000), delta=1e-5, significance=0.05)


def test_ceilings_grow_with_m_and_default_strategy_costs_a_little(rows):
    for a, b in zip(rows, rows[1:]):
        for field in ("one_run", "one_run_fdp", "clopper_pearson", "gdp"):
            assert getattr(a, field) < getattr(b, field)
    for r in rows:
        assert r.one_run_default < r.one_run < r.one_run_fdp
        assert r.one_run_fdp_default < r.one_run_fdp
        assert r.clopper_pearson_default < r.clopper_pearson
        assert r.gdp_default < r.gdp


def test_ceiling_matches_known_value(rows):
    # All m guesses right is the best case; the 3.47 check is r = 100 at m = 1000.
    assert rows[1].one_run_best_guesses == 1000
    assert rows[1].one_run >= epsilon_one_run(num_canaries=1000, num_guesses=100, num_correct=100, delta=1e-5)
    assert rows[0].one_run == pytest.approx(3.49, abs=0.01)


def test_docs_table_is_generated_by_this_code(rows):
    assert format_ceiling_table(rows) in DOC.read_text()


def test_default_ceiling_is_what_canary_scores_reports_on_separated_scores(rows):
    import numpy as np

    from dpaudit.audit import CanaryScores

    m = 100
    one_run = CanaryScores(in_scores=np.arange(m // 2) + 10.0, out_scores=-np.arange(m // 2) - 1.0)
    multi = CanaryScores(in_scores=np.arange(m) + 10.0, out_scores=-np.arange(m) - 1.0)
    assert one_run.epsilon_one_run(delta=1e-5).epsilon == pytest.approx(rows[0].one_run_default)
    assert one_run.epsilon_one_run_fdp(delta=1e-5).epsilon == pytest.approx(rows[0].one_run_fdp_default)
    assert multi.epsilon_clopper_pearson(delta=1e-5).epsilon == pytest.approx(rows[0].clopper_pearson_default)
    assert multi.epsilon_gdp(delta=1e-5).epsilon == pytest.approx(rows[0].gdp_default)
