"""The attack stage's canary bounds: sound only where their assumptions hold."""

import numpy as np

from dpaudit.audit import BonferroniStrategy, CanaryScores
from dpaudit.stages.attack import split_metrics


def null_trial(rng, *, m, inclusion_prob):
    """Scores independent of membership (true epsilon 0); canaries in with ``inclusion_prob``."""
    labels = rng.random(m) < inclusion_prob
    return rng.normal(size=m), labels


def test_one_run_bounds_are_refused_unless_inclusion_is_one_half():
    """At inclusion 0.9, guessing "in" is right 90% of the time on null scores, so the
    one-run analysis (which assumes 1/2) certifies epsilon > 0 far more often than the 5%
    significance allows: the stage must not compute it."""
    rng = np.random.default_rng(0)
    trials, positive = 40, 0
    for _ in range(trials):
        scores, labels = null_trial(rng, m=1000, inclusion_prob=0.9)
        cs = CanaryScores(in_scores=scores[labels], out_scores=scores[~labels])
        one_sided = BonferroniStrategy(grid=((1.0, 0.0),))  # every canary guessed "in"
        positive += cs.bound("one_run", delta=1e-5, significance=0.05, strategy=one_sided).epsilon > 0
        metrics = split_metrics(scores, labels, bounds_delta=1e-5, seed=0, inclusion_prob=0.9)
        assert set(metrics["epsilon_lower_bounds"]) == {"gdp"} and "1/2" in metrics["one_run_refused"]
    assert positive / trials > 0.5  # the hole the refusal closes


def test_null_scores_at_one_half_violate_within_the_significance():
    rng = np.random.default_rng(1)
    trials = 60
    above = sum(
        split_metrics(*null_trial(rng, m=1000, inclusion_prob=0.5), bounds_delta=1e-5, seed=0)
        ["epsilon_lower_bounds"]["one_run"]["epsilon"] > 0
        for _ in range(trials)
    )
    assert above / trials <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / trials)


def test_start_model_is_the_reference_without_a_fleet(tmp_path):
    """The weights every model starts from: the run's base/, else the user's base model when
    its embedding covers the tokenizer (then no model grows rows of its own), else none."""
    from types import SimpleNamespace

    from dpaudit.models import build_model
    from dpaudit.rundir import RunDir
    from dpaudit.stages.attack import start_model

    def config(base):
        return SimpleNamespace(model=SimpleNamespace(base_model=base, trust_remote_code=False))

    tokenizer = list(range(120))  # only its length counts
    user = tmp_path / "user"
    build_model(size="tiny", vocab_size=120, bos_token_id=0, eos_token_id=0, seed=0).save_pretrained(user)
    small = tmp_path / "small"
    build_model(size="tiny", vocab_size=100, bos_token_id=0, eos_token_id=0, seed=0).save_pretrained(small)
    run = RunDir(tmp_path / "run")
    assert start_model(run, config(None), tokenizer) is None
    assert start_model(run, config(str(user)), tokenizer) == str(user)
    assert start_model(run, config(str(small)), tokenizer) is None  # each model grows rows of its own
    build_model(size="tiny", vocab_size=120, bos_token_id=0, eos_token_id=0, seed=0).save_pretrained(run.base_dir)
    assert start_model(run, config(None), tokenizer) == run.base_dir
